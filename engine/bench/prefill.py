"""Prefill benchmark: a long prompt's time to first token against its roofline, measured side by side.

    unique bytes        = bytes of the distinct (layer, expert) files the prompt needs
    read amplification  = bytes read from the drives while prefilling / unique bytes
    disk floor          = unique bytes / aggregate direct-read bandwidth of the drives in use (this run)
    compute floor       = the same prefill with every expert in RAM
    roofline            = max(disk floor, compute floor); the figure of merit is roofline / time to first token

Row by row (chunks of one token: what a decode loop fed the prompt does) is measured beside it on the
first `row_tokens` of the same prompt, for its read amplification and rate.
Nothing here asserts on time: figures are returned for the caller to record.
"""

from __future__ import annotations

import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from nightshift.engine.bench.decode import counters_of, drives_of, measure_bandwidth
from nightshift.engine.io.ceilings import Ceilings
from nightshift.engine.io.drives import Drive
from nightshift.engine.moe.figures import PrefillReads
from nightshift.engine.moe.load import cap_buffer_cache_for, load_streaming, with_drives
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.stream import ExpertStream
from nightshift.engine.prefill import counted_prefill, prefill
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import read_manifest

WARMUP_TOKENS = 8  # a short prefill first: MLX builds its kernels and the trunk is faulted in


def prompt_of(vocab_size: int, tokens: int, seed: int = 0) -> list[int]:
    """A fixed pseudo-random prompt (ids above the usual special tokens), so runs are comparable."""
    return np.random.default_rng(seed).integers(3, vocab_size, size=tokens).tolist()


def timed_prefill(
    model, prompt: list[int], chunk: int, stream: ExpertStream | None
) -> tuple[float, int, PrefillReads | None]:
    """(seconds to the first token, that token, the stream's prefill reads) for one prefill from an empty cache."""
    prefill(model, prompt[:WARMUP_TOKENS], make_prompt_cache(model), chunk)
    start = time.perf_counter()
    logprobs, reads = counted_prefill(model, prompt, make_prompt_cache(model), chunk, stream)
    first = int(mx.argmax(logprobs).item())
    return time.perf_counter() - start, first, reads


def prefill_bench(
    store: Path,
    settings: StreamSettings,
    prompt_tokens: int = 512,
    chunk: int = 512,
    drives: list[Drive] | None = None,
    ceilings: Ceilings | None = None,
    compute_floor: bool = True,
    row_tokens: int = 0,
    bandwidth_s: float = 2.0,
) -> dict:
    """One prefill run: time to first token, read amplification, floors; and row by row on a prefix if asked."""
    manifest = with_drives(read_manifest(store), drives)
    prompt = prompt_of(manifest.config["vocab_size"], prompt_tokens)
    bandwidth = measure_bandwidth(manifest, list(settings.use_drives) or list(manifest.drives), bandwidth_s)
    model, _, stream = load_streaming(store, settings, drives, ceilings)
    try:
        seconds, first, reads = timed_prefill(model, prompt, chunk, stream)
        figures = stream.figures()
        trace = stream.trace.summary()
        rows = timed_prefill(model, prompt[:row_tokens], 1, stream) if row_tokens else None
    finally:
        stream.close()
        del model
    disk_floor = reads.unique_bytes / bandwidth
    out = {
        "prompt_tokens": prompt_tokens,
        "chunk": chunk,
        "time_to_first_token_s": seconds,
        "prefill_tokens_per_s": prompt_tokens / seconds,
        "unique_bytes": reads.unique_bytes,
        "bytes_read": reads.bytes_read,
        "read_amplification": reads.amplification,
        "bandwidth_bytes_per_s": bandwidth,
        "disk_floor_s": disk_floor,
        "disk_floor_fraction": disk_floor / seconds,
        "prefetch_recall": figures.prefetch_recall,
    }
    if rows is not None:
        row_seconds, _, row_reads = rows
        out.update(
            {
                "row_by_row_tokens": row_tokens,
                "row_by_row_s": row_seconds,
                "row_by_row_tokens_per_s": row_tokens / row_seconds,
                "row_by_row_read_amplification": row_reads.amplification,
            }
        )
    if compute_floor:
        resident, _ = load_store(Path(store))
        cap_buffer_cache_for(Path(store))  # as the in-RAM open
        in_ram, in_ram_first, _ = timed_prefill(resident, prompt, chunk, None)
        del resident
        roofline = max(disk_floor, in_ram)
        out.update(
            {
                "compute_floor_s": in_ram,
                "first_token_identical": in_ram_first == first,
                "roofline_s": roofline,
                "roofline_fraction": roofline / seconds,
            }
        )
    counters = {
        **counters_of(figures),
        "prefill_unique_bytes": reads.unique_bytes,
        "prefill_bytes_read": reads.bytes_read,
    }
    return {"figures": out, "counters": counters, "drives": drives_of(figures), "trace": trace}
