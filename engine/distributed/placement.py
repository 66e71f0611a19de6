"""Placement by host: which layers each host runs, and each layer's experts on that host's own drives.

The split is contiguous (a pipeline passes activations from one range of layers to the next) and
balances each host's expert bytes against its drives' measured read rate: the split minimises the
largest bytes/rate over hosts, the time the slowest host spends reading its share. Families whose
pipeline in mlx-lm cuts layers only its own way (kimi_k3) keep that cut, and the placement says so.
The split is kept in the store's `pipeline.json`; launching reads it from there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nightshift.engine.distributed.hosts import Host, PipelineError, read_rate
from nightshift.engine.store.manifest import Manifest, write_json_atomic
from nightshift.engine.store.placement import DriveRoom, Key, plan_placement

PIPELINE_FILE = "pipeline.json"


@dataclass(frozen=True)
class HostPlan:
    """The store's split over hosts: layers per rank (mlx-lm's order) and how it was chosen."""

    split: list[int]
    rates: list[float | None]  # bytes/s per host as weighed (None: not measured, weighed as the others' mean)
    how: str

    def ranges(self) -> list[tuple[int, int]]:
        from nightshift.engine.distributed.stage import layer_ranges

        return layer_ranges(self.split)


def balanced_split(layer_bytes: list[int], rates: list[float]) -> list[int]:
    """Layers per rank (rank 0 runs the last layers) minimising the largest bytes/rate; each rank gets at least
    one layer with experts (a layer's bytes: its experts', 0 for a dense layer)."""
    ranks, count = len(rates), len(layer_bytes)
    moe = [b > 0 for b in layer_bytes]
    if sum(moe) < ranks:
        raise PipelineError(f"{sum(moe)} MoE layers cannot give each of {ranks} hosts one; use fewer hosts")
    prefix = [0]
    for b in layer_bytes:
        prefix.append(prefix[-1] + b)
    moe_prefix = [0]
    for m in moe:
        moe_prefix.append(moe_prefix[-1] + m)
    # cost[s][i]: best largest time when the first i layers go to the first s segments (segment s runs on
    # rank ranks-1-s: the first layers go to the highest rank).
    inf = float("inf")
    cost = [[inf] * (count + 1) for _ in range(ranks + 1)]
    cut = [[0] * (count + 1) for _ in range(ranks + 1)]
    cost[0][0] = 0.0
    for s in range(1, ranks + 1):
        rate = rates[ranks - s]
        for i in range(1, count + 1):
            for j in range(i):
                if moe_prefix[i] - moe_prefix[j] == 0 or cost[s - 1][j] == inf:
                    continue
                worst = max(cost[s - 1][j], (prefix[i] - prefix[j]) / rate)
                if worst < cost[s][i]:
                    cost[s][i], cut[s][i] = worst, j
    sizes, i = [], count
    for s in range(ranks, 0, -1):
        j = cut[s][i]
        sizes.append(i - j)  # segment s, appended from the last: rank ranks - s
        i = j
    return sizes  # sizes[r] = layers of rank r (the last segment first)


def plan_hosts(manifest: Manifest, hosts: list[Host]) -> HostPlan:
    """The split of `manifest`'s layers over `hosts`, weighed by each host's measured read rate."""
    from nightshift.engine.distributed.stage import family_split

    layers = int(manifest.config.get("num_hidden_layers") or manifest.config["text_config"]["num_hidden_layers"])
    by_layer = {layer.layer: layer.file_bytes * layer.num_experts for layer in manifest.layers}
    layer_bytes = [by_layer.get(i, 0) for i in range(layers)]
    measured = [read_rate(h) for h in hosts]
    known = [r for r in measured if r]
    fixed = family_split(manifest.config, len(hosts))
    if fixed is not None:
        how = "the family's own split (its pipeline in mlx-lm takes no other)"
        split = fixed
    else:
        mean = sum(known) / len(known) if known else 1.0
        split = balanced_split(layer_bytes, [r or mean for r in measured])
        how = (
            "expert bytes balanced against each host's measured read rate"
            if len(known) == len(hosts)
            else "expert bytes balanced; hosts without a measured read rate weighed as the mean of the others"
            if known
            else "expert bytes balanced (no host's read rate measured: `nightshift drives probe` on each host)"
        )
    plan = HostPlan(split, measured, how)
    for rank, (start, end) in enumerate(plan.ranges()):
        if not any(start <= layer.layer < end for layer in manifest.layers):
            raise PipelineError(
                f"{hosts[rank].label} would run layers {start}-{end - 1}, which have no routed experts; use fewer hosts"
            )
    return plan


def planner_by_host(plan: HostPlan, hosts: list[Host]):
    """A planner for `place_store`: each layer's experts planned over the drives of the host that runs it only."""
    ranges = plan.ranges()
    return planner_over(hosts, lambda key: next(r for r, (start, end) in enumerate(ranges) if start <= key[0] < end))


