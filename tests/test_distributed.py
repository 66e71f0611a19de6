"""A store's layers pipelined over ranks with mlx.distributed (ring backend on localhost).

The slow tests start real ranks (one process each, its own drives) and check greedy tokens equal the
single-process streamed model, for two families and 2 and 3 ranks; and that a rank that dies or stops
ends the run with an error naming it, with nothing written. The quick ones check the split, the stage's
share of the store and the hosts file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import psutil
import pytest

from nightshift.app.cli import main
from nightshift.engine.distributed.experts import ExpertShare, owner
from nightshift.engine.distributed.hosts import PipelineError, load_hosts
from nightshift.engine.distributed.launch import Timeouts, free_port, generate_over_hosts
from nightshift.engine.distributed.placement import (
    PIPELINE_FILE,
    balanced_split,
)
from nightshift.engine.distributed.stage import PipelineStage, RankOf, family_split, layer_ranges
from nightshift.engine.io.drives import Drive
from nightshift.engine.store.importer import ImportOptions, import_checkpoint
from nightshift.engine.store.manifest import read_manifest, write_manifest
from nightshift.engine.store.synth import synthesize
from tests.helpers.hosts import LAYERS, PROMPT, TOKENS, hosts_file, place_by_hosts, single_process
from tests.helpers.shared import built_once

PIPELINED = ("qwen3_moe", "kimi_k3")


def pipelined_stores(root: Path) -> None:
    """`root`/<family>: a tiny store of each PIPELINED family, on two drives."""
    for arch in PIPELINED:
        src = synthesize(arch, "tiny", root / f"{arch}-src", seed=1, layers=LAYERS)
        drives = [Drive(f"d{i}", root / f"{arch}-import{i}") for i in range(2)]
        import_checkpoint(src, root / arch, drives, ImportOptions(trunk_bits=16))


@pytest.fixture(scope="session")
def pipeline_stores(tmp_path_factory) -> dict[str, Path]:
    """`pipelined_stores`, built once per session: tests read them, and place copies (`copy_store`)."""
    root = built_once(tmp_path_factory, "pipelined", pipelined_stores)
    return {arch: root / arch for arch in PIPELINED}


def copy_store(src: Path, dst: Path) -> Path:
    """A copy of the store at `src` with its own drives: placing it moves none of the original's files."""
    shutil.copytree(src, dst)
    manifest = read_manifest(dst)
    for name, root in manifest.drives.items():
        copy = dst.parent / f"{dst.name}-{name}"
        shutil.copytree(root, copy)
        manifest.drives[name] = str(copy)
    write_manifest(dst, manifest)
    return dst


# Quick: the split, the stage, the hosts file.


def test_balanced_split_gives_the_faster_host_more_bytes():
    layer_bytes = [0, 10, 10, 10, 10, 10, 10, 10, 10]  # a dense first layer, then 8 equal MoE layers
    assert balanced_split(layer_bytes, [1.0, 1.0]) == [4, 5]  # rank 0 runs the last 4, rank 1 the dense + 4
    assert balanced_split(layer_bytes, [3.0, 1.0]) == [6, 3]  # rank 0 reads 3x faster: 6 of the 8 MoE layers
    assert balanced_split(layer_bytes, [1.0, 3.0]) == [2, 7]
    assert layer_ranges([6, 3]) == [(3, 9), (0, 3)]


def test_balanced_split_gives_every_host_an_moe_layer():
    assert balanced_split([0, 0, 0, 5, 5], [1.0, 100.0]) == [1, 4]
    with pytest.raises(PipelineError, match="2 MoE layers cannot give each of 3 hosts one"):
        balanced_split([0, 5, 5], [1.0, 1.0, 1.0])


def test_kimi_k3_keeps_its_own_split_and_mixin_families_take_any(pipeline_stores):
    kimi = read_manifest(pipeline_stores["kimi_k3"]).config
    assert family_split(kimi, 3) == [1, 1, 2]  # kimi_k3's pipeline gives the first ranks' extra layer to the last rank
    assert family_split(read_manifest(pipeline_stores["qwen3_moe"]).config, 3) is None


