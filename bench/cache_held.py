"""What the expert cache holds in RAM per expert, measured: MLX's active memory and the process's RSS after
filling an `ExpertCache` with experts decoded as the reader decodes them, beside what the cache counts.

    .venv/bin/python -m bench.cache_held STORE [--experts 3000]

The store's expert files, layer by layer (round again with new copies if it has fewer), each read whole, copied
out of an aligned buffer by `decode`, viewed in their dtypes (`as_stored`) and kept under its own key, counted by
`held_bytes`. Prints one JSON line; run it in a fresh process (its RSS grows by what it keeps).
tests/test_cache_memory.py runs it on padded stores.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
import psutil

import nightshift.engine  # noqa: F401  (before mlx.core: its BLAS first)
from nightshift.engine.moe.cache import ExpertCache
from nightshift.engine.moe.held import held_bytes
from nightshift.engine.moe.reads import as_stored, decode
from nightshift.engine.store.manifest import read_manifest


def fill(store: Path, experts: int) -> dict:
    """Fill a cache with `experts` decoded experts of `store`; what it counted, and the memory they took."""
    manifest = read_manifest(store)
    specs = [(spec, e) for spec in manifest.layers for e in range(spec.num_experts)]
    buffer = bytearray(max(spec.file_bytes for spec in manifest.layers))
    cache: ExpertCache[dict] = ExpertCache(1 << 62)
    mx.eval(mx.zeros(1))
    rss, active = psutil.Process().memory_info().rss, mx.get_active_memory()
    counted_files = tensor_bytes = tensors = 0
    for n in range(experts):
        spec, expert = specs[n % len(specs)]
        with open(manifest.replica_paths(spec.layer, expert)[0][1], "rb") as f:
            f.readinto(memoryview(buffer)[: spec.file_bytes])
        held = as_stored(decode(buffer, spec), spec)
        mx.eval(held)
        cache.put((n, expert), held, held_bytes(spec))
        counted_files += spec.file_bytes
        tensor_bytes += sum(slot.nbytes for slot in spec.tensors)
        tensors += len(spec.tensors)
    return {"experts": len(cache), "counted": cache.used, "file_bytes": counted_files, "tensor_bytes": tensor_bytes,
            "tensors": tensors, "active": mx.get_active_memory() - active,
            "rss": psutil.Process().memory_info().rss - rss}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("--experts", type=int, default=3000, help="experts kept (the store's, copied again if fewer)")
    args = parser.parse_args()
    print(json.dumps(fill(args.store, args.experts)))


if __name__ == "__main__":
    main()
