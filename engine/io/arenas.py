"""Two glibc malloc arenas for a process that streams experts, so that RAM stays with the expert cache.

glibc gives threads that allocate at once arenas of their own (up to 8 per core). Expert buffers are allocated
on the stream's reader threads and freed on whichever thread evicts them from the cache; memory freed into one
arena is not reused by the others. Measured on a store larger than RAM with a full 2 GiB cache (docs/results.md,
[22], runs 11 and 12, side by side): the process's memory beside the cache grew 27 MB per token by default and
3.7 MB per token with two arenas, at the same speed and with the same tokens. A `MALLOC_ARENA_MAX` the user set
is left to rule; other C libraries (macOS's, musl) have no such arenas and are left alone.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
ARENAS = 2


def cap_malloc_arenas() -> bool:
    """Cap glibc's arenas at ARENAS for the threads that start from now on; whether the cap was set here."""
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    return mallopt is not None and mallopt(M_ARENA_MAX, ARENAS) == 1
