"""Does Textual's one-shot `set_timer` drop its callback when the UI thread runs late? (the freeze of issue [24])

    .venv/bin/python bench/timer_drop.py [--busy 2] [--delay 0.001] [--seconds 120]

Chains one-shot timers, each callback arming the next (as the dashboard's refresh loop once did), with
`--busy` threads spinning in Python beside the event loop (as a model running in the dashboard's process
does), and beside it a repeating `set_interval` timer (what the dashboard uses now). Prints how many of each
fired before the chain stopped (two seconds without a callback) or `--seconds` passed. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time

from textual.app import App


class Chain(App):
    def __init__(self, delay: float, seconds: float):
        super().__init__()
        self.delay, self.until = delay, time.monotonic() + seconds
        self.chained = self.repeated = 0
        self.stopped = False
        self.last = time.monotonic()

    def on_mount(self) -> None:
        self.set_timer(self.delay, self.tick)
        self.set_interval(self.delay, self.repeat)
        self.set_interval(0.5, self.check)

    def tick(self) -> None:
        self.chained += 1
        self.last = time.monotonic()
        self.set_timer(self.delay, self.tick)

    def repeat(self) -> None:
        self.repeated += 1

    def check(self) -> None:
        self.stopped = time.monotonic() - self.last > 2.0
        if self.stopped or time.monotonic() > self.until:
            self.exit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="threads spinning in Python beside the loop")
    parser.add_argument("--delay", type=float, default=0.001, help="each timer's delay (the old loop's least)")
    parser.add_argument("--seconds", type=float, default=120.0, help="give up waiting for the chain to stop after")
    args = parser.parse_args()
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    for _ in range(args.busy):
        threading.Thread(target=spin, daemon=True).start()

    async def run() -> Chain:
        app = Chain(args.delay, args.seconds)
        async with app.run_test():
            while app.is_running:
                await asyncio.sleep(0.2)
        return app

    started = time.monotonic()
    app = asyncio.run(run())
    stop.set()
    figures = {"busy_threads": args.busy, "delay_s": args.delay, "one_shot_chain_fired": app.chained,
               "chain_stopped": app.stopped, "interval_fired": app.repeated,
               "seconds": round(time.monotonic() - started, 1), "load_average": os.getloadavg()[0]}  # fmt: skip
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