def test_a_stage_keeps_its_layers_trunk_and_experts_only(pipeline_stores):
    manifest = read_manifest(pipeline_stores["qwen3_moe"])
    stage = PipelineStage(RankOf(1, 2), (3, 1))  # rank 1 of 2 runs layer 0 only
    assert stage.layers == (0, 1)
    assert stage.keeps("model.layers.0.self_attn.q_proj.weight") and stage.keeps("model.embed_tokens.weight")
    assert not stage.keeps("model.layers.1.self_attn.q_proj.weight") and stage.keeps("lm_head.weight")
    mine = stage.manifest(manifest)
    assert [layer.layer for layer in mine.layers] == [0] and set(mine.experts) == {0}
    assert mine.expert_bytes < manifest.expert_bytes


def test_an_expert_share_keeps_every_layer_and_its_own_experts_replicas_only(pipeline_stores):
    manifest = read_manifest(pipeline_stores["qwen3_moe"])
    share = ExpertShare(RankOf(1, 3))
    assert share.keeps("model.layers.2.self_attn.q_proj.weight") and share.keeps("lm_head.weight")
    mine = share.manifest(manifest)
    assert [layer.layer for layer in mine.layers] == [layer.layer for layer in manifest.layers]
    for layer, experts in mine.experts.items():
        assert len(experts) == len(manifest.experts[layer])  # expert numbers stay the manifest's
        assert all(bool(e["replicas"]) == (owner(i, 3) == 1) for i, e in enumerate(experts))
    assert set(mine.drives) == {r for per in mine.experts.values() for e in per for r in e["replicas"]}


def place_by_expert(store: Path, hosts_json: Path) -> None:
    """`model place --hosts --experts`: the launch then runs expert parallelism (kept in pipeline.json)."""
    assert main(["model", "place", str(store), "--hosts", str(hosts_json), "--experts", "--no-measure"]) == 0
    assert json.loads((store / PIPELINE_FILE).read_text())["shape"] == "experts"


def test_placement_by_expert_puts_each_expert_on_its_owners_drives(pipeline_stores, tmp_path):
    store = copy_store(pipeline_stores["kimi_k3"], tmp_path / "k")
    place_by_expert(store, hosts_file(tmp_path, store, 2))
    placed = read_manifest(store)
    for layer, experts in placed.experts.items():
        for i, e in enumerate(experts):
            assert e["replicas"] and all(r.startswith(f"h{owner(i, 2)}") for r in e["replicas"]), (layer, i)


def test_placement_by_host_puts_each_layer_on_its_hosts_drives(pipeline_stores, tmp_path):
    store = copy_store(
        pipeline_stores["qwen3_moe"], tmp_path / "q"
    )  # its own drives: placing moves none of the module's
    manifest = read_manifest(store)
    for layer in manifest.layers:
        assert all(
            Path(p).is_file() for e in range(layer.num_experts) for _, p in manifest.replica_paths(layer.layer, e)
        )
    hosts_json = hosts_file(tmp_path, store, 2, mbps=[300.0, 100.0])
    place_by_hosts(store, hosts_json)
    kept = json.loads((store / PIPELINE_FILE).read_text())
    assert kept["split"] == [3, 1] and "measured read rate" in kept["how"]  # 3x faster rank 0: 3 of 4 MoE layers
    placed = read_manifest(store)
    for (start, end), host in zip(layer_ranges(kept["split"]), ("h0", "h1"), strict=True):
        for layer in range(start, end):
            assert all(r.startswith(host) for e in placed.experts[layer] for r in e["replicas"])


def test_hosts_file_is_checked(tmp_path):
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps({"hosts": [{"ssh": "a", "ips": ["10.0.0.1"], "drives": {"x": "/x"}}]}))
    with pytest.raises(PipelineError, match="at least two hosts"):
        load_hosts(path)
    path.write_text(json.dumps([{"ssh": "a", "ips": ["10.0.0.1"], "drives": {"x": "/x"}}, {"ssh": "b", "drives": {}}]))
    with pytest.raises(PipelineError, match="host 1 needs"):
        load_hosts(path)
    two = [{"ssh": h, "ips": ["10.0.0.1"], "drives": {"x": f"/{h}"}} for h in ("a", "b")]
    path.write_text(json.dumps(two))
    with pytest.raises(PipelineError, match="same drive"):
        load_hosts(path)


