"""What the expert cache holds in RAM per expert, measured: MLX's active memory and the process's RSS after
filling a slab with experts decoded as the reader decodes them, beside what the cache counts.

    .venv/bin/python -m bench.cache_held STORE [--experts 3000]

The store's expert files, layer by layer (round again under new expert numbers if it has fewer), each read whole,
copied out of an aligned buffer by `decode` and put in a slab (engine/moe/slab.py, made for the experts kept) as the
engine keeps an expert it reads, counted by `held_bytes`. Prints one JSON line; run it in a fresh process (its RSS
grows by what it keeps). tests/test_cache_memory.py runs it on padded stores.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
import psutil

import nightshift.engine  # noqa: F401  (before mlx.core: its BLAS first)
from nightshift.engine.io.arenas import trim_heap
from nightshift.engine.moe.held import held_bytes
from nightshift.engine.moe.reads import decode
from nightshift.engine.moe.slab import Slabs
from nightshift.engine.store.manifest import read_manifest


def fill(store: Path, experts: int) -> dict:
    """Fill slabs with `experts` decoded experts of `store`; what the cache counts, and the memory they took."""
    manifest = read_manifest(store)
    specs = [(spec, e) for spec in manifest.layers for e in range(spec.num_experts)]
    buffer = bytearray(max(spec.file_bytes for spec in manifest.layers))
    slabs = Slabs(manifest.layers, lambda: experts * max(held_bytes(spec) for spec in manifest.layers))
    mx.eval(mx.zeros(1))
    rss, active = psutil.Process().memory_info().rss, mx.get_active_memory()
    counted = counted_files = tensor_bytes = 0
    for n in range(experts):
        spec, expert = specs[n % len(specs)]
        with open(manifest.replica_paths(spec.layer, expert)[0][1], "rb") as f:
            f.readinto(memoryview(buffer)[: spec.file_bytes])
        slabs.put((spec.layer, n), decode(buffer, spec))
        counted += held_bytes(spec)
        counted_files += spec.file_bytes
        tensor_bytes += sum(slot.nbytes for slot in spec.tensors)
    mx.clear_cache()  # the arrays each expert was decoded into: freed, held for reuse by MLX,
    trim_heap()  # and by the heap (as the engine gives RAM back: `Residency.give_back`)
    return {"experts": sum(len(slab.where) for slab in slabs.by_layout), "counted": counted,
            "file_bytes": counted_files, "tensor_bytes": tensor_bytes, "slab_bytes": slabs.nbytes(),
            "active": mx.get_active_memory() - active,
            "rss": psutil.Process().memory_info().rss - rss}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("--experts", type=int, default=3000, help="experts kept (the store's, copied again if fewer)")
    args = parser.parse_args()
    print(json.dumps(fill(args.store, args.experts)))


if __name__ == "__main__":
    main()
