"""A float32 1024x1024 matmul through the engine with each BLAS it can load, side by side in one run.

    .venv/bin/python -m bench.blas_speed [--sides default hidden system wheel bundled] [--rounds 3]
        [--seconds 2] [--gate 0.5] [--catalogue FILE]

Each side is a fresh process that imports `nightshift.engine` (which loads the BLAS, engine/cpu_blas.py) and
then times `a @ b` on MLX's CPU for --seconds: `default` as installed, `hidden` the same with Debian's OpenBLAS
and libgfortran hidden (bench/without_system_blas.sh, a mount namespace: what a machine with Python alone
has), `system`/`wheel`/`bundled` one BLAS each (NIGHTSHIFT_BLAS). The sides take turns, --rounds times, so
a busy machine slows each alike; the table gives each side's median and best GFLOP/s over all its timings.

With --gate R it is the check CI runs (.ci/run): the run fails (exit 1, verdict "fail") when `hidden` is
slower than R times `default`; where mount namespaces are not available it says so and skips (exit 0).
Recorded in the run catalogue (kind `blas-speed`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZE = 1024
HIDE = [str(Path(__file__).with_name("without_system_blas.sh"))]
SIDES = ("default", "hidden", "system", "wheel", "bundled")


def measure(seconds: float) -> dict:
    """In this process: the BLAS the engine loaded and the GFLOP/s of each matmul timed for `seconds`."""
    from nightshift.engine import cpu_blas  # loads the BLAS, before MLX

    # isort: split
    import mlx.core as mx

    a, b = mx.random.normal((SIZE, SIZE), stream=mx.cpu), mx.random.normal((SIZE, SIZE), stream=mx.cpu)
    mx.eval(mx.matmul(a, b, stream=mx.cpu))  # warm-up: BLAS threads and buffers
    rates: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(rates) < 3:
        start = time.perf_counter()
        mx.eval(mx.matmul(a, b, stream=mx.cpu))
        rates.append(2 * SIZE**3 / (time.perf_counter() - start) / 1e9)
    return {"blas": cpu_blas.BLAS_IN_USE, "gflops": rates}


def run_side(side: str, seconds: float) -> dict:
    env = dict(os.environ)
    env.pop("NIGHTSHIFT_BLAS", None)
    if side in ("system", "wheel", "bundled"):
        env["NIGHTSHIFT_BLAS"] = side
    command = [sys.executable, __file__, "--measure", str(seconds)]
    result = subprocess.run(
        ["bash", *HIDE, *command] if side == "hidden" else command, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"{side}: exited {result.returncode}: {result.stderr.strip()[-500:]}")
    return json.loads(result.stdout.splitlines()[-1])


def namespaces_unavailable() -> str | None:
    """Why the hidden side cannot run here, or None when it can."""
    result = subprocess.run(["bash", *HIDE, "true"], capture_output=True, text=True)
    return None if result.returncode == 0 else (result.stderr.strip().splitlines() or ["unshare failed"])[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=["default", "hidden"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per side and round")
    parser.add_argument("--gate", type=float, default=None, help="fail when hidden < GATE x default")
    parser.add_argument("--catalogue", type=Path, default=None, help="run catalogue (default: the data dir's)")
    parser.add_argument("--measure", type=float, default=None, help=argparse.SUPPRESS)  # one side, in a child
    args = parser.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(args.measure)))
        return
    if args.gate is not None and not {"default", "hidden"} <= set(args.sides):
        parser.error("--gate compares the sides default and hidden; list both")
    if "hidden" in args.sides and (why := namespaces_unavailable()):
        print(f"skipped: the hidden side needs a mount namespace, unavailable here ({why})")
        return
    load = os.getloadavg()
    samples: dict[str, dict] = {side: {"blas": None, "gflops": []} for side in args.sides}
    for _ in range(args.rounds):
        for side in args.sides:
            measured = run_side(side, args.seconds)
            samples[side]["blas"] = measured["blas"]
            samples[side]["gflops"] += measured["gflops"]
    figures = {
        side: {
            "blas": got["blas"],
            "median_gflops": round(statistics.median(got["gflops"]), 2),
            "best_gflops": round(max(got["gflops"]), 2),
            "timings": len(got["gflops"]),
        }
        for side, got in samples.items()
    }
    figures["load_before"], figures["load_after"] = load, os.getloadavg()
    print(f"float32 {SIZE}x{SIZE} matmul through the engine, {args.rounds} rounds x {args.seconds:g} s per side")
    print(f"load average before {load[0]:.2f}, after {figures['load_after'][0]:.2f} (1 min)")
    for side in args.sides:
        row = figures[side]
        print(f"  {side:8s} median {row['median_gflops']:7.1f}  best {row['best_gflops']:7.1f} GFLOP/s  {row['blas']}")
    verdict = "measured"
    if args.gate is not None:
        ratio = figures["hidden"]["median_gflops"] / figures["default"]["median_gflops"]
        figures["hidden_over_default"] = round(ratio, 3)
        verdict = "pass" if ratio >= args.gate else "fail"
        print(f"hidden / default = {ratio:.2f} (gate {args.gate:g}): {verdict}")
    from nightshift.app.paths import catalogue_file
    from nightshift.engine.instruments.catalogue import Catalogue, Run

    config = {"size": SIZE, "sides": args.sides, "rounds": args.rounds, "seconds": args.seconds, "gate": args.gate}
    run = Run("blas-speed", "-", config, figures, verdict, command=" ".join(sys.argv))
    catalogue = Catalogue(args.catalogue or catalogue_file())
    print(f"recorded as run {catalogue.record(run, [])} in {catalogue.path}")
    if verdict == "fail":
        sys.exit(1)


if __name__ == "__main__":
    main()
