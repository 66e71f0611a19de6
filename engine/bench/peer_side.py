"""One side of `nightshift bench peer`: a process that loads a model, warms up, waits, then times a greedy decode.

`bench peer` starts each side inside a memory cgroup of its own (and, on the rig, inside the rig's read
throttle) and talks to it in JSON lines:

    side -> {"event": "ready", "held": BYTES}     warmed up, the timed prompt read, its first token out;
                                                  `held`: expert bytes it keeps in RAM now
    bench -> "go"                                 once the cgroup's limit is set (what it needs + the budget)
    side -> {"event": "done", ...}                the timed decode: tokens, s/token, and where the time went

The limit is set after the prompt, at the first token, because reading a prompt takes memory a decode does not
(nightshift dequantizes the prompt's experts for one GEMM each) and the decode is what is compared. Where the
time went is measured the same way on every side, over the timed decode only (from "go" to the last token): wall time, CPU time of the whole process (all threads), bytes the process read from storage
(/proc/self/io `read_bytes`: direct reads and page-cache misses alike, mmap faults included) and major page
faults. Each side adds its own figures (nightshift: what the stream waited for, the cache's hit rate).

    PYTHON peer_side.py llama GGUF CONFIG_JSON        (run by path: any interpreter with llama-cpp-python)
    python -m nightshift.engine.bench.peer_side nightshift STORE CONFIG_JSON
    python -m nightshift.engine.bench.peer_side in-ram STORE CONFIG_JSON

Nothing of nightshift is imported at module level: the llama side runs in the interpreter that has
llama-cpp-python (NIGHTSHIFT_LLAMA_CPP_PYTHON), outside nightshift's environment.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

MLX_BUFFER_CACHE = 16 << 20  # freed buffers MLX may keep (nightshift side)


def read_bytes() -> int:
    """Bytes this process has caused to be read from storage (page-cache hits not counted)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


class Window:
    """The process's wall time, CPU time, storage reads and major faults between `start()` and `stop()`."""

    def start(self) -> None:
        self.began = time.perf_counter()
        self._counters = (resource.getrusage(resource.RUSAGE_SELF), read_bytes())

    def stop(self) -> dict:
        wall = self.began
        usage, read = self._counters
        now = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "wall_s": time.perf_counter() - wall,
            "cpu_s": now.ru_utime + now.ru_stime - usage.ru_utime - usage.ru_stime,
            "read_bytes": read_bytes() - read,
            "major_faults": now.ru_majflt - usage.ru_majflt,
        }


def say(event: str, **figures) -> None:
    print(json.dumps({"event": event, **figures}), flush=True)


def ready(held: int, window: Window) -> None:
    """Report the prompt read, wait for the bench to set the memory limit and say go, then open the window."""
    say("ready", held=held)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("bench peer did not say go")
    window.start()


def llama(gguf: str, config: dict) -> None:
    """llama.cpp through llama-cpp-python, the model read through mmap (its default)."""
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(
        model_path=gguf, n_ctx=len(config["prompt"]) + config["tokens"] + 8, n_threads=config["threads"],
        n_threads_batch=config["threads"], use_mmap=True, verbose=False, seed=0,
        logits_all=True,  # without it llama-cpp-python 0.3.36 leaves `scores` at zero: every greedy token 0
    )  # fmt: skip

    def greedy(prompt: list[int], steps: int, at_first_token=None) -> tuple[list[int], list[float]]:
        llm.reset()
        llm.eval(prompt)
        tokens, stamps = [], []
        for _ in range(steps):
            tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            stamps.append(time.perf_counter())
            if len(tokens) == 1 and at_first_token is not None:
                at_first_token()
            if len(tokens) < steps:
                llm.eval([tokens[-1]])
        return tokens, stamps

    greedy(config["warmup_prompt"], config["warmup"] + 1)
    window = Window()
    tokens, stamps = greedy(config["prompt"], config["tokens"] + 1, lambda: ready(0, window))
    measured = window.stop()
    say("done", tokens=tokens, s_per_token=(stamps[-1] - window.began) / config["tokens"], **measured)


def nightshift(store: str, config: dict) -> None:
    """nightshift streaming the store's experts, its cache held to the budget.

    MLX keeps freed buffers for reuse with no regard to a cgroup's limit (32 MB on CPU, most of the RAM on a
    GPU; a streamed model holds it to its working set at most), so a process held to a limit grows past what
    it measured at "ready" and is killed; `MLX_BUFFER_CACHE`, set first, is the lower bound the model keeps.
    """
    import mlx.core as mx

    from nightshift.engine.bench.decode import streamed_decode
    from nightshift.engine.io.drives import load_drives
    from nightshift.engine.moe.settings import StreamSettings

    mx.set_cache_limit(MLX_BUFFER_CACHE)
    drives = load_drives(Path(config["drives"])) if config.get("drives") else None
    window, streams, asked = Window(), [], []

    def at_first_token() -> None:
        asked.append(time.perf_counter())
        ready(streams[0].figures().cache_used, window)

    run = streamed_decode(
        Path(store), StreamSettings(**config["settings"]), config["tokens"], drives, prompt=config["prompt"],
        warmup=config["warmup"], warmup_prompt=config["warmup_prompt"], after_warmup=streams.append,
        at_first_token=at_first_token,
    )  # fmt: skip
    measured = window.stop()  # the stream's close (joining its readers) included: milliseconds
    decode_s = run.timing.seconds_per_token * config["tokens"] - (window.began - asked[0])  # less the handshake
    f = run.figures
    say(
        "done", tokens=run.timing.tokens, s_per_token=decode_s / config["tokens"], **measured,
        stream_read_bytes=run.read_bytes, wait_s=run.wait_s, cache_hits=f.cache_hits, cache_misses=f.cache_misses,
        cache_used=f.cache_used,
    )  # fmt: skip


def in_ram(store: str, config: dict) -> None:
    """The same store with every expert in RAM, as mlx-lm runs it (the compute floor): no budget can hold it."""
    from nightshift.engine.bench.decode import in_ram_decode

    window = Window()
    timing = in_ram_decode(Path(store), config["tokens"], at_first_token=lambda: ready(0, window))  # no limit set
    measured = window.stop()
    say("done", tokens=timing.tokens, s_per_token=measured["wall_s"] / config["tokens"], **measured)


SIDES = {"llama": llama, "nightshift": nightshift, "in-ram": in_ram}

if __name__ == "__main__":
    side, model, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    SIDES[side](model, config)
