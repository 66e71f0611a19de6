"""glibc malloc settings for a process that streams experts, so that RAM stays with the expert cache.

Arenas: glibc gives threads that allocate at once arenas of their own (up to 8 per core). Expert buffers are
allocated on the stream's reader threads and freed on whichever thread evicts them from the cache; memory freed
into one arena is not reused by the others. Measured on a store larger than RAM with a full 2 GiB cache
(docs/results.md, [22], runs 11 and 12, side by side): the process's memory beside the cache grew 27 MB per token
by default and 3.7 MB per token with two arenas, at the same speed and with the same tokens.

Mappings: below glibc's mmap threshold an expert's tensors come from the heap, where a freed expert leaves a
hole that the step's other allocations split, so the next expert read lands at the heap's top: the heap's free
bytes grow with the churn of reads, and glibc's threshold itself rises (up to 32 MiB) each time a mapped chunk is
freed. With the threshold fixed at the store's expert tensors, each tensor is a mapping of its own, unmapped when
freed. Measured on the padded trained-routing model (docs/results.md, [22] memory section), when the cache still
held each expert's tensors (it holds rows of a slab now, engine/moe/slab.py): peak RSS at a 50 % budget
1 163-1 181 MB by default, 1 040 with the threshold fixed, the same tokens.

Pages: a slab of the expert cache is made at its budget, zero-filled by MLX; its pages are handed back at once
(`discard_pages`), so it takes RAM as its rows are written, as a cache of separate experts did.

Trimming: memory freed on the heap stays the process's (its RSS, a cgroup's usage) until glibc gives its free pages
back, which `trim_heap` asks for when the cache has shrunk, so that what an eviction frees is seen as free.

Settings the user gave glibc (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`, `GLIBC_TUNABLES`) are left to rule;
other C libraries (macOS's, musl) have no such settings and are left alone.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from collections.abc import Iterable

import numpy as np

M_ARENA_MAX = -8  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
ARENAS = 2
MAP_FROM = 64 << 10  # expert tensors smaller than this stay on the heap: a mapping costs a syscall and page faults
MAP_CEILING = 32 << 20  # glibc's largest threshold on 64-bit; larger allocations are always mapped
_threshold: int | None = None  # the threshold set in this process (the lowest asked for)
MADV_DONTNEED = 4  # Linux's madvise advice: the pages' contents dropped, zero-filled on the next touch
PAGE = mmap.PAGESIZE


def _mallopt(param: int, value: int, variable: str, tunable: str) -> bool:
    """glibc's mallopt(param, value), unless not glibc on Linux or the user set `variable` or `tunable`."""
    if not sys.platform.startswith("linux") or variable in os.environ:
        return False
    if tunable in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    return mallopt is not None and mallopt(param, value) == 1


def cap_malloc_arenas() -> bool:
    """Cap glibc's arenas at ARENAS for the threads that start from now on; whether the cap was set here."""
    return _mallopt(M_ARENA_MAX, ARENAS, "MALLOC_ARENA_MAX", "glibc.malloc.arena_max")


def map_expert_tensors(sizes: Iterable[int]) -> int | None:
    """Fix glibc's mmap threshold at the smallest expert tensor of `sizes` (bytes) that is at least MAP_FROM, so
    every such tensor is mapped alone and given back when evicted; the threshold now in force, or None if none
    was set (no tensor that large, the user's setting, not glibc). A later store may lower it, never raise it."""
    global _threshold
    wanted = min((min(size, MAP_CEILING) for size in sizes if size >= MAP_FROM), default=None)
    if wanted is None or (_threshold is not None and _threshold <= wanted):
        return _threshold
    if _mallopt(M_MMAP_THRESHOLD, wanted, "MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold"):
        _threshold = wanted
    return _threshold


def discard_pages(buffer: np.ndarray) -> int:
    """Hand the pages wholly inside `buffer` back to the system (madvise MADV_DONTNEED): memory made ahead of use (a
    slab's rows, zero-filled by MLX) then takes no RSS until written, and reads as zeros. Bytes handed back; 0 where
    not Linux (elsewhere the advice does not promise zeros: nothing is done)."""
    if not sys.platform.startswith("linux"):
        return 0
    start = -(-buffer.ctypes.data // PAGE) * PAGE
    end = (buffer.ctypes.data + buffer.nbytes) // PAGE * PAGE
    if end <= start:
        return 0
    madvise = ctypes.CDLL(None).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return end - start if madvise(start, end - start, MADV_DONTNEED) == 0 else 0


def trim_heap() -> bool:
    """Give the heap's free pages back to the system (glibc's malloc_trim); whether anything was given back. Not
    glibc on Linux: nothing to do."""
    if not sys.platform.startswith("linux"):
        return False
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    return trim is not None and trim(0) == 1
