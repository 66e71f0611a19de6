"""What every engine's side process of bench/streaming_peers.py shares: the work it is given and the one line it prints.

A side runs in its engine's own interpreter (a peer's venv, or nightshift's), imported by path from the side script
beside it, so it uses nothing but the standard library. It reads its work as JSON from argv[1]:

    {"model": DIR, "budget": BYTES, "prompt": [ids], "tokens": N, "threads": T, "width": W}

and prints one JSON line: {"tokens": [[ids] per sequence], "prompt_s": first token's time, "decode_s": the rest,
"prompt_read_bytes"/"decode_read_bytes": what the process read from storage over each (/proc/self/io `read_bytes`,
direct reads and page-cache misses alike; loading the model is not counted), "decode_cpu_s": the process's user + system
CPU seconds (every thread) from the first token to the last, "counters": the engine's own}. The bench measures the
whole process besides (peak RSS, its cgroup's peak, its CPU seconds from start to exit).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

IO = Path("/proc/self/io")


def read_bytes() -> int:
    """Bytes this process has had read from storage so far (0 where the kernel does not say: not Linux)."""
    if not IO.exists():
        return 0
    return next(int(line.split()[1]) for line in IO.read_text().splitlines() if line.startswith("read_bytes:"))


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far, all its threads (an engine's worker threads included)."""
    times = os.times()
    return times.user + times.system


def work() -> dict:
    return json.loads(sys.argv[1])


class Clock:
    """Stamps the first token (the prompt read) and the last one: time, bytes read and CPU seconds."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.read = [read_bytes(), 0, 0]  # at the start, the first token, the last
        self.first = 0.0
        self.last = 0.0
        self.cpu = [0.0, 0.0]  # at the first token, the last

    def token(self) -> None:
        now = time.perf_counter()
        if not self.first:
            self.first, self.read[1], self.cpu[0] = now, read_bytes(), cpu_seconds()
        self.last, self.read[2], self.cpu[1] = now, read_bytes(), cpu_seconds()


def report(clock: Clock, tokens: list[list[int]], counters: dict) -> None:
    print(
        json.dumps(
            {
                "tokens": tokens,
                "prompt_s": clock.first - clock.began,
                "decode_s": clock.last - clock.first,
                "prompt_read_bytes": clock.read[1] - clock.read[0],
                "decode_read_bytes": clock.read[2] - clock.read[1],
                "decode_cpu_s": clock.cpu[1] - clock.cpu[0],
                "counters": counters,
            }
        ),
        flush=True,
    )
