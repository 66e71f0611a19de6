"""What every engine's side process of bench/streaming_peers.py shares: the work it is given and the one line it prints.

A side runs in its engine's own interpreter (a peer's venv, or nightshift's), imported by path from the side script
beside it, so it uses nothing but the standard library. It reads its work as JSON from argv[1]:

    {"model": DIR, "budget": BYTES, "prompt": [ids], "tokens": N, "threads": T, "width": W}

and prints one JSON line: {"tokens": [[ids] per sequence], "prompt_s": first token's time, "decode_s": the rest,
"counters": the engine's own}. The bench measures the process itself (peak RSS, bytes read from storage).
"""

from __future__ import annotations

import json
import sys
import time


def work() -> dict:
    return json.loads(sys.argv[1])


class Clock:
    """Stamps the first token (the prompt read) and the last one."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.first = 0.0
        self.last = 0.0

    def token(self) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        self.last = now


def report(clock: Clock, tokens: list[list[int]], counters: dict) -> None:
    print(
        json.dumps(
            {
                "tokens": tokens,
                "prompt_s": clock.first - clock.began,
                "decode_s": clock.last - clock.first,
                "counters": counters,
            }
        ),
        flush=True,
    )
