"""On Linux, route MLX's float matmuls to the system's OpenBLAS.

The `mlx[cpu]` wheel bundles the reference BLAS (~6 GFLOP/s on GEMM here); Debian's
OpenBLAS does ~200 on the same 2-core Linux machine (and so does numpy). Loading OpenBLAS with RTLD_GLOBAL
before MLX makes the dynamic linker resolve MLX's BLAS symbols to it, in-process,
with no LD_PRELOAD. It must run before anything imports `mlx`, which is why
`engine/__init__.py` runs it just before the first import of `mlx`. `NIGHTSHIFT_BLAS=bundled` keeps the bundled one.
macOS builds of MLX use Accelerate and need nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
from pathlib import Path

BUNDLED = "bundled"


def _candidates() -> list[str]:
    triple = f"{platform.machine()}-linux-gnu"
    found = ctypes.util.find_library("openblas")
    return [str(Path("/usr/lib") / triple / "openblas-pthread" / "libblas.so.3"), *([found] if found else [])]


def load_system_blas() -> str:
    """Load the system OpenBLAS ahead of MLX where that helps; returns which BLAS MLX will use."""
    if not sys.platform.startswith("linux") or os.environ.get("NIGHTSHIFT_BLAS") == BUNDLED:
        return BUNDLED
    if "mlx.core" in sys.modules:  # too late: MLX's symbols are already bound
        return BUNDLED
    for candidate in _candidates():
        try:
            ctypes.CDLL(candidate, mode=os.RTLD_GLOBAL)
        except OSError:
            continue
        return candidate
    return BUNDLED


BLAS_IN_USE = load_system_blas()
