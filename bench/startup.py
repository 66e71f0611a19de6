"""Start-up time of the light `nightshift` commands (docs/results.md); printed, never asserted.

    .venv/bin/python -m bench.startup [--runs 20] [--json startup.json] [--against REV]

Each command runs as users run it (the `nightshift` console script beside this Python) in fresh
processes, with NIGHTSHIFT_HOME at an empty directory and at the data dir in use (the one with the
default model prepared). The table gives the median and the fastest wall time over --runs runs, after
one warm-up run, and the median CPU time (user + system), which other work on a busy machine inflates
less than wall time. `python -c pass` is the floor any command pays.

`--against REV` instead times this checkout and the code at git revision REV side by side, taking turns
(empty data dir): each imported as `nightshift` from a tree of links to its folders (as the install maps
them), `nightshift.app.cli.main` run with the command's arguments. The ratio is the figure.
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
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

from nightshift.app.paths import data_dir

COMMANDS = [["--help"], ["review", "list"], ["jobs"], ["reports", "list"]]
REPOSITORY = Path(__file__).resolve().parents[1]
FOLDERS = ("app", "engine", "templates", "schedules")  # mapped to nightshift.<folder> by pyproject.toml
RUN_CLI = "import sys\nfrom nightshift.app.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass"


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


def package_tree(checkout: Path, tree: Path) -> Path:
    """A directory holding `nightshift/` whose subpackages are links to `checkout`'s folders: PYTHONPATH for it."""
    (tree / "nightshift").mkdir(parents=True)
    (tree / "nightshift" / "__init__.py").touch()
    for folder in FOLDERS:
        (tree / "nightshift" / folder).symlink_to(checkout / folder)
    return tree


def against(revision: str, runs: int) -> list[dict]:
    """This checkout and `revision`, each command's runs taking turns; one row per command and version."""
    with tempfile.TemporaryDirectory(prefix="nightshift-startup-") as scratch:
        old = Path(scratch) / "old"
        archive = subprocess.run(["git", "-C", str(REPOSITORY), "archive", revision], capture_output=True, check=True)
        with tarfile.open(fileobj=BytesIO(archive.stdout)) as files:
            files.extractall(old, filter="data")
        trees = {"this checkout": package_tree(REPOSITORY, Path(scratch) / "new"),
                 revision: package_tree(old, Path(scratch) / "old-tree")}  # fmt: skip
        home = Path(scratch) / "home"
        rows = []
        for args in COMMANDS:
            times: dict[str, list[tuple[float, float]]] = {label: [] for label in trees}
            for turn in range(runs + 1):  # the first turn warms up
                for label in list(trees)[:: 1 if turn % 2 else -1]:
                    env = {**os.environ, "PYTHONPATH": str(trees[label]), "NIGHTSHIFT_HOME": str(home)}
                    start, start_cpu = time.perf_counter(), _children_cpu()
                    result = subprocess.run([sys.executable, "-c", RUN_CLI, *args], env=env, capture_output=True,
                                            stdin=subprocess.DEVNULL, text=True)  # fmt: skip
                    if result.returncode != 0:
                        raise SystemExit(f"{label}: nightshift {' '.join(args)} failed:\n{result.stderr}")
                    if turn:
                        times[label].append((time.perf_counter() - start, _children_cpu() - start_cpu))
            for label, pairs in times.items():
                rows.append({"command": " ".join(["nightshift", *args]), "version": label,
                             "median_s": statistics.median(w for w, _ in pairs),
                             "cpu_median_s": statistics.median(c for _, c in pairs)})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per command and home (20)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--against", metavar="REV", help="time this checkout and git revision REV side by side")
    args = parser.parse_args()
    if args.against:
        rows = against(args.against, args.runs)
        print(f"{'command':<24} {'version':<16} {'median s':>9} {'CPU s':>7} {'x of REV':>9}")
        for row, base in zip(rows[::2], rows[1::2]):
            for r in (row, base):
                print(f"{r['command']:<24} {r['version']:<16} {r['median_s']:>9.3f} {r['cpu_median_s']:>7.3f} "
                      f"{r['median_s'] / base['median_s']:>8.2f}x")  # fmt: skip
    else:
        with tempfile.TemporaryDirectory(prefix="nightshift-startup-") as empty:
            rows = measure(args.runs, {"empty": Path(empty), str(data_dir()): data_dir()})
        print(f"{'command':<24} {'home':<36} {'median s':>9} {'min s':>7} {'CPU s':>7}")
        for row in rows:
            print(f"{row['command']:<24} {row['home']:<36} {row['median_s']:>9.3f} {row['min_s']:>7.3f} "
                  f"{row['cpu_median_s']:>7.3f}")  # fmt: skip
    if args.json:
        machine = {"python": platform.python_version(), "cpus": os.cpu_count(), "load_average": os.getloadavg()}
        figures = {"machine": machine, "runs": args.runs, "against": args.against, "results": rows}
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
