"""Decode benchmark: streamed decode rate against its roofline, measured side by side in one run.

    disk floor     = bytes of the experts a token needs from the drives (its layers' selected experts not
                     in the RAM cache; wasted prefetch reads excluded) / aggregate read bandwidth of the
                     drives in use: the larger of a probe right before decoding (whole expert files) and
                     the rate the timed decode itself read at, so no run can beat its own floor
    compute floor  = time per token of the same model with every expert resident in RAM
    roofline       = max(disk floor, compute floor); the figure of merit is roofline / time per token.
    layer floor    = the sum over decode passes of max(the pass's reads at that bandwidth, its share of the
                     compute floor): what an engine that starts a layer's reads at its router can reach.
                     Where the two floors are close and layers differ in misses, it sits above the
                     roofline (a layer waiting on its reads has no compute of later layers to overlap):
                     only a next-layer prediction that finds the misses gets under it.

A fraction above 1 can then only come from a compute floor slower than the streamed run (the in-RAM run
was slowed by other work): `floor_error` flags it, and `verdict` says so, never a pass.

Nothing here asserts on time: figures are returned (and recorded by the caller in the run catalogue).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step

from nightshift.engine.bench.wait_split import wait_split
from nightshift.engine.cpu_prefill import use_gemm_prefill
from nightshift.engine.cpu_streams import stream_count
from nightshift.engine.instruments.probes import ForeseenCall, Instruments
from nightshift.engine.instruments.trace import CACHE, DriveRead, PassTrace
from nightshift.engine.io.ceilings import Ceilings
from nightshift.engine.io.direct import aligned_buffer, open_direct
from nightshift.engine.io.drives import Drive
from nightshift.engine.moe.figures import StreamFigures
from nightshift.engine.moe.load import cap_buffer_cache_for, load_streaming, with_drives
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.stream import ExpertStream
from nightshift.engine.store.families import module_at, switch_sites
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import Manifest, read_manifest

# A fixed prompt of record (token ids), so runs of one configuration are comparable.
PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 11, 300, 23, 8]
# Before timing, one token is decoded after a one-token prompt: that builds the one-row kernels the timed decode
# runs and faults in the trunk. (It decoded 2 tokens after the whole prompt, whose union of experts took minutes
# to read on one slow drive, for nothing timed: the timed decode reads its prompt again, untimed.)
WARMUP_PROMPT, WARMUP = PROMPT[:1], 1
# The probe's default length: the blkio throttle works in time slices, so a 1 s probe wobbles by ~6 % and a
# 3 s one read 7.92-7.98 MB/s against a decode at the throttle's exact 8.00 (issue [17]).
BANDWIDTH_S = 5.0
PASS_FRACTION = 0.9  # roofline / time per token at or above which a decode passes


def greedy(logits: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)


@dataclass
class DecodeTiming:
    tokens: list[int]
    seconds_per_token: float  # first token excluded (prefill)
    # What the model's instruments counted during the decode (the CPU-stream split among them, first token
    # included): proof a path fired. Empty without instruments.
    counts: dict[str, int] = field(default_factory=dict)


def time_decode(
    model, tokens: int, prompt: list[int] = PROMPT, at_first_token=None, instruments: Instruments | None = None
) -> DecodeTiming:
    """Greedy-decode 1 + `tokens` tokens after `prompt` (the first ends prefill and is not timed);
    `at_first_token()` is called once prefill is done; `instruments`: those the model was opened with."""
    out, stamps = [], []
    before = instruments.counts() if instruments else {}
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens + 1, sampler=greedy):
        stamps.append(time.perf_counter())
        out.append(int(token))
        if len(out) == 1 and at_first_token is not None:
            at_first_token()
    counts = {name: count - before[name] for name, count in instruments.counts().items()} if instruments else {}
    return DecodeTiming(out, (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1), counts)


def measure_bandwidth(
    manifest: Manifest, drives: list[str], seconds: float = BANDWIDTH_S, threads_per_drive: int = 4
) -> float:
    """Aggregate bytes/s of direct whole-file reads of random expert files, all `drives` at once."""
    files = {d: [] for d in drives}
    for layer in manifest.layers:
        for expert in range(layer.num_experts):
            for drive, path in manifest.replica_paths(layer.layer, expert):
                if drive in files:
                    files[drive].append((path, layer.file_bytes))
    stop = time.perf_counter() + seconds
    total = [0]
    lock = threading.Lock()

    def worker(drive: str, seed: int) -> None:
        rng = random.Random(seed)
        size = max(s for _, s in files[drive])
        buffer = aligned_buffer(size)
        done = 0
        while time.perf_counter() < stop:
            path, nbytes = rng.choice(files[drive])
            with open_direct(path) as f:
                done += f.read_into(memoryview(buffer)[:nbytes], 0)
        with lock:
            total[0] += done

    jobs = [(d, i) for d in drives if files[d] for i in range(threads_per_drive)]
    start = time.perf_counter()
    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(lambda job: worker(*job), jobs))
    return total[0] / (time.perf_counter() - start)


def needed_bytes(passes: list[PassTrace], since: float) -> int:
    """Bytes of the experts the passes begun after `since` took from the drives (cache hits excluded)."""
    return sum(r.nbytes for p in passes if p.began >= since for r in p.reads if r.source != CACHE)


def counters_of(figures: StreamFigures) -> dict[str, float]:
    """The stream's figures flattened to the counters config assertions check (as the catalogue records them)."""
    return {
        **asdict(figures.reads),
        "replica_choices": figures.replica_choices,
        "cache_hits": figures.cache_hits,
        "cache_misses": figures.cache_misses,
        "prefetch_recall_pct": round(100 * figures.prefetch_recall, 1),
        "read_ahead_pct": round(100 * figures.recall_read_ahead / figures.recall_needed, 1)
        if figures.recall_needed
        else 0.0,
        "overlapped_experts": figures.calls.overlapped,
    }