# Slow: real ranks on localhost, each with its own drives.


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "ranks"), [("qwen3_moe", 2), ("qwen3_moe", 3), ("kimi_k3", 2), ("kimi_k3", 3)])
def test_pipelined_greedy_tokens_equal_one_process(pipeline_stores, tmp_path, arch, ranks):
    store = copy_store(pipeline_stores[arch], tmp_path / arch)
    expected = single_process(store)
    place_by_hosts(store, hosts_file(tmp_path, store, ranks))
    result = generate_over_hosts(store, load_hosts(tmp_path / "hosts.json"), PROMPT, TOKENS, port=free_port(ranks))
    assert result.tokens == expected
    for rank, figures in enumerate(result.ranks):  # each rank read its own drives, and only those
        read = {d for d, b in figures["drive_bytes"].items() if b}
        assert read and all(d.startswith(f"h{rank}") for d in read)


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "ranks"), [("qwen3_moe", 2), ("qwen3_moe", 3), ("kimi_k3", 2)])
def test_expert_parallel_greedy_tokens_equal_one_process(pipeline_stores, tmp_path, arch, ranks):
    store = copy_store(pipeline_stores[arch], tmp_path / arch)
    expected = single_process(store)
    place_by_expert(store, hosts_file(tmp_path, store, ranks))
    hosts = load_hosts(tmp_path / "hosts.json")
    result = generate_over_hosts(store, hosts, PROMPT, TOKENS, port=free_port(ranks))  # the shape placed
    assert result.tokens == expected
    for rank, figures in enumerate(result.ranks):  # each rank read its own drives (its share of every layer)
        read = {d for d, b in figures["drive_bytes"].items() if b}
        assert read and all(d.startswith(f"h{rank}") for d in read)


@pytest.mark.slow
def test_cluster_command_writes_its_answer_only_when_done(pipeline_stores, tmp_path):
    store = copy_store(pipeline_stores["qwen3_moe"], tmp_path / "q")
    hosts_json = hosts_file(tmp_path, store, 2)
    place_by_hosts(store, hosts_json)
    out = tmp_path / "answer.json"
    args = ["--hosts", str(hosts_json), "--model", str(store), "--max-tokens", "4"]
    assert main(["cluster", "generate", "hello", *args, "--out", str(out), "--port", str(free_port(2))]) == 0
    assert len(json.loads(out.read_text())["tokens"]) == 4


def running_children() -> set[int]:
    """Pids of this process's descendants still running (zombies left out)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def worker_process(rank: int) -> psutil.Process:
    for child in psutil.Process().children(recursive=True):
        try:
            if "distributed.worker" in " ".join(child.cmdline()) and child.environ().get("MLX_RANK") == str(rank):
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"no worker of rank {rank}")


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "why"), [(signal.SIGKILL, "exited with code"), (signal.SIGSTOP, "stopped answering")])
def test_a_rank_that_stops_stops_the_run_naming_its_host(pipeline_stores, tmp_path, sig, why):
    store = copy_store(pipeline_stores["qwen3_moe"], tmp_path / "q")
    place_by_hosts(store, hosts_file(tmp_path, store, 3))
    hosts = load_hosts(tmp_path / "hosts.json")
    seen, victim = [], []
    before = running_children()  # the session's own (the README's first command runs beside the tests)

    def on_token(token: int) -> None:
        seen.append(token)
        if len(seen) == 2:
            victim.append(worker_process(1))
            os.kill(victim[0].pid, sig)

    with pytest.raises(PipelineError, match=rf"host 127\.0\.0\.1 \(rank 1\) {why}.*nothing was written"):
        generate_over_hosts(
            store, hosts, PROMPT, 200, port=free_port(3), timeouts=Timeouts(stall_s=5), on_token=on_token
        )
    assert len(seen) < 200
    assert running_children() <= before  # every process of the run is gone
    # The rank's own worker is gone too, stopped or not (its shell's end leaves it to init, not to this process).
    assert not (victim[0].is_running() and victim[0].status() != "zombie")
