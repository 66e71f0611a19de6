"""Start-up time of the light `nightshift` commands (docs/results.md); printed, never asserted.

    .venv/bin/python bench/startup.py [--runs 20] [--json startup.json]

Each command runs as users run it (the `nightshift` console script beside this Python) in fresh
processes, with NIGHTSHIFT_HOME at an empty directory and at the data dir in use (the one with the
default model prepared). The table gives the median and the fastest wall time over --runs runs, after
one warm-up run, and the median CPU time (user + system), which other work on a busy machine inflates
less than wall time. `python -c pass` is the floor any command pays.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nightshift.app.paths import data_dir

COMMANDS = [["--help"], ["review", "list"], ["jobs"], ["reports", "list"]]


def nightshift() -> list[str]:
    """The console script installed with this Python, else the module (an uninstalled checkout)."""
    script = Path(sys.executable).with_name("nightshift")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "nightshift.app.cli"]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_runs(command: list[str], home: Path, runs: int) -> tuple[list[float], list[float]]:
    """(wall, CPU) seconds of `runs` runs of `command` after a warm-up run; a command that fails stops the benchmark."""
    env = {**os.environ, "NIGHTSHIFT_HOME": str(home)}
    wall, cpu = [], []
    for _ in range(runs + 1):
        start, start_cpu = time.perf_counter(), _children_cpu()
        result = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        wall.append(time.perf_counter() - start)
        cpu.append(_children_cpu() - start_cpu)
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr}")
    return wall[1:], cpu[1:]


def measure(runs: int, homes: dict[str, Path]) -> list[dict]:
    """One row per home and command: median and fastest wall seconds, median CPU seconds, and every run's."""
    rows = []
    for label, home in homes.items():
        for args in [None, *COMMANDS]:
            command = [sys.executable, "-c", "pass"] if args is None else [*nightshift(), *args]
            wall, cpu = timed_runs(command, home, runs)
            rows.append({
                "command": "python -c pass" if args is None else " ".join(["nightshift", *args]),
                "home": label,
                "median_s": statistics.median(wall),
                "min_s": min(wall),
                "cpu_median_s": statistics.median(cpu),
                "wall_s": wall,
                "cpu_s": cpu,
            })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per command and home (20)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nightshift-startup-") as empty:
        rows = measure(args.runs, {"empty": Path(empty), str(data_dir()): data_dir()})
    print(f"{'command':<24} {'home':<36} {'median s':>9} {'min s':>7} {'CPU s':>7}")
    for row in rows:
        print(
            f"{row['command']:<24} {row['home']:<36} {row['median_s']:>9.3f} {row['min_s']:>7.3f} "
            f"{row['cpu_median_s']:>7.3f}"
        )
    if args.json:
        machine = {"python": platform.python_version(), "cpus": os.cpu_count(), "load_average": os.getloadavg()}
        args.json.write_text(json.dumps({"machine": machine, "runs": args.runs, "results": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
