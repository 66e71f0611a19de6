"""On Linux, route MLX's float matmuls to an OpenBLAS instead of the reference BLAS that `mlx[cpu]` bundles.

The reference BLAS does ~2-6 GFLOP/s on a 1024x1024 float32 GEMM on this 2-core machine, OpenBLAS 20-200
(docs/results.md). Loading OpenBLAS with RTLD_GLOBAL before MLX makes the dynamic linker resolve MLX's BLAS
and LAPACK symbols to it, in-process, with no LD_PRELOAD. It must run before anything imports `mlx`, which
is why `engine/__init__.py` runs this module just before the first import of `mlx`.

The first of these that loads is used (`NIGHTSHIFT_BLAS=system|wheel|bundled` picks one):
- the system's OpenBLAS (Debian: libopenblas0-pthread), where there is one: as fast single-threaded, and
  faster on a busy machine, where the wheel's idle threads spin instead of yielding (docs/results.md);
- the OpenBLAS of the `ngsolve-openblas` wheel, a dependency on Linux x86_64, so `pip install` brings it
  (a DYNAMIC_ARCH build with the standard symbol names; the scipy-openblas wheels prefix theirs).
Where none loads, `SLOW_BLAS` is one line saying why and what to install, for the first slow step to show
(else "").
macOS builds of MLX use Accelerate and need nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import os
import platform
import sys
import tempfile
from pathlib import Path

SYSTEM = "system"
WHEEL = "wheel"
BUNDLED = "bundled"
CHOICES = (SYSTEM, WHEEL, BUNDLED)
WHEEL_PACKAGE = "ngsolve_openblas"


def system_candidates() -> list[str]:
    """Where a system OpenBLAS may be, most likely first."""
    triple = f"{platform.machine()}-linux-gnu"
    found = ctypes.util.find_library("openblas")
    return [str(Path("/usr/lib") / triple / "openblas-pthread" / "libblas.so.3"), *([found] if found else [])]


def _load_system() -> str:
    for candidate in system_candidates():
        try:
            ctypes.CDLL(candidate, mode=os.RTLD_GLOBAL)
        except OSError:
            continue
        return candidate
    raise OSError("none installed")


def wheel_library() -> Path | None:
    """The wheel's OpenBLAS, found without importing its package (whose import loads it, printing any failure)."""
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(sorted(Path(spec.submodule_search_locations[0]).glob("libopenblas*.so*"))), None)


def _mlx_runtime() -> list[Path]:
    """The libraries auditwheel put beside mlx[cpu] (its reference BLAS, LAPACK and their Fortran runtime)."""
    try:
        folder = Path(str(importlib.metadata.distribution("mlx-cpu").locate_file("mlx_cpu.libs")))
    except importlib.metadata.PackageNotFoundError:
        return []
    return sorted(folder.glob("lib*.so*"))


def _load_wheel() -> str:
    """Load the wheel's OpenBLAS, which needs libgfortran.so.5, also where the system has none.

    The library looks for libgfortran.so.5 beside itself first (its RPATH is $ORIGIN). A machine with Python
    alone has none, but mlx[cpu] ships one, renamed by auditwheel (libgfortran-<hash>.so.5.0.0, which needs its
    own renamed libquadmath beside it). Links in a temporary folder give them the names the loader looks for;
    once loaded, libraries are found by soname, so the links can go.
    """
    library = wheel_library()
    if library is None:
        raise OSError(f"{WHEEL_PACKAGE} is not installed")
    # Its threads wait for work by spinning (Debian's yield): idle between a prefill's GEMMs, they spun for up to
    # 2^28 cycles and took the cores from the work, prefill 0.4-0.5x Debian's at load ~20; sleeping after 2^4
    # made it as fast as Debian's there (docs/results.md). Read when the library loads; a value set wins.
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    with tempfile.TemporaryDirectory(prefix="nightshift-blas-") as folder:
        links = Path(folder)
        (links / library.name).symlink_to(library)
        for runtime in _mlx_runtime():
            (links / runtime.name).symlink_to(runtime)
            if runtime.name.startswith("libgfortran-") and not (links / "libgfortran.so.5").exists():
                (links / "libgfortran.so.5").symlink_to(runtime)
        ctypes.CDLL(str(links / library.name), mode=os.RTLD_GLOBAL)
    return str(library)


def _slow_note(failures: list[str]) -> str:
    remedy = "install your system's OpenBLAS (Debian: apt install libopenblas0-pthread)"
    if platform.machine() == "x86_64":
        remedy = f"pip install ngsolve-openblas, or {remedy}"
    return (
        f"slow: no OpenBLAS could be loaded ({'; '.join(failures)}), so MLX's float matmuls run on the "
        f"reference BLAS of mlx[cpu], ~20x slower; to fix, {remedy}"
    )


def load_blas() -> tuple[str, str]:
    """Load an OpenBLAS ahead of MLX where that helps: which BLAS MLX will use, and a line saying why it is slow
    ("" when it is not).

    Nothing here raises: this runs inside `import mlx`, wherever that is, and an error would break the import.
    """
    choice = os.environ.get("NIGHTSHIFT_BLAS", "")
    if not sys.platform.startswith("linux") or choice == BUNDLED:
        return BUNDLED, ""
    if choice and choice not in CHOICES:  # said at the first slow step: raised here, it would break every import
        return BUNDLED, f"slow: NIGHTSHIFT_BLAS={choice!r} is not one of {', '.join(CHOICES)}; set one or unset it"
    if "mlx.core" in sys.modules:  # too late: MLX's symbols are already bound
        return BUNDLED, "slow: MLX was imported before nightshift.engine, so it keeps its reference BLAS"
    loaders = {SYSTEM: _load_system, WHEEL: _load_wheel}
    failures = []
    for name in [choice] if choice else [SYSTEM, WHEEL]:
        try:
            return loaders[name](), ""
        except OSError as error:
            failures.append(f"{name}: {error}")
    return BUNDLED, _slow_note(failures)


BLAS_IN_USE, SLOW_BLAS = load_blas()
