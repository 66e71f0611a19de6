"""A machine with Python alone. The BLAS under MLX's float matmuls on Linux: the system's OpenBLAS, else the
wheel's, else the bundled one with one line saying why; each in a fresh process (it must load before MLX),
some with Debian's OpenBLAS hidden (bench/without_system_blas.sh, a mount namespace). Without Pango, which
pip cannot bring, a report fails saying what to install."""

from __future__ import annotations

import ctypes.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from nightshift.engine.cpu_blas import BUNDLED, system_candidates, wheel_library
from tests.helpers.service import user_schedule

HIDE = Path(__file__).parents[1] / "bench" / "without_system_blas.sh"

# What MLX computes with the BLAS it got: a float32 GEMM (BLAS) and an inverse (LAPACK), against numpy in float64.
PROBE = """
import json
from nightshift.engine import cpu_blas
import mlx.core as mx, numpy as np
rng = np.random.default_rng(0)
a, b = rng.standard_normal((257, 129), dtype=np.float32), rng.standard_normal((129, 65), dtype=np.float32)
product = np.array(mx.matmul(mx.array(a), mx.array(b), stream=mx.cpu))
m = rng.standard_normal((64, 64), dtype=np.float32) + 8 * np.eye(64, dtype=np.float32)
inverse = np.array(mx.linalg.inv(mx.array(m), stream=mx.cpu))
print(json.dumps({"blas": cpu_blas.BLAS_IN_USE, "slow": cpu_blas.SLOW_BLAS,
                  "matmul_error": float(np.abs(product - a.astype(np.float64) @ b).max()),
                  "inverse_error": float(np.abs(inverse.astype(np.float64) @ m - np.eye(64)).max())}))
"""


def _hiding_unavailable() -> str | None:
    if not sys.platform.startswith("linux"):
        return "mount namespaces are Linux's"
    result = subprocess.run(["bash", str(HIDE), "true"], capture_output=True, text=True)
    return None if result.returncode == 0 else f"no mount namespace here: {result.stderr.strip()[-200:]}"


HIDING_UNAVAILABLE = _hiding_unavailable()
needs_hiding = pytest.mark.skipif(HIDING_UNAVAILABLE is not None, reason=str(HIDING_UNAVAILABLE))
needs_wheel = pytest.mark.skipif(
    wheel_library() is None, reason="ngsolve-openblas is a dependency on Linux x86_64 only, not installed here"
)


def _env(blas: str | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "NIGHTSHIFT_BLAS"}
    return env if blas is None else {**env, "NIGHTSHIFT_BLAS": blas}


def probe(blas: str | None = None, hidden: bool = False) -> dict:
    """The BLAS a fresh process got and how far its results are from numpy's; checks they are right."""
    command = [sys.executable, "-c", PROBE]
    result = subprocess.run(
        ["bash", str(HIDE), *command] if hidden else command, capture_output=True, text=True, env=_env(blas)
    )
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.splitlines()[-1])
    assert got["matmul_error"] < 1e-3 and got["inverse_error"] < 1e-4, got
    return got


def test_bundled_blas_can_be_kept():
    got = probe(BUNDLED)
    assert (got["blas"], got["slow"]) == (BUNDLED, "")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the OpenBLAS route is for Linux")
def test_system_openblas_is_preferred_when_present():
    present = [c for c in system_candidates() if os.path.exists(c)]
    if not present:
        pytest.skip("no system OpenBLAS (Debian: libopenblas0-pthread)")
    got = probe()
    assert (got["blas"], got["slow"]) == (present[0], "")


@needs_wheel
def test_the_wheel_openblas_on_request():
    got = probe("wheel")
    assert (got["blas"], got["slow"]) == (str(wheel_library()), "")


@needs_wheel
@needs_hiding
def test_without_the_debian_packages_the_wheel_openblas_is_used():
    """No system OpenBLAS and no system libgfortran: the wheel's OpenBLAS runs on mlx[cpu]'s Fortran runtime."""
    got = probe(hidden=True)
    assert (got["blas"], got["slow"]) == (str(wheel_library()), "")


@needs_hiding
def test_without_any_openblas_one_line_says_why_and_what_to_install():
    got = probe("system", hidden=True)  # only the system's may load, and it is hidden
    assert got["blas"] == BUNDLED
    assert got["slow"].startswith("slow: no OpenBLAS could be loaded (system: none installed)")
    assert "apt install libopenblas0-pthread" in got["slow"] and "\n" not in got["slow"]
    assert ("pip install ngsolve-openblas" in got["slow"]) == (platform.machine() == "x86_64")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the OpenBLAS route is for Linux")
def test_an_unknown_blas_choice_keeps_the_bundled_one_and_says_so():
    got = probe("openblas")
    assert got["blas"] == BUNDLED
    assert got["slow"] == "slow: NIGHTSHIFT_BLAS='openblas' is not one of system, wheel, bundled; set one or unset it"


@pytest.mark.slow
@needs_hiding
def test_a_review_without_any_openblas_says_so_once_as_the_model_starts(home, tiny_model):
    user_schedule(home, tiny_model)
    command = [sys.executable, "-m", "nightshift.app.cli", "review", "run", "tiny"]
    env = {**_env("system"), "NIGHTSHIFT_HOME": str(home)}
    result = subprocess.run(["bash", str(HIDE), *command], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    lines = [line.removeprefix("nightshift: ") for line in result.stderr.splitlines()]
    slow = [i for i, line in enumerate(lines) if line.startswith("slow: ")]
    narrative = next(i for i, line in enumerate(lines) if line.endswith("writing the narrative"))
    written = next(i for i, line in enumerate(lines) if "tokens written" in line)
    assert len(slow) == 1 and narrative < slow[0] < written, lines


@needs_hiding
def test_without_pango_the_pdf_fails_saying_what_to_install(tmp_path):
    pango = Path(ctypes.util.find_library("pango-1.0") or "/nonexistent").name
    found = [p for p in Path("/usr/lib", f"{platform.machine()}-linux-gnu").glob(f"{pango}*") if not p.is_symlink()]
    if not found:
        pytest.skip("no system Pango to hide")
    write = f"from nightshift.app.review.report import write_pdf; write_pdf('<p>x</p>', {str(tmp_path / 'r.pdf')!r})"
    hide = f'mount --bind /dev/null {found[0]} && exec "$@"'
    command = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "bash",
        "-c",
        hide,
        "hide",
        sys.executable,
        "-c",
        write,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 1 and not list(tmp_path.iterdir())
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "ReviewError: cannot lay out the PDF: WeasyPrint needs the Pango library (cannot load library "
            "'libpango-1.0-0'); install it (Debian/Ubuntu: apt install libpango-1.0-0 libpangoft2-1.0-0; "
            "Fedora: dnf install pango)"
        )
    )
