"""Decode benchmark: streamed decode rate against its roofline, measured side by side in one run.

    disk floor     = bytes of the experts a token needs from the drives (its layers' selected experts not
                     in the RAM cache; wasted prefetch reads excluded) / aggregate direct-read bandwidth
                     of the drives in use (measured in this run, right before decoding, whole expert files)
    compute floor  = time per token of the same model with every expert resident in RAM
    roofline       = max(disk floor, compute floor); the figure of merit is roofline / time per token.

Nothing here asserts on time: figures are returned (and recorded by the caller in the run catalogue).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step

from nightshift.engine.instruments.trace import CACHE, PassTrace
from nightshift.engine.io.ceilings import Ceilings
from nightshift.engine.io.direct import aligned_buffer, open_direct
from nightshift.engine.io.drives import Drive
from nightshift.engine.moe.load import load_streaming, with_drives
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.stream import StreamFigures
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import Manifest, read_manifest

# A fixed prompt of record (token ids), so runs of one configuration are comparable.
PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 11, 300, 23, 8]
WARMUP = 2  # tokens decoded before timing


def greedy(logits: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)


@dataclass
class DecodeTiming:
    tokens: list[int]
    seconds_per_token: float  # first token excluded (prefill)


def time_decode(model, tokens: int, prompt: list[int] = PROMPT, at_first_token=None) -> DecodeTiming:
    """Greedy-decode 1 + `tokens` tokens after `prompt` (the first ends prefill and is not timed);
    `at_first_token()` is called once prefill is done."""
    out, stamps = [], []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens + 1, sampler=greedy):
        stamps.append(time.perf_counter())
        out.append(int(token))
        if len(out) == 1 and at_first_token is not None:
            at_first_token()
    return DecodeTiming(out, (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1))


def measure_bandwidth(manifest: Manifest, drives: list[str], seconds: float = 2.0, threads_per_drive: int = 4) -> float:
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
        "overlapped_experts": figures.calls.overlapped,
    }


def drives_of(figures: StreamFigures) -> dict[str, dict[str, int]]:
    """Bytes and reads per drive, as the catalogue records them."""
    return {name: asdict(drive) for name, drive in figures.drives.items()}


def decode_bench(
    store: Path,
    settings: StreamSettings,
    tokens: int = 16,
    drives: list[Drive] | None = None,
    ceilings: Ceilings | None = None,
    compute_floor: bool = True,
    bandwidth_s: float = 2.0,
    routing: bool = False,
) -> dict:
    """One decode run: figures (time per token, floors, roofline fraction), counters, trace summary;
    with `routing`, also every layer call's routing from the warm-up on (`ExpertStream.record_routing`)."""
    manifest = with_drives(read_manifest(store), drives)
    in_use = list(settings.use_drives) or list(manifest.drives)
    bandwidth = measure_bandwidth(manifest, in_use, bandwidth_s)
    model, _, stream = load_streaming(store, settings, drives, ceilings)
    if routing:
        stream.record_routing()
    try:
        time_decode(model, WARMUP)  # first calls build MLX kernels and fault in the trunk: not what we time
        before: dict[str, int] = {}
        decode_began = [0.0]

        def mark() -> None:
            before.update({n: s.bytes for n, s in zip(stream.counters.names, stream.counters.snapshot())})
            decode_began[0] = stream.trace.now()

        streamed = time_decode(model, tokens, at_first_token=mark)
        figures = stream.figures()
        trace = stream.trace.summary()
    finally:
        stream.close()
        del model
    decode_bytes = sum(d.bytes - before.get(n, 0) for n, d in figures.drives.items())
    bytes_per_token = decode_bytes / tokens
    needed_per_token = needed_bytes(stream.trace.passes(), decode_began[0]) / tokens
    disk_floor = needed_per_token / bandwidth
    out = {
        "tokens": tokens,
        "ms_per_token": 1000 * streamed.seconds_per_token,
        "tokens_per_s": 1 / streamed.seconds_per_token,
        "bytes_per_token": bytes_per_token,
        "needed_bytes_per_token": needed_per_token,
        "bandwidth_bytes_per_s": bandwidth,
        "disk_floor_ms": 1000 * disk_floor,
        "disk_floor_fraction": disk_floor / streamed.seconds_per_token,  # 1.0: as fast as the drives allow
        "prefetch_recall": figures.prefetch_recall,
    }
    if compute_floor:
        resident, _ = load_store(Path(store))
        time_decode(resident, WARMUP)
        in_ram = time_decode(resident, tokens)
        del resident
        out["compute_floor_ms"] = 1000 * in_ram.seconds_per_token
        out["tokens_identical"] = in_ram.tokens == streamed.tokens
        roofline = max(disk_floor, in_ram.seconds_per_token)
        out["roofline_ms"] = 1000 * roofline
        out["roofline_fraction"] = roofline / streamed.seconds_per_token
    return {
        "figures": out,
        "counters": counters_of(figures),
        "drives": drives_of(figures),
        "trace": trace,
        "tokens": streamed.tokens,
        "routing": stream.routing or [],
    }


def ladder(
    store: Path,
    settings: StreamSettings,
    tokens: int,
    drives: list[Drive] | None = None,
    ceilings: Ceilings | None = None,
    bandwidth_s: float = 2.0,
) -> list[tuple[StreamSettings, dict]]:
    """The same decode on the first 1, 2, ... n drives of the store (every expert must be on each)."""
    names = list(settings.use_drives) or list(with_drives(read_manifest(store), drives).drives)
    runs = []
    for count in range(1, len(names) + 1):
        step = StreamSettings(**{**vars(settings), "use_drives": tuple(itertools.islice(names, count))})
        runs.append((step, decode_bench(store, step, tokens, drives, ceilings, False, bandwidth_s)))
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
    """Index of the first token where `a` and `b` differ (or one ends early); None when identical."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
