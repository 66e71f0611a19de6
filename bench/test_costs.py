"""Where the test suite's time goes: every fixture's setup and every test's wall and CPU seconds, per xdist worker.

    NIGHTSHIFT_TEST_COSTS=/tmp/costs .venv/bin/python -m pytest -p bench.test_costs
    .venv/bin/python -m bench.test_costs /tmp/costs [--top 20]

As a pytest plugin (`-p bench.test_costs`) it appends one line per fixture setup longer than 50 ms (name, scope,
wall and this process's CPU seconds, the test it was set up for) and one per test (setup, call and teardown: wall,
this process's CPU, and the CPU of the child processes it waited for: services, CLI commands, pip) to
tab-separated files in the folder NIGHTSHIFT_TEST_COSTS names, one file of each per worker. Run as a module it
prints the sums: module- and session-scoped fixtures by name and module (how often each was built and what it
cost over all workers), and the tests that took the most CPU. The CPU is what a 2-core machine's wall time is
made of when both workers are busy; the wall of a fixture setup also holds its waits (fsync, a lock held by
another worker).
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections import defaultdict
from pathlib import Path

import pytest

FOLDER = "NIGHTSHIFT_TEST_COSTS"
SHORTEST_S = 0.05  # fixture setups shorter than this are not written


def _log(kind: str, fields: list[object]) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(os.environ[FOLDER]) / f"{kind}-{worker}.tsv", "a") as out:
        out.write("\t".join(str(field) for field in fields) + "\n")


def _cpu() -> tuple[float, float]:
    """CPU seconds so far of this process and of its children that were waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if FOLDER in os.environ and wall > SHORTEST_S:
        _log("fixtures", [fixturedef.argname, fixturedef.scope, f"{wall:.2f}", f"{cpu:.2f}", request.node.nodeid])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    wall, (own, children) = time.perf_counter(), _cpu()
    yield
    own_after, children_after = _cpu()
    if FOLDER in os.environ:
        _log("tests", [item.nodeid, f"{time.perf_counter() - wall:.2f}", f"{own_after - own:.2f}",
                       f"{children_after - children:.2f}"])  # fmt: skip


def summary(folder: Path, top: int) -> str:
    """The fixture sums (module and session scope) and the `top` tests by CPU, as plain-text tables."""
    built: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for path in folder.glob("fixtures-*.tsv"):
        for line in path.read_text().splitlines():
            name, scope, wall, cpu, test = line.split("\t")
            if scope in ("module", "session"):
                row = built[(name, test.split("::")[0])]
                row[0], row[1], row[2] = row[0] + 1, row[1] + float(wall), row[2] + float(cpu)
    tests = [line.split("\t") for path in folder.glob("tests-*.tsv") for line in path.read_text().splitlines()]
    lines = ["module/session fixtures: setups, wall s, CPU s (this process), fixture, first module"]
    for (name, module), (count, wall, cpu) in sorted(built.items(), key=lambda item: -item[1][1]):
        lines.append(f"{count:4d} {wall:8.1f} {cpu:8.1f}  {name}  {module}")
    lines.append(f"     {sum(r[1] for r in built.values()):8.1f} {sum(r[2] for r in built.values()):8.1f}  in all")
    lines += ["", f"tests by CPU (own + children), top {top}: wall s, own CPU s, children CPU s, test"]
    for nodeid, wall, own, children in sorted(tests, key=lambda t: -(float(t[2]) + float(t[3])))[:top]:
        lines.append(f"{float(wall):8.1f} {float(own):8.1f} {float(children):8.1f}  {nodeid}")
    totals = [sum(float(t[i]) for t in tests) for i in (1, 2, 3)]
    lines.append(f"{totals[0]:8.1f} {totals[1]:8.1f} {totals[2]:8.1f}  all {len(tests)} tests")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="Sum what the -p bench.test_costs plugin wrote.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    print(summary(args.folder, args.top))


if __name__ == "__main__":
    main()