def drives_of(figures: StreamFigures) -> dict[str, dict[str, int]]:
    """Bytes and reads per drive, as the catalogue records them."""
    return {name: asdict(drive) for name, drive in figures.drives.items()}


@dataclass
class StreamedDecode:
    """One timed streamed decode: its tokens and time, the stream's figures and trace after it, and what
    the decode alone (first token excluded) read from the drives, needed of them and waited for them."""

    timing: DecodeTiming
    figures: StreamFigures
    trace: dict
    read_bytes: int
    needed_bytes: int
    routing: list
    wait_s: float = 0.0
    pass_bytes: list[int] = field(default_factory=list)  # per decode pass, the bytes it took from the drives
    decode_reads: dict[str, int] = field(default_factory=dict)  # the reader's counts over the decode alone
    passes: list[PassTrace] = field(default_factory=list)  # the decode's passes
    drive_reads: list[DriveRead] = field(default_factory=list)  # every read the drives did, from the decode's start


def streamed_decode(
    store: Path,
    settings: StreamSettings,
    tokens: int,
    drives: list[Drive] | None = None,
    ceilings: Ceilings | None = None,
    routing: bool = False,
    prompt: list[int] = PROMPT,
    warmup: int = WARMUP,
    warmup_prompt: list[int] = WARMUP_PROMPT,
    after_warmup: Callable[[ExpertStream], None] | None = None,
    at_first_token: Callable[[], None] | None = None,
    foresight: list[ForeseenCall] | None = None,
) -> StreamedDecode:
    """Open the store streamed with `settings`, warm up, then time a greedy decode of `tokens` tokens
    (`after_warmup(stream)` runs between the two, `at_first_token()` where the timing starts: `bench peer`'s;
    `routing`: log every layer call from the open on; `foresight`: a recorded run's layer calls, whose experts
    are the guesses; both `Instruments`')."""
    instruments = Instruments(routing=[] if routing else None, foresight=foresight)
    model, _, stream = load_streaming(store, settings, drives, ceilings, instruments=instruments)
    try:
        time_decode(model, warmup, warmup_prompt)  # first calls build MLX kernels and fault in the trunk: not timed
        if after_warmup is not None:
            after_warmup(stream)
        before: dict[str, int] = {}
        reads_before: dict[str, int] = {}
        decode_began = [0.0]

        def mark() -> None:
            before.update({n: s.bytes for n, s in zip(stream.counters.names, stream.counters.snapshot())})
            reads_before.update(asdict(stream.reader.counts))
            decode_began[0] = stream.trace.now()
            if at_first_token is not None:
                at_first_token()

        timing = time_decode(model, tokens, prompt, at_first_token=mark, instruments=instruments)
        figures = stream.figures()
        trace = stream.trace.summary()
    finally:
        stream.close()
        del model
    read = sum(d.bytes - before.get(n, 0) for n, d in figures.drives.items())
    passes = [p for p in stream.trace.passes() if p.began >= decode_began[0]]
    wait = sum(p.wait_s for p in passes)
    pass_bytes = [needed_bytes([p], 0.0) for p in passes]
    decode_reads = {name: count - reads_before.get(name, 0) for name, count in asdict(figures.reads).items()}
    routing_log = instruments.routing or []
    drive_reads = [r for r in stream.trace.drive_reads() if r.end >= decode_began[0]]
    return StreamedDecode(
        timing, figures, trace, read, sum(pass_bytes), routing_log, wait, pass_bytes, decode_reads, passes, drive_reads
    )


