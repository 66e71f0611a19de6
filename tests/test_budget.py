"""The expert memory budget: `auto` sized from free RAM, resident layers read once, RAM given back under
pressure, and the simulator's replay of a recorded trace equal to what the engine's cache did."""

from __future__ import annotations

import json
import threading
from functools import partial
from pathlib import Path

import numpy as np
import psutil
import pytest

from nightshift.engine.bench.cache_sim import Call, belady, replay, static_oracle
from nightshift.engine.errors import NightshiftError
from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.io.arenas import map_expert_tensors
from nightshift.engine.moe import budget as budget_module
from nightshift.engine.moe.budget import (
    CONTEXT_TOKENS,
    KV_STEP,
    LIMIT_FLOOR,
    LIMIT_MARGIN_MIN,
    Budget,
    Memory,
    Pressure,
    cgroup_memory,
    kv_cache_bytes,
    margin_for,
    memory_now,
    size_budget,
    step_copy_bytes,
    trunk_bytes,
    working_set_bytes,
)
from nightshift.engine.moe.held import held_expert_bytes, held_sizes
from nightshift.engine.moe.load import cap_buffer_cache, load_streaming
from nightshift.engine.moe.reader import RECYCLE_BYTES
from nightshift.engine.moe.settings import AUTO_BUDGET, CACHE_POLICIES, FREQUENCY, StreamSettings, parse_budget
from nightshift.engine.moe.warm import PROFILE_FILE, RoutingProfile, load_profile, profile_path, save_profile
from nightshift.engine.runtime import open_model
from nightshift.engine.store.manifest import read_manifest
from tests.helpers.stores import PROMPT


