"""A store spread over several local hosts (engine/distributed), and the tokens one process gives for it."""

from __future__ import annotations

import json
from pathlib import Path

from nightshift.engine.distributed.hosts import load_hosts
from nightshift.engine.distributed.placement import plan_hosts, planner_by_host, write_plan
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import open_model
from nightshift.engine.store.manifest import read_manifest
from nightshift.engine.store.upkeep import place_store

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9]


TOKENS = 10


LAYERS = 4  # the first dense where the family has one: 3 ranks still get an MoE layer each


def hosts_file(path: Path, store: Path, ranks: int, drives_each: int = 2, mbps: list[float] | None = None) -> Path:
    """hosts.json for `ranks` local hosts, each with its own drives (directories under the test's folder)."""
    hosts = []
    for rank in range(ranks):
        drives = {f"h{rank}d{i}": str(path / f"{store.name}-h{rank}d{i}") for i in range(drives_each)}
        hosts.append({"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "drives": drives})
        if mbps:
            hosts[-1]["read_mbps"] = mbps[rank]
    path.mkdir(parents=True, exist_ok=True)
    (path / "hosts.json").write_text(json.dumps({"hosts": hosts}))
    return path / "hosts.json"


def place_by_hosts(store: Path, hosts_json: Path) -> None:
    hosts = load_hosts(hosts_json)
    plan = plan_hosts(read_manifest(store), hosts)
    place_store(store, [d for h in hosts for d in h.drives], planner=planner_by_host(plan, hosts))
    write_plan(store, plan, hosts)


def single_process(store: Path) -> list[int]:
    model = open_model(store, stream=StreamSettings(cache_bytes=0))
    try:
        return [c.token for c in model.generate_tokens(PROMPT, max_tokens=TOKENS)]
    finally:
        model.close()