def in_ram_decode(store: Path, tokens: int, at_first_token: Callable[[], None] | None = None) -> DecodeTiming:
    """The compute floor: the same greedy decode with every expert resident in RAM (after the same warm-up).

    Its expert layers read a prompt with the streamed layers' math (the grouped GEMM of `use_gemm_prefill`),
    so the tokens compared are those of one model, not of two summation orders that part at a near-tie.
    """
    resident, _ = load_store(Path(store))
    cap_buffer_cache_for(Path(store))  # as the in-RAM open: its head's wider copy is not faulted in every step
    instruments = Instruments()
    for site in switch_sites(resident):
        use_gemm_prefill(module_at(resident, site.path), instruments)
    time_decode(resident, WARMUP, WARMUP_PROMPT)
    timing = time_decode(resident, tokens, at_first_token=at_first_token, instruments=instruments)
    del resident
    return timing


def with_compute_floor(figures: dict, streamed_tokens: list[int], in_ram: DecodeTiming) -> dict:
    """`figures` with the compute floor, token identity, roofline and its fraction added (and `floor_error`
    set when the streamed run beat its roofline: a floor was mis-measured, not a faster-than-possible run)."""
    figures["compute_floor_ms"] = 1000 * in_ram.seconds_per_token
    figures["tokens_identical"] = in_ram.tokens == streamed_tokens
    roofline_ms = max(figures["disk_floor_ms"], figures["compute_floor_ms"])
    figures["roofline_ms"] = roofline_ms
    figures["roofline_fraction"] = roofline_ms / figures["ms_per_token"]
    figures["floor_error"] = figures["roofline_fraction"] > 1 or figures["disk_floor_fraction"] > 1
    return figures


def layer_floor(pass_bytes: list[int], bandwidth: float, compute_per_token: float, tokens: int) -> float:
    """Seconds per token of the layer floor (module docstring): each pass's compute share is the compute floor
    spread evenly over the passes (every layer runs the same top-k experts on one row)."""
    share = compute_per_token * tokens / max(len(pass_bytes), 1)
    return sum(max(nbytes / bandwidth, share) for nbytes in pass_bytes) / tokens


def verdict(figures: dict) -> str:
    """pass / below-roofline (and compute-bound: disk floor under twice the compute floor; tokens differ when
    greedy output is not the in-RAM model's); a fraction above 1 is a measurement error, never a pass;
    `measured` without a compute floor."""
    if figures.get("floor_error") or figures["disk_floor_fraction"] > 1:
        return "measurement error: faster than its floor"
    if "roofline_fraction" not in figures:
        return "measured"
    said = "pass" if figures["roofline_fraction"] >= PASS_FRACTION else "below-roofline"
    if figures["disk_floor_ms"] < 2 * figures["compute_floor_ms"]:
        said += ", compute-bound"  # the drives are too fast for this CPU: not a disk-bound test
    if not figures["tokens_identical"]:
        said += ", tokens differ from the model in RAM"
    return said