@pytest.mark.parametrize(
    "text, expected",
    [("auto", AUTO_BUDGET), ("AUTO", AUTO_BUDGET), ("0", 0), ("12G", 12 << 30), ("500M", 500 << 20),
     ("1.5G", int(1.5 * (1 << 30))), ("64MiB", 64 << 20), ("4096", 4096)],
)  # fmt: skip
def test_budgets_are_written_as_auto_zero_or_a_size(text, expected):
    assert parse_budget(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1G", "12Q", "1e9"])
def test_other_budgets_are_refused_with_the_forms_that_work(text):
    with pytest.raises(NightshiftError, match="auto, 0"):
        parse_budget(text)


def test_auto_leaves_room_for_the_model_and_the_system_and_never_exceeds_the_experts(stores):
    store = stores["qwen3_moe"]
    manifest = read_manifest(store)
    budget = size_budget(AUTO_BUDGET, manifest, store, reader_threads=12)
    assert budget.auto and budget.bytes == held_expert_bytes(manifest)  # a tiny store fits on any machine
    assert budget.reserved > 0 and budget.margin == margin_for(memory_now())
    given = size_budget(1000, manifest, store, reader_threads=12)
    assert not given.auto and given.bytes == 1000


def write_group(group: Path, limit: str, usage: int, inactive: int, stat_key: str, files: tuple[str, str]) -> None:
    group.mkdir(parents=True, exist_ok=True)
    (group / files[0]).write_text(limit + "\n")
    (group / files[1]).write_text(f"{usage}\n")
    (group / "memory.stat").write_text(f"cache 0\n{stat_key} {inactive}\n")


V1_FILES, V2_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes"), ("memory.max", "memory.current")
MB = 1_000_000


def test_a_cgroup_v1_limit_above_the_process_group_binds_and_counts_its_inactive_page_cache(tmp_path):
    """A container runtime limits the container's group; the process may sit in an unlimited group below it."""
    proc = tmp_path / "cgroup"
    proc.write_text("9:pids:/\n4:memory:/docker/abc/job\n0::/\n")
    unlimited = str(9223372036854771712)  # v1's "no limit", page-rounded 2^63
    write_group(tmp_path / "memory", unlimited, 9000 * MB, 0, "total_inactive_file", V1_FILES)
    write_group(tmp_path / "memory/docker/abc", str(600 * MB), 400 * MB, 50 * MB, "total_inactive_file", V1_FILES)
    write_group(tmp_path / "memory/docker/abc/job", unlimited, 380 * MB, 40 * MB, "total_inactive_file", V1_FILES)
    assert cgroup_memory(tmp_path, proc) == Memory(250 * MB, 600 * MB, True)
    assert memory_now(tmp_path, proc) == Memory(min(250 * MB, psutil.virtual_memory().available), 600 * MB, True)


def test_a_cgroup_v2_takes_the_tightest_group_and_max_is_no_limit(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/svc/job\n")
    write_group(tmp_path / "svc", str(2000 * MB), 900 * MB, 100 * MB, "inactive_file", V2_FILES)  # 1200 MB free
    write_group(tmp_path / "svc/job", str(1000 * MB), 500 * MB, 0, "inactive_file", V2_FILES)  # 500 MB free
    assert cgroup_memory(tmp_path, proc) == Memory(500 * MB, 1000 * MB, True)
    write_group(tmp_path / "svc/job", "max", 500 * MB, 0, "inactive_file", V2_FILES)
    assert cgroup_memory(tmp_path, proc) == Memory(1200 * MB, 2000 * MB, True)
    write_group(tmp_path / "svc", "max", 900 * MB, 0, "inactive_file", V2_FILES)
    assert cgroup_memory(tmp_path, proc) is None
    machine = psutil.virtual_memory()
    assert memory_now(tmp_path, proc).total == machine.total and not memory_now(tmp_path, proc).limited
    assert cgroup_memory(tmp_path, tmp_path / "no-such-file") is None  # not Linux: no /proc/self/cgroup


def test_inside_a_limit_pressure_keeps_only_a_floor_free_once_the_process_has_grown_into_its_margin(tmp_path):
    """At open the margin is left for the process's growth; once grown, the cache gives back only what would leave
    less than `LIMIT_FLOOR` free. Outside a limit the margin stays free (the machine's other processes)."""
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n")
    memory = partial(memory_now, tmp_path, proc)
    sized = Budget(100 * MB, True, 200 * MB, margin=LIMIT_MARGIN_MIN, limited=True)
    for free, expected in ((60 * MB, 100 * MB), (20 * MB, 80 * MB + 20 * MB - LIMIT_FLOOR), (0, 80 * MB - LIMIT_FLOOR)):
        write_group(tmp_path / "job", str(500 * MB), 500 * MB - free, 0, "inactive_file", V2_FILES)
        assert Pressure(sized, memory).budget_now(used=80 * MB, layer=0, rows=1) == expected
    machine = Budget(100 * MB, True, 200 * MB, margin=LIMIT_MARGIN_MIN)
    write_group(tmp_path / "job", str(500 * MB), 500 * MB - 60 * MB, 0, "inactive_file", V2_FILES)
    assert Pressure(machine, memory).budget_now(80 * MB, layer=0, rows=1) == 80 * MB + 60 * MB - LIMIT_MARGIN_MIN


def test_inside_a_limit_the_budget_grows_to_fill_it_once_a_pass_has_run_and_never_past_what_the_model_needs(
    tmp_path, monkeypatch
):
    """Sized at open for a 16-row prompt, the budget grows at the next pass (the prompt pass is done) to leave free
    only the floor and what the model does not hold of its reserve (its working set that of a 16-row pass); it never
    passes every expert; the model's ups and downs do not shrink it, the floor does; a wider pass brings it back to
    its size at open at once, until that pass is done. Outside a limit it never grows."""
    monkeypatch.setattr(budget_module, "CHECK_EVERY_S", 0)  # every call a check: the interval is not under test
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n")
    memory = partial(memory_now, tmp_path, proc)

    def free(nbytes: int) -> None:
        write_group(tmp_path / "job", str(500 * MB), 500 * MB - nbytes, 0, "inactive_file", V2_FILES)

    sets = {16: 12 * MB, 64: 40 * MB}  # a pass's working set by its rows (a decode step's: 1 MB)
    held = [90 * MB]  # what the model holds besides the cache, as MLX counts it
    sized = Budget(40 * MB, True, 300 * MB, reserved=100 * MB, margin=LIMIT_MARGIN_MIN, limited=True,
                   working_set=sets[16])  # fmt: skip
    pressure = Pressure(sized, memory, lambda: held[0], lambda rows: sets.get(rows, MB))
    free(150 * MB)
    assert [pressure.budget_now(40 * MB, layer, rows=16) for layer in (3, 7)] == [40 * MB] * 2  # the prompt pass
    still = 100 * MB - held[0]  # its reserve (with a 16-row pass's working set) less what it holds
    grown = 40 * MB + 150 * MB - LIMIT_FLOOR - still
    assert pressure.budget_now(40 * MB, layer=3, rows=1) == grown  # the first decode step: grown into the limit
    free(150 * MB - (grown - 40 * MB))  # the cache took it: the floor and the model's transient left free
    assert pressure.budget_now(grown, layer=7, rows=1) == grown
    held[0] = 85 * MB  # MLX handed 5 MB of freed buffers back: the model may take them again, no more room
    free(150 * MB - (grown - 40 * MB) + 5 * MB)
    assert pressure.budget_now(grown, layer=3, rows=1) == grown
    held[0] = 90 * MB  # the process freed 5 MB of its other memory: room for more
    assert pressure.budget_now(grown, layer=7, rows=1) == grown + 5 * MB
    held[0] = 95 * MB  # the model took 5 MB more: the cap stays, the floor is what binds
    free(LIMIT_FLOOR - MB)
    assert pressure.budget_now(grown + 5 * MB, layer=3, rows=1) == grown + 5 * MB - MB
    free(150 * MB)
    assert pressure.budget_now(grown, layer=3, rows=64) == 40 * MB  # a wider pass: the grown part back at once
    assert pressure.budget_now(40 * MB, layer=7, rows=64) == 40 * MB  # while it runs, no growth
    held[0] = 70 * MB
    free(400 * MB)
    assert pressure.budget_now(40 * MB, layer=3, rows=1) == 300 * MB  # done: every expert, and no more
    outside = Budget(40 * MB, True, 300 * MB, reserved=100 * MB, margin=LIMIT_MARGIN_MIN, working_set=sets[16])
    machine = Pressure(outside, memory, lambda: held[0], lambda rows: MB)
    calls = [(3, 16), (7, 16), (3, 1), (7, 1), (3, 1)]
    assert [machine.budget_now(40 * MB, layer, rows) for layer, rows in calls] == [40 * MB] * 5


def test_a_one_token_prompt_is_a_pass_done_once_the_next_pass_begins(tmp_path, monkeypatch):
    """Passes are told apart by their layers: a prompt of one row and decode steps of one row still grow the
    budget at the second pass, not within the first."""
    monkeypatch.setattr(budget_module, "CHECK_EVERY_S", 0)
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n")
    write_group(tmp_path / "job", str(500 * MB), 350 * MB, 0, "inactive_file", V2_FILES)
    sized = Budget(40 * MB, True, 300 * MB, reserved=100 * MB, margin=LIMIT_MARGIN_MIN, limited=True,
                   working_set=MB)  # fmt: skip
    pressure = Pressure(sized, partial(memory_now, tmp_path, proc), lambda: 100 * MB, lambda rows: MB)
    calls = [(0, 1), (1, 1), (0, 1)]
    grown = 40 * MB + 150 * MB - LIMIT_FLOOR
    assert [pressure.budget_now(40 * MB, layer, rows) for layer, rows in calls] == [40 * MB, 40 * MB, grown]


def test_inside_a_limit_auto_keeps_a_small_margin_and_the_kv_cache_of_the_run_it_is_told(stores):
    """The margin is a share of the limit, not the 1 GiB a machine's other processes need; the KV reserve follows
    the run's context (in mlx-lm's 256-token steps) and the trunk's float width; the cache takes what is left."""
    store = stores["qwen3_moe"]
    manifest = read_manifest(store)
    _, width = trunk_bytes(store / manifest.trunk["file"])
    limit = Memory(600 * MB, 700 * MB, True)
    short = size_budget(AUTO_BUDGET, manifest, store, 6, context_tokens=100, memory=limit)
    bound = size_budget(AUTO_BUDGET, manifest, store, 6, memory=limit)  # context not known: the 8192-token bound
    assert short.limited and short.margin == LIMIT_MARGIN_MIN < 1 << 30
    kv = kv_cache_bytes(manifest.config, 1, width)  # one step of 256 tokens
    assert kv == kv_cache_bytes(manifest.config, KV_STEP, width) < kv_cache_bytes(manifest.config, KV_STEP + 1, width)
    assert bound.reserved - short.reserved == kv_cache_bytes(manifest.config, CONTEXT_TOKENS, width) - kv + (
        working_set_bytes(manifest) - working_set_bytes(manifest, 100)
    )
    tight = Memory(short.reserved + short.margin + manifest.expert_bytes // 3, 700 * MB, True)
    assert size_budget(AUTO_BUDGET, manifest, store, 6, 100, tight).bytes == manifest.expert_bytes // 3
    machine = Memory(600 * MB, 24 << 30, False)  # the same memory free on a machine: its other processes' margin
    assert size_budget(AUTO_BUDGET, manifest, store, 6, 100, machine).bytes == 0


def test_an_output_projection_narrower_than_the_activations_is_reserved_as_its_wider_copy(tmp_path):
    """A bf16 head beside float32 norms: the activations are float32, the head multiplies a float32 copy, held by the
    model where the head is the tied embedding (engine/store/head.py), made by every step where it is its own."""
    import mlx.core as mx

    trunk = tmp_path / "trunk.safetensors"
    tensors = {"model.embed_tokens.weight": mx.zeros((1000, 64), mx.bfloat16), "model.norm.weight": mx.ones(64)}
    mx.save_safetensors(str(trunk), tensors)
    assert trunk_bytes(trunk) == (trunk.stat().st_size + 1000 * 64 * 4, 4)
    assert step_copy_bytes(trunk) == 0  # tied: held, not made per step
    mx.save_safetensors(str(trunk), {**tensors, "lm_head.weight": mx.zeros((1000, 64), mx.bfloat16)})
    assert trunk_bytes(trunk) == (trunk.stat().st_size + 1000 * 64 * 4, 4)  # its own head's copy, not the embedding's
    assert step_copy_bytes(trunk) == 1000 * 64 * 4
    mx.save_safetensors(str(trunk), {**tensors, "model.norm.weight": mx.ones(64, mx.bfloat16)})
    assert trunk_bytes(trunk) == (trunk.stat().st_size, 2)  # all bf16: bf16 activations, no copy
    assert step_copy_bytes(trunk) == 0


def test_the_buffer_cache_holds_the_working_set_and_a_step_copy_beside_it():
    """An untied head's wider copy is made and freed every step: MLX's buffer cache holds it beside the working set
    (or the lower limit the process set), or each step maps and faults it anew (27 700 page faults a token on
    moe128-mixtral's 113 MB float32 copy of its tied bf16 head, before the model held that one)."""
    import mlx.core as mx

    previous = mx.set_cache_limit(32 * MB)
    try:
        cap_buffer_cache(10 * MB, 113 * MB)
        assert mx.set_cache_limit(4 * MB) == 123 * MB
        cap_buffer_cache(10 * MB, 113 * MB)
        assert mx.set_cache_limit(previous) == 117 * MB
    finally:
        mx.set_cache_limit(previous)


def test_the_model_held_in_ram_caps_the_buffer_cache_to_hold_its_heads_wider_copy(stores, tmp_path):
    """In RAM a step makes and frees an untied head's float32 copy as streamed: at MLX's 32 MB CPU default the in-RAM
    moe128-mixtral faulted its 113 MB in every token (27 650 page faults a token, when its tied head's copy was made
    per step too). The open caps MLX's buffer cache as the streamed open does, bounded (here below the GPU default's
    memory limit) and above the copy. (A tied head's copy is held: tests/test_wide_head.py.)"""
    import shutil

    import mlx.core as mx

    store = tmp_path / "bf16-head"
    shutil.copytree(stores["qwen3_moe"], store)  # its experts stay on the drives the manifest names
    manifest = read_manifest(store)
    trunk = store / manifest.trunk["file"]
    tensors = mx.load(str(trunk))
    heads = [name for name in tensors if name.endswith(("lm_head.weight", "embed_tokens.weight"))]
    mx.save_safetensors(str(trunk), {**tensors, **{name: tensors[name].astype(mx.bfloat16) for name in heads}})
    assert step_copy_bytes(trunk) > 0  # float32 norms beside it: float32 activations, a float32 copy of the head
    default = mx.set_cache_limit(1 << 40)  # as MLX's default on a GPU: its memory limit
    try:
        open_model(store)
        assert mx.set_cache_limit(default) == working_set_bytes(manifest) + step_copy_bytes(trunk)
    finally:
        mx.set_cache_limit(default)


def test_a_store_that_fits_is_read_once_then_resident_with_the_tokens_of_the_model_in_ram(stores, in_ram):
    store = stores["qwen3_moe"]
    model = open_model(store, stream=StreamSettings())
    try:
        first = list(model.generate_tokens(PROMPT, max_tokens=12))
        after_first = model.stream.figures()
        second = list(model.generate_tokens(PROMPT, max_tokens=12))
        after_second = model.stream.figures()
    finally:
        model.close()
    assert [c.token for c in first] == [c.token for c in second] == in_ram["qwen3_moe"]
    assert after_first.resident_layers == len(read_manifest(store).layers)
    reads = sum(d.reads for d in after_second.drives.values())
    assert reads == after_second.distinct_experts_read  # no expert read twice
    assert after_second.bytes_read == after_first.bytes_read  # the second answer read nothing
    assert sum(second[-1].stats.drive_bytes.values()) == 0 and second[-1].stats.cache_hit_rate == 1.0
    assert after_second.cache_hits > after_first.cache_hits  # resident calls are counted as hits


def test_per_token_figures_leave_the_pass_in_flight_to_a_later_count(stores):
    """mlx-lm builds the next token's pass before it yields a token: per-token figures must not wait for it."""
    import mlx.core as mx

    store = stores["qwen3_moe"]
    model = open_model(store, stream=StreamSettings())
    stream = model.stream
    try:
        chunks = list(model.generate_tokens(PROMPT, max_tokens=12))
        layers = len(read_manifest(store).layers)
        assert len(stream.residency.stacks) == layers  # every layer resident: its calls are counted when asked for
        stats = chunks[-1].stats
        # the pass mlx-lm queued beyond the last token is nobody's: left out of the generation's figures
        assert 0 < stats.cache_hits < stream.figures().cache_hits
        before = stream.figures().calls.calls
        pending = model.model(mx.array([[1, 2]]))  # one pass, not evaluated
        assert stream.figures(settled=True).calls.calls == before
        assert stream.figures().calls.calls == before + layers
        mx.eval(pending)
    finally:
        model.close()


def test_the_cache_gives_ram_back_when_the_machine_runs_short(stores):
    """A margin larger than what is available stands for another process taking the RAM: the cache shrinks. The
    margin is the machine's whole RAM, so what other processes free or take meanwhile (the other test worker's)
    cannot hide the shortfall: every byte the cache holds must go."""
    store = stores["qwen3_moe"]
    model, _, stream = load_streaming(store, StreamSettings())
    try:
        from bench.helpers.reference import greedy_tokens

        tokens = greedy_tokens(model, 8)
        held = stream.residency.cache.used
        assert held > 0 and stream.residency.stacks
        short = psutil.virtual_memory().total  # more than is ever available, by far more than the cache holds
        stream.residency.pressure = Pressure(
            Budget(stream.budget.bytes, True, stream.budget.expert_bytes, margin=short)
        )
        assert greedy_tokens(model, 8) == tokens  # still the same answer, reading again what it gave back
        figures = stream.figures()
    finally:
        stream.close()
    assert figures.cache_budget == 0 and figures.cache_used == 0 < held
    assert figures.resident_layers == 0 and figures.cache_evictions > 0


def test_replaying_a_recorded_trace_gives_the_engines_own_hits(stores):
    store = stores["kimi_k3"]
    manifest = read_manifest(store)
    sizes = held_sizes(manifest.layers)
    budget = manifest.expert_bytes // 3
    for policy in CACHE_POLICIES:
        settings = StreamSettings(cache_bytes=budget, cache_policy=policy, warm_start=False)  # a cold cache
        instruments = Instruments(routing=[])
        model = open_model(store, stream=settings, instruments=instruments)
        try:
            list(model.generate_tokens(PROMPT[:20], max_tokens=10))
            figures = model.stream.figures()
            calls = [Call(*entry) for entry in instruments.routing]
        finally:
            model.close()
        predicted = replay(calls, sizes, budget, policy)
        assert (predicted.hits, predicted.lookups) == (figures.cache_hits, figures.cache_hits + figures.cache_misses)
        assert belady(calls, sizes, budget).hits >= predicted.hits


def test_belady_bounds_every_policy_on_random_traces():
    rng = np.random.default_rng(3)
    skew = rng.zipf(1.3, size=4000) % 40  # a few hot experts, a long tail
    calls = [Call(int(i % 4), tuple(sorted({int(e), int(e + 7) % 40})), 1) for i, e in enumerate(skew)]
    sizes = dict.fromkeys(range(4), 100)
    for budget in (500, 2000, 8000):
        bound = belady(calls, sizes, budget)
        for policy in CACHE_POLICIES:
            assert replay(calls, sizes, budget, policy).hits <= bound.hits
    assert belady(calls, sizes, 16000).hits == bound.lookups - len({(c.layer, e) for c in calls for e in c.experts})


def test_the_static_oracle_and_a_warm_belady_bound_what_they_should():
    """The most frequent fixed set never beats Belady from the same start; a free warm start never hurts."""
    rng = np.random.default_rng(5)
    calls = [
        Call(int(i % 3), tuple(sorted({int(e) % 30, int(e * 7) % 30})), 1) for i, e in enumerate(rng.zipf(1.4, 3000))
    ]
    sizes = dict.fromkeys(range(3), 10)
    for budget in (50, 200, 600):
        for warm in (False, True):
            assert static_oracle(calls, sizes, budget, warm).hits <= belady(calls, sizes, budget, warm).hits
        assert belady(calls, sizes, budget, warm=True).hits >= belady(calls, sizes, budget).hits
        assert static_oracle(calls, sizes, budget, warm=True).hits >= static_oracle(calls, sizes, budget).hits


def test_a_run_leaves_a_profile_that_warm_starts_the_next_and_the_replay_predicts_it(tmp_path_factory):
    """Past runs' counts saved at close; the next open fills the cache from them in the background, the same
    tokens, and the simulator's warm replay equal to the engine's hits."""
    from tests.helpers.stores import tiny_store

    store = tiny_store(tmp_path_factory, "kimi_k3")
    manifest = read_manifest(store)
    sizes = held_sizes(manifest.layers)
    budget = manifest.expert_bytes // 3
    settings = StreamSettings(cache_bytes=budget, cache_policy=FREQUENCY, warm_start=True)
    assert load_profile(store) is None
    cold = open_model(store, stream=settings)  # no profile yet: nothing to warm
    try:
        cold_tokens = [c.token for c in cold.generate_tokens(PROMPT[:20], max_tokens=10)]
        assert cold.stream.residency.warm is None
    finally:
        cold.close()
    profile = load_profile(store)
    assert profile is not None and profile.runs == 1 and profile.counts
    rows = json.loads(profile_path(store).read_text())["layers"]
    assert {int(k): len(v) for k, v in rows.items()} == {layer.layer: layer.num_experts for layer in manifest.layers}

    instruments = Instruments(routing=[])  # the warm start's reads are not calls: only the generation's are logged
    model = open_model(store, stream=settings, instruments=instruments)
    try:
        model.stream.residency.warm.wait()  # as if the warm start finished before the first token (it runs meanwhile)
        tokens = [c.token for c in model.generate_tokens(PROMPT[:20], max_tokens=10)]
        figures = model.stream.figures()
        calls = [Call(*entry) for entry in instruments.routing]
    finally:
        model.close()
    assert tokens == cold_tokens
    assert figures.warm.kept == len(profile.hottest(sizes, budget)) > 0 and figures.warm_hits > 0
    predicted = replay(calls, sizes, budget, FREQUENCY, profile, warm=True)
    assert (predicted.hits, predicted.lookups) == (figures.cache_hits, figures.cache_hits + figures.cache_misses)
    assert load_profile(store).runs == 2


def test_a_warm_start_of_a_model_that_fits_makes_it_resident_without_demand_reads(tmp_path_factory, in_ram):
    from tests.helpers.stores import tiny_store

    store = tiny_store(tmp_path_factory, "qwen3_moe")
    first = open_model(store, stream=StreamSettings())
    list(first.generate_tokens(PROMPT, max_tokens=12))  # the profile: every expert the next run uses
    first.close()
    model = open_model(store, stream=StreamSettings(warm_start=True))
    try:
        model.stream.residency.warm.wait()
        tokens = [c.token for c in model.generate_tokens(PROMPT, max_tokens=12)]
        figures = model.stream.figures()
    finally:
        model.close()
    assert tokens == in_ram["qwen3_moe"]
    assert figures.resident_layers == len(read_manifest(store).layers)
    assert figures.reads.demand_reads == 0 and figures.warm.kept == figures.distinct_experts_read
    assert sum(d.reads for d in figures.drives.values()) == figures.distinct_experts_read  # none read twice


def test_an_unreadable_profile_is_ignored_and_rewritten(tmp_path_factory, caplog):
    from tests.helpers.stores import tiny_store

    store = tiny_store(tmp_path_factory, "qwen3_moe")
    profile_path(store).parent.mkdir(parents=True, exist_ok=True)
    for unreadable in (profile_path(store), store / PROFILE_FILE):  # the learned one and the store's default
        unreadable.write_text("{not json")
    model = open_model(store, stream=StreamSettings(warm_start=True))
    try:
        assert model.stream.residency.warm is None and "routing profile" in caplog.text
        list(model.generate_tokens(PROMPT[:8], max_tokens=2))
    finally:
        model.close()
    assert load_profile(store).runs == 1


def test_runs_closing_on_one_store_at_once_each_save_a_whole_profile(tmp_path, home, caplog):
    """Two runs of one store (two workers, or the service beside a foreground run) closing together: each writes
    the profile through its own temporary file, so neither's write is lost or mixed into the other's."""
    store = tmp_path / "store"
    store.mkdir()
    experts = {layer: 64 for layer in range(1, 9)}
    profiles = [RoutingProfile({(layer, e): float(writer + 1) for layer in experts for e in range(64)}, 1)
                for writer in range(2)]  # fmt: skip

    def save(profile: RoutingProfile) -> None:
        for _ in range(40):
            save_profile(store, profile, experts)

    writers = [threading.Thread(target=save, args=(profile,)) for profile in profiles]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert "not saved" not in caplog.text
    assert load_profile(store).counts in [p.counts for p in profiles]
    assert [p.name for p in profile_path(store).parent.iterdir()] == [profile_path(store).name]
    assert list(store.iterdir()) == []  # in the data dir, not in the store


def test_a_run_leaves_its_store_as_it_was_and_learns_the_profile_in_the_data_dir(tmp_path_factory, home, caplog):
    """A store may be read-only media or shared by several processes: runs read the profile shipped in it as its
    default, learn theirs in the data dir, and leave every file and folder of the store byte for byte as it was."""
    from tests.helpers.stores import tiny_store

    store = tiny_store(tmp_path_factory, "qwen3_moe")
    experts = {layer.layer: layer.num_experts for layer in read_manifest(store).layers}
    save_profile(store, RoutingProfile({(layer, 0): 8.0 for layer in experts}, 3), experts)
    profile_path(store).rename(store / PROFILE_FILE)  # shipped with the store

    def contents() -> dict[str, bytes | None]:
        return {str(p.relative_to(store)): p.read_bytes() if p.is_file() else None for p in sorted(store.rglob("*"))}

    before = contents()
    for runs in (4, 5):  # the shipped default's three runs, then each run's own
        model = open_model(store, stream=StreamSettings(warm_start=True))
        try:
            assert model.stream.residency.warm is not None  # warm started from the profile
            list(model.generate_tokens(PROMPT[:8], max_tokens=2))
        finally:
            model.close()
        assert load_profile(store).runs == runs
    assert contents() == before and "not saved" not in caplog.text
    assert profile_path(store).parent == home / "routing-profiles" and profile_path(store).is_file()


def test_a_memory_cgroup_limit_bounds_what_auto_sees(tmp_path):
    """In a container or under `bench peer`'s limit, /proc/meminfo shows the host's RAM; the cgroup's counts."""
    import os
    import subprocess
    import sys

    from nightshift.engine.rig.cgroups import CgroupError, MemoryGroup, command_in

    if os.geteuid() != 0:
        pytest.skip("needs root (memory cgroups)")
    try:
        group = MemoryGroup.create(f"nightshift-test-{os.getpid()}", 1 << 30)
    except CgroupError as exc:
        pytest.skip(f"no memory cgroup: {exc}")
    try:
        code = "from nightshift.engine.moe.budget import memory_now; m = memory_now(); print(m.total, m.available)"
        argv = command_in(group.procs_file, [sys.executable, "-c", code])
        total, available = map(int, subprocess.run(argv, capture_output=True, text=True).stdout.split())
        assert group.figure("limit") == 1 << 30 and group.figure("peak") > 0
    finally:
        group.remove()
    assert total == 1 << 30 and 0 < available < 1 << 30


AUTO_IN_A_LIMIT = """
import json, sys
from pathlib import Path
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import open_model

prompt, tokens = json.loads(sys.argv[2]), int(sys.argv[3])
model = open_model(Path(sys.argv[1]), stream=StreamSettings(context_tokens=len(prompt) + tokens))
out = [c.token for c in model.generate_tokens(prompt, max_tokens=tokens)]
budget, used = model.stream.budget, model.stream.figures().cache_used
model.close()
print(json.dumps({"tokens": out, "budget": budget.bytes, "limited": budget.limited, "margin": budget.margin,
                  "used": used}))
"""
LIMIT = 256 << 20  # the old 1 GiB margin left no cache in it; the test process peaks at about 62 MB charged to it


def in_a_limit(code: str, store: Path) -> tuple[dict, int]:
    """`code` run on `store` with the test prompt and tokens, its whole process in a memory cgroup held to `LIMIT`
    (removed after, whatever happened): what it printed last (JSON) and the group's peak. No process may be killed.
    Skips without root or memory cgroups."""
    import os
    import subprocess
    import sys

    from nightshift.engine.rig.cgroups import CgroupError, MemoryGroup, command_in
    from tests.helpers.stores import PROMPT, TOKENS

    if os.geteuid() != 0:
        pytest.skip("needs root to create a memory cgroup")
    try:
        group = MemoryGroup.create(f"nightshift-test-auto-{os.getpid()}", LIMIT)
    except CgroupError as exc:
        pytest.skip(f"no memory cgroup: {exc}")
    try:
        argv = [sys.executable, "-c", code, str(store), json.dumps(PROMPT), str(TOKENS)]
        done = subprocess.run(command_in(group.procs_file, argv), capture_output=True, text=True, timeout=300)
        peak, kills = group.figure("peak"), group.oom_kills()
    finally:
        group.remove()
    assert done.returncode == 0 and kills == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1]), peak


def test_auto_inside_a_memory_limit_caches_experts_stays_under_it_and_keeps_the_tokens(stores, in_ram):
    """The whole process held to a cgroup limit far below the old 1 GiB margin: auto still sizes a cache, the group
    never goes past the limit nor has a process killed, and the tokens are the model's in RAM."""
    said, peak = in_a_limit(AUTO_IN_A_LIMIT, stores["qwen3_moe"])
    assert said["limited"] and said["margin"] == margin_for(Memory(0, LIMIT, True)) < 1 << 30
    assert said["budget"] == held_expert_bytes(read_manifest(stores["qwen3_moe"]))  # a tiny store's experts all fit
    assert 0 < said["used"] <= said["budget"] and 0 < peak <= LIMIT
    assert said["tokens"] == in_ram["qwen3_moe"]


GROW_IN_A_LIMIT = """
import json, sys
from pathlib import Path
import numpy as np
from nightshift.engine.moe import budget
from nightshift.engine.moe.budget import margin_for, memory_now, reserved_bytes
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import open_model
from nightshift.engine.store.manifest import read_manifest

store, prompt, tokens = Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
budget.CHECK_EVERY_S = 0  # every layer call a check: a tiny model's answer takes less than the interval
# Ballast that leaves auto no room at open: what is free then is the margin and the reserve less 16 MiB (the group's
# usage lags its allocations by a few MB); the reserve counted without read buffers, less than the open's.
memory, reserve = memory_now(), reserved_bytes(read_manifest(store), store, 0)
ballast = np.ones(memory.available - margin_for(memory) - reserve + (16 << 20), np.uint8)
model = open_model(store, stream=StreamSettings(context_tokens=len(prompt) + tokens))
del ballast  # given back after the open: what the open could not count on, the run can
out = [c.token for c in model.generate_tokens(prompt, max_tokens=tokens)]
figures = model.stream.figures()
model.close()
print(json.dumps({"tokens": out, "open": model.stream.budget.bytes, "end": figures.cache_budget,
                  "used": figures.cache_used, "resident": figures.resident_layers}))
"""


def test_auto_inside_a_memory_limit_grows_into_memory_freed_after_the_open_and_stays_under_the_limit(stores, in_ram):
    """A real limit, and ballast that leaves auto no room at open, freed once the model is open: the budget grows
    into the limit once the prompt pass has run, to every expert of the tiny store (resident), the group never
    goes past the limit nor has a process killed, and the tokens are the model's in RAM."""
    said, peak = in_a_limit(GROW_IN_A_LIMIT, stores["qwen3_moe"])
    every = held_expert_bytes(read_manifest(stores["qwen3_moe"]))
    assert said["open"] < every and said["end"] == said["used"] == every  # sized short, grown to every expert
    assert said["resident"] == len(read_manifest(stores["qwen3_moe"]).layers) and 0 < peak <= LIMIT
    assert said["tokens"] == in_ram["qwen3_moe"]


def test_a_schedule_names_its_memory_budget_and_a_bad_one_is_refused(tmp_path):
    from nightshift.app.paths import bundled
    from nightshift.app.review.errors import ScheduleError
    from nightshift.app.review.schedule import load_schedule

    text = (bundled("schedules") / "month-end.toml").read_text()
    assert load_schedule(bundled("schedules") / "month-end.toml").generation.memory_budget == "auto"
    for budget, ok in (("12G", True), ("lots", False)):
        path = tmp_path / f"{budget}.toml"
        path.write_text(text.replace("[model]", f'[model]\nmemory_budget = "{budget}"'))
        if ok:
            assert load_schedule(path).generation.memory_budget == budget
        else:
            with pytest.raises(ScheduleError, match="memory_budget"):
                load_schedule(path)


def test_mlx_keeps_no_more_freed_buffers_than_the_working_set_the_budget_reserves(stores):
    import mlx.core as mx

    from nightshift.engine.moe.budget import working_set_bytes

    store = stores["qwen3_moe"]
    working_set = working_set_bytes(read_manifest(store))
    # Once an earlier store in this process fixed glibc's mmap threshold (process-wide), every buffer that large is
    # mapped, and the reader keeps RECYCLE_BYTES of them for reuse rather than fault them in every step.
    recycled = RECYCLE_BYTES if map_expert_tensors([]) is not None else 0
    default = mx.set_cache_limit(1 << 40)  # as MLX's default on a GPU: its memory limit
    try:
        load_streaming(store, StreamSettings())[2].close()
        assert mx.set_cache_limit(working_set // 2) == max(working_set, recycled)
        load_streaming(store, StreamSettings())[2].close()  # a lower limit the process set is kept
        assert mx.set_cache_limit(default) == max(working_set // 2, recycled)
    finally:
        mx.set_cache_limit(default)


def test_generates_context_bound_holds_the_chat_prompt_and_the_answer(stores):
    """`nightshift generate` sizes auto before the tokenizer is loaded: its bound must hold what the run then holds."""
    from nightshift.app.commands.generate import context_bound

    messages = [
        {"role": "system", "content": "You review books."},
        {"role": "user", "content": "Reconcile ledger 4711 with the bank: €1 234,56 — 13 invoices; 日本語も。"},
    ]
    model = open_model(stores["qwen3_moe"])
    try:
        held = len(model.chat_tokens(messages)) + 40
    finally:
        model.close()
    assert held <= context_bound(messages, 40) < held + 1024