def planner_by_expert(hosts: list[Host]):
    """A planner for `place_store` for expert parallelism: each expert planned over the drives of the host that
    owns it (`experts.owner`), every layer on every host."""
    from nightshift.engine.distributed.experts import owner

    return planner_over(hosts, lambda key: owner(key[1], len(hosts)))


def planner_over(hosts: list[Host], rank_of: Callable[[Key], int]):
    """A planner for `place_store` that plans each host's experts (`rank_of` a (layer, expert)) over its drives."""

    def planner(
        sizes: dict[Key, int], drives: list[DriveRoom], frequency: dict[Key, float], replicate: bool
    ) -> dict[Key, list[str]]:
        placed: dict[Key, list[str]] = {}
        for host in hosts:
            names = {d.name for d in host.drives}
            own = {k: v for k, v in sizes.items() if rank_of(k) == host.rank}
            placed.update(plan_placement(own, [d for d in drives if d.name in names], frequency, replicate))
        return placed

    return planner


def write_plan(store: Path, plan: HostPlan, hosts: list[Host]) -> None:
    """Keep the split with the store (temp + rename): launching over these hosts uses it."""
    write_json_atomic(
        Path(store) / PIPELINE_FILE,
        {
            "split": plan.split,
            "how": plan.how,
            "hosts": [
                {"ssh": h.ssh, "layers": list(r), "drives": [d.name for d in h.drives], "read_bytes_per_s": rate}
                for h, r, rate in zip(hosts, plan.ranges(), plan.rates, strict=True)
            ],
        },
    )


def write_expert_plan(store: Path, hosts: list[Host]) -> None:
    """Keep with the store that its experts were placed for expert parallelism over these hosts: launching over
    them then runs that shape (every host every layer, its share of the experts)."""
    write_json_atomic(
        Path(store) / PIPELINE_FILE,
        {
            "shape": "experts",
            "how": f"expert e on host e % {len(hosts)} in every layer",
            "hosts": [{"ssh": h.ssh, "drives": [d.name for d in h.drives]} for h in hosts],
        },
    )


def stored_plan(store: Path, hosts: list[Host]) -> dict | None:
    """What `model place --hosts` kept for these hosts (same count and drives), or None."""
    path = Path(store) / PIPELINE_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    kept = [sorted(h["drives"]) for h in data["hosts"]]
    return data if kept == [sorted(d.name for d in h.drives) for h in hosts] else None


def stored_split(store: Path, hosts: list[Host]) -> list[int] | None:
    """The split `model place --hosts` kept for these hosts, or None (none kept, or placed by expert)."""
    plan = stored_plan(store, hosts)
    return list(plan["split"]) if plan is not None and "split" in plan else None


def stored_shape(store: Path, hosts: list[Host]) -> str:
    """How the store was placed over these hosts: "experts" (expert parallelism) or "pipeline" (the default)."""
    plan = stored_plan(store, hosts)
    return plan.get("shape", "pipeline") if plan is not None else "pipeline"