def decode_bench(
    store: Path,
    settings: StreamSettings,
    tokens: int = 16,
    drives: list[Drive] | None = None,
    ceilings: Ceilings | None = None,
    compute_floor: bool | DecodeTiming = True,
    bandwidth_s: float = BANDWIDTH_S,
    routing: bool = False,
    foresight: list[ForeseenCall] | None = None,
) -> dict:
    """One decode run: figures (time per token, floors, roofline fraction), counters, trace summary;
    `compute_floor` True measures the in-RAM run, a DecodeTiming reuses one (an A/B's or a ladder's);
    with `routing`, also every layer call's routing from the warm-up on (`Instruments.routing`);
    `foresight`: guesses from a recorded run's calls (`streamed_decode`)."""
    manifest = with_drives(read_manifest(store), drives)
    in_use = list(settings.use_drives) or list(manifest.drives)
    probed = measure_bandwidth(manifest, in_use, bandwidth_s)
    run = streamed_decode(store, settings, tokens, drives, ceilings, routing, foresight=foresight)
    seconds = run.timing.seconds_per_token
    achieved = run.read_bytes / (seconds * tokens)
    bandwidth = max(probed, achieved)
    needed_per_token = run.needed_bytes / tokens
    disk_floor = needed_per_token / bandwidth
    out = {
        "tokens": tokens,
        "ms_per_token": 1000 * seconds,
        "tokens_per_s": 1 / seconds,
        "bytes_per_token": run.read_bytes / tokens,
        "needed_bytes_per_token": needed_per_token,
        "probed_bytes_per_s": probed,
        "achieved_bytes_per_s": achieved,  # what the decode itself read at, compute windows included
        "bandwidth_bytes_per_s": bandwidth,
        "bandwidth_seconds": bandwidth_s,
        "disk_floor_ms": 1000 * disk_floor,
        "disk_floor_fraction": disk_floor / seconds,  # 1.0: as fast as the drives allow
        "wait_ms_per_token": 1000 * run.wait_s / tokens,  # the decode's layers waiting for expert reads
        "prefetch_recall": run.figures.prefetch_recall,
        "cpu_streams": stream_count(),  # a decode step's experts spread over this many (`cpu_streams`)
    }
    if compute_floor is True:
        compute_floor = in_ram_decode(store, tokens)
    if compute_floor:
        with_compute_floor(out, run.timing.tokens, compute_floor)
        floor = layer_floor(run.pass_bytes, bandwidth, compute_floor.seconds_per_token, tokens)
        out["layer_floor_ms"], out["layer_floor_fraction"] = 1000 * floor, floor / seconds
        per_pass = compute_floor.seconds_per_token * tokens / max(len(run.passes), 1)
        out.update(wait_split(run.passes, run.drive_reads, bandwidth / len(in_use), per_pass, tokens).as_ms())
    in_ram_split = compute_floor.counts if compute_floor else {}
    return {
        "figures": out,
        "counters": {
            **counters_of(run.figures),
            **{f"decode_{name}": count for name, count in run.decode_reads.items()},  # the timed tokens' alone
            "spread_experts": run.timing.counts["spread_experts"],  # streamed experts on another stream
            **({"in_ram_split_calls": in_ram_split["split_calls"]} if in_ram_split else {}),
        },
        "drives": drives_of(run.figures),
        "trace": run.trace,
        "tokens": run.timing.tokens,
        "routing": run.routing,
    }


def ladder(
    store: Path,
    settings: StreamSettings,
    tokens: int,
    drives: list[Drive] | None = None,
    ceilings: Ceilings | None = None,
    bandwidth_s: float = BANDWIDTH_S,
    compute_floor: bool = True,
    tuned: Callable[[StreamSettings], StreamSettings] | None = None,
) -> list[tuple[StreamSettings, dict]]:
    """The same decode on the first 1, 2, ... n drives of the store (every expert must be on each); with
    `compute_floor`, the in-RAM run is measured once and every step gets its roofline and token identity;
    `tuned` gives each step the store's tuning for its drives (`model tune --use-drives`)."""
    names = list(settings.use_drives) or list(with_drives(read_manifest(store), drives).drives)
    in_ram = in_ram_decode(store, tokens) if compute_floor else False
    runs = []
    for count in range(1, len(names) + 1):
        step = StreamSettings(**{**vars(settings), "use_drives": tuple(itertools.islice(names, count))})
        step = tuned(step) if tuned else step
        runs.append((step, decode_bench(store, step, tokens, drives, ceilings, in_ram, bandwidth_s)))
    return runs


def greedy_of_record(
    store: Path, settings: StreamSettings | None, steps: int = 32, drives: list[Drive] | None = None
) -> list[int]:
    """Greedy tokens after the prompt of record: streamed with `settings`, or in RAM when None."""
    if settings is None:
        return time_decode(load_store(Path(store))[0], steps - 1).tokens
    model, _, stream = load_streaming(store, settings, drives)
    try:
        return time_decode(model, steps - 1).tokens
    finally:
        stream.close()


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where `a` and `b` differ (or one ends early); None when identical.

    The one rule for every comparison of greedy token lists (`nightshift verify`, the peer benches, the tests):
    a list that stops short of the other parts from it where it stops."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
