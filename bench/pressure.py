"""Memory pressure during a run: another process takes part of the free RAM; the auto cache must give it back.

Runs inside a memory cgroup of its own (v1 or v2, root only) so the experiment cannot starve the machine:
the limit stands for the machine's RAM (`budget.memory_now` reads it, as it reads a container's). The model
is opened with the auto budget and decodes; after `--hog-after` tokens a second process (a child, so in
the same cgroup) takes `--hog-share` of the RAM free at that moment, touches every page, holds it for
`--hog-seconds`, then exits. Per token the figures are logged: the cache's budget and held bytes, the
RAM available, swap in use. The run passes when it completes (no OOM kill: the cgroup's stand-in for
swapping), swap did not grow, the cache shrank while the other process held its RAM, and the tokens
equal an undisturbed run's.

    python -m bench.pressure STORE --catalogue CAT [--limit 4G] [--tokens 24]
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil

from nightshift.engine.moe.budget import memory_now
from nightshift.engine.moe.settings import StreamSettings, parse_budget
from nightshift.engine.rig.cgroups import MemoryGroup

HOG = "import sys, time; b = b'\\x01' * int(sys.argv[1]); time.sleep(float(sys.argv[2]))"


def enter_cgroup(limit: int) -> MemoryGroup:
    """A new memory cgroup limited to `limit` bytes, with this process in it."""
    group = MemoryGroup.create(f"nightshift-pressure-{os.getpid()}", limit)
    group.add(os.getpid())
    return group


def leave_cgroup(group: MemoryGroup) -> None:
    (group.path.parent / "cgroup.procs").write_text(str(os.getpid()))
    group.remove()


def decode(model, prompt: list[int], tokens: int, on_token) -> list[int]:
    out = []
    for chunk in model.generate_tokens(prompt, max_tokens=tokens):
        out.append(chunk.token)
        on_token(len(out), chunk.stats)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("--catalogue", type=Path, required=True)
    parser.add_argument("--limit", type=parse_budget, default=parse_budget("4G"), help="the cgroup's memory limit")
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--hog-after", type=int, default=4, help="tokens decoded before the other process starts")
    parser.add_argument("--hog-share", type=float, default=0.5, help="share of the free RAM it takes")
    parser.add_argument("--hog-seconds", type=float, default=30.0)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)

    group = enter_cgroup(args.limit)
    try:
        from bench.cpu_prefill import TEXT
        from nightshift.engine.instruments.catalogue import Catalogue, Run
        from nightshift.engine.runtime import open_model

        model = open_model(args.store, stream=StreamSettings())
        budget = model.stream.budget
        print(budget.describe(), flush=True)
        prompt = model.tokenizer.encode(TEXT)[:64]
        undisturbed = decode(model, prompt, args.tokens, lambda i, s: None)
        log: list[dict] = []
        hog: list[subprocess.Popen] = []
        swap_before = psutil.swap_memory().used
        began = time.perf_counter()

        def on_token(i: int, stats) -> None:
            memory = memory_now()
            log.append({"token": i, "t": round(time.perf_counter() - began, 2), "budget": stats.cache_budget,
                        "used": stats.cache_used, "available": memory.available,
                        "hog": bool(hog) and hog[0].poll() is None})  # fmt: skip
            print(log[-1], flush=True)
            if i == args.hog_after:
                size = int(memory.available * args.hog_share)
                hog.append(subprocess.Popen([sys.executable, "-c", HOG, str(size), str(args.hog_seconds)]))
                log[-1]["hog_bytes"] = size

        disturbed = decode(model, prompt, args.tokens, on_token)
        hog_rc = hog[0].wait() if hog else None
        model.close()
    finally:
        leave_cgroup(group)
    during = [entry for entry in log if entry["hog"]]
    figures = {
        "limit": args.limit,
        "budget_at_open": budget.bytes,
        "expert_bytes": budget.expert_bytes,
        "hog_bytes": next((e["hog_bytes"] for e in log if "hog_bytes" in e), 0),
        "hog_exit": hog_rc,
        "used_before_hog": log[args.hog_after - 1]["used"],
        "min_budget_during_hog": min((e["budget"] for e in during), default=None),
        "min_used_during_hog": min((e["used"] for e in during), default=None),
        "used_at_end": log[-1]["used"],
        "swap_growth": psutil.swap_memory().used - swap_before,
        "tokens_identical": disturbed == undisturbed,
        "completed": len(disturbed) == args.tokens,
    }
    shrank = figures["min_used_during_hog"] is not None and figures["min_used_during_hog"] < figures["used_before_hog"]
    ok = figures["completed"] and figures["tokens_identical"] and figures["swap_growth"] <= 0 and hog_rc == 0
    verdict = ("pass" if shrank else "no-shrink") if ok else "fail"
    print(figures, verdict)
    run = Run(
        kind="pressure", model=args.store.name, config={"limit": args.limit, "hog_share": args.hog_share,
        "hog_after": args.hog_after, "hog_seconds": args.hog_seconds, "tokens": args.tokens},
        figures={**figures, "log": log}, verdict=verdict,
        command=shlex.join(["python", "-m", "bench.pressure", *argv]),
        note="memory cgroup standing for the machine's RAM; shared machine",
    )  # fmt: skip
    print(f"recorded run {Catalogue(args.catalogue).record(run)} ({verdict})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
