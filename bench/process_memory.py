"""nightshift's own memory beside its experts, part by part (issue [22]): where a streamed process's RSS goes.

    .venv/bin/python -m bench.process_memory STORE [--budget 47M | --in-ram] [--prompt-tokens 64] [--tokens 8] [--mlx-cache MIB]

At a "same total memory" comparison every byte the process holds that is not an expert is a byte a page-cache
peer spends on experts, so this takes one process through its stages and prints, at each, the resident set
(VmRSS, its peak VmHWM) and MLX's own figures (active: held by live arrays; peak), then splits the decoding
process into parts:

- interpreter: Python, nightshift's engine and MLX imported (and which heavy libraries came with them);
- trunk: MLX memory after the store is opened (the trunk file is read into MLX arrays);
- held by MLX beyond the trunk: MLX's live arrays after decoding, less the trunk (the expert cache's arrays, the
  KV cache, resident stacks); the cache's own count (`cache_used`, its budget) is printed beside it;
- decode transient: MLX's peak during decoding above what it holds after (temporaries of one step: stacked
  experts, activations, a float copy of a 16-bit weight that a mixed-dtype product promotes);
- prompt transient: MLX's peak during the prompt pass above what it holds after it (a pass's experts read and not
  kept, stacked, their float32 copies). Where the process's peak RSS came during the prompt (VmHWM after it), the
  parts split that peak: the trunk, what MLX held after the prompt beyond it, the prompt transient, the rest;
- the rest: RSS not held by MLX (tokenizer, reader buffers, thread stacks, allocator arenas); of it, after
  decoding, MLX's buffer cache (freed arrays MLX keeps for reuse) and, on glibc, the heap's free bytes (`mallinfo2`:
  memory freed but not given back, holes the cache's churn leaves) are printed apart, and the resident set after
  decoding is split as the kernel counts it: anonymous memory and file pages (the shared libraries' code and data
  the process touched: MLX, Python, the tokenizer's and numpy's libraries), RssAnon and RssFile on Linux.

`--in-ram` opens the store with every expert held in RAM (`open_model` without streaming) instead of streamed.
`--mlx-cache` sets MLX's buffer cache limit after the store is opened (the limit the open set is printed: the
engine's is engine/moe/load.py `cap_buffer_cache_for`, at least engine/moe/reader.py `RECYCLE_BYTES` where the
reader maps expert tensors), for side-by-side runs of its cost: the decode's time a token, its CPU time and page faults
(minor; from getrusage) and its tokens are printed with the parts, and what a decode step copies a token (the
model's `Instruments`): experts copied into a stack with others, float32 copies of 16-bit expert weights.

Prompt tokens are the store's vocabulary walked in order (content does not matter to memory). Recorded in the run
catalogue (kind `process-memory`).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from itertools import pairwise
from pathlib import Path

MB = 1 << 20
HEAVY = ("transformers", "tokenizers", "jinja2", "torch", "scipy", "pandas", "weasyprint", "textual")


def status(field: str) -> int:
    """A VmRSS / VmHWM figure of this process in bytes, from /proc (Linux); elsewhere psutil (RSS), getrusage (peak)."""
    try:
        with open("/proc/self/status") as lines:
            for line in lines:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    if field == "VmHWM":  # macOS: the peak from getrusage, in bytes there
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    import psutil

    return psutil.Process().memory_info().rss


def malloc_figures() -> dict[str, int]:
    """glibc's own count of its heap (`mallinfo2`, glibc 2.33+): bytes free in it, in use, and mapped apart."""
    import ctypes

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip

    mallinfo2 = getattr(ctypes.CDLL(None), "mallinfo2", None) if sys.platform.startswith("linux") else None
    if mallinfo2 is None:
        return {}
    mallinfo2.restype = Mallinfo2
    info = mallinfo2()
    return {"heap free": info.fordblks, "heap in use": info.uordblks, "mapped": info.hblkhd, "mappings": info.hblks}


def stacked_prompts(model) -> None:
    """Every streaming layer of `model` runs a prompt pass's experts stacked in one call (the code before they ran
    as they land), for the side-by-side run."""
    from nightshift.engine.moe.streaming import StreamingSwitch

    for _, module in model.named_modules():
        if isinstance(module, StreamingSwitch):
            module.per_pair = False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", type=Path, help="a store directory (nightshift model import)")
    parser.add_argument("--budget", default="0", help="expert cache: auto, 0 or a size such as 47M (0)")
    parser.add_argument("--in-ram", action="store_true", help="every expert held in RAM, not streamed (no --budget)")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="prompt length (64)")
    parser.add_argument("--tokens", type=int, default=8, help="tokens decoded (8)")
    parser.add_argument(
        "--mlx-cache", type=float, default=None, help="MLX's buffer cache limit in MiB, set after open (the engine's)"
    )
    parser.add_argument(
        "--stacked-prompt",
        action="store_true",
        help="a prompt pass's 16-bit experts stacked and run in one call, as before they ran as they land (the A/B)",
    )
    parser.add_argument("--note", default="", help="the run's note in the catalogue (which code an A/B side ran)")
    args = parser.parse_args()
    stages = {"python": status("VmRSS")}

    from nightshift.app.paths import catalogue_file  # nightshift first: it puts a real BLAS in front of MLX's
    from nightshift.engine.errors import NightshiftError
    from nightshift.engine.instruments.catalogue import Catalogue, Run
    from nightshift.engine.instruments.probes import Instruments
    from nightshift.engine.moe.settings import StreamSettings, parse_budget
    from nightshift.engine.runtime import open_model

    stages["imports"] = status("VmRSS")
    import mlx.core as mx  # loaded by the engine already

    heavy = [name for name in HEAVY if name in sys.modules]
    try:
        budget = parse_budget(args.budget)
    except NightshiftError as exc:
        parser.error(str(exc))
    instruments = Instruments()
    stream = None if args.in_ram else StreamSettings(cache_bytes=budget)
    model = open_model(args.store, stream=stream, instruments=instruments)
    open_limit = mx.set_cache_limit(1 << 62)  # read back (a limit raised releases nothing), then set again
    mx.set_cache_limit(open_limit)
    if args.stacked_prompt:
        stacked_prompts(model.model)
    if args.mlx_cache is not None:
        mx.set_cache_limit(int(args.mlx_cache * MB))
    stages["opened"], trunk = status("VmRSS"), mx.get_active_memory()
    mx.reset_peak_memory()
    prompt = list(range(100, 100 + args.prompt_tokens))
    began = time.perf_counter()
    first = next(iter(model.generate_tokens(prompt, max_tokens=1)))
    prefill_s = time.perf_counter() - began
    stages["prefilled"], prefill_peak, prefill_active = status("VmRSS"), mx.get_peak_memory(), mx.get_active_memory()
    prompt_peak_rss = status("VmHWM")
    mx.reset_peak_memory()
    counted, usage, began = instruments.counts(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    tokens, by_token = [], [usage.ru_minflt]  # page faults (minor) after each token: the first ones differ
    for chunk in model.generate_tokens([prompt[-1]], max_tokens=args.tokens):
        tokens.append(chunk.token)
        by_token.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
    decode_s = time.perf_counter() - began
    copies = {k: (v - counted[k]) / len(tokens) for k, v in instruments.counts().items()}
    after = resource.getrusage(resource.RUSAGE_SELF)
    faults = after.ru_minflt - usage.ru_minflt
    faults_by_token = [b - a for a, b in pairwise(by_token)]
    cpu_s = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    figures = model.figures(settled=True)
    stages["decoded"], decode_peak, active = status("VmRSS"), mx.get_peak_memory(), mx.get_active_memory()
    peak_rss = status("VmHWM")
    mlx_cache, malloc = mx.get_cache_memory(), malloc_figures()
    kinds = {"anonymous": status("RssAnon"), "files": status("RssFile")} if sys.platform.startswith("linux") else {}
    model.close()

    parts = {
        "interpreter": stages["imports"],
        "trunk": trunk,
        "held by MLX beyond the trunk": max(active - trunk, 0),
        "decode transient": max(decode_peak - active, 0),
    }
    parts["the rest"] = max(peak_rss - sum(parts.values()), 0)
    prompt_parts = {
        "trunk": trunk,
        "held by MLX beyond the trunk": max(prefill_active - trunk, 0),
        "prompt transient": max(prefill_peak - prefill_active, 0),
    }
    prompt_parts["the rest"] = max(prompt_peak_rss - sum(prompt_parts.values()) - stages["imports"], 0)
    held = "every expert in RAM" if args.in_ram else f"budget {args.budget}"
    print(f"{args.store.name}: {held}, {args.prompt_tokens}-token prompt, {args.tokens} tokens; MLX's buffer cache "
          f"limit after open {open_limit / MB:.0f} MiB")  # fmt: skip
    print("RSS at each stage (MB): " + ", ".join(f"{k} {v / MB:.0f}" for k, v in stages.items()))
    print(f"MLX (MB): after open {trunk / MB:.0f}, prefill peak {prefill_peak / MB:.0f}, "
          f"decode peak {decode_peak / MB:.0f}, active at the end {active / MB:.0f}")  # fmt: skip
    print(f"heavy libraries imported: {', '.join(heavy) or 'none'}")
    print(f"prompt pass ({'stacked' if args.stacked_prompt else 'as the experts land'}): {prefill_s:.2f} s to the "
          f"first token ({first.token}); peak RSS by its end {prompt_peak_rss / MB:.0f} MB, of which beyond the "
          "interpreter: " + ", ".join(f"{k} {v / MB:.0f}" for k, v in prompt_parts.items()) + " MB")  # fmt: skip
    print(f"decode: {len(tokens)} tokens in {decode_s:.2f} s ({len(tokens) / decode_s:.3f} tok/s), "
          f"CPU {cpu_s / len(tokens):.3f} s a token, {faults / len(tokens):.0f} page faults a token; tokens {tokens}")  # fmt: skip
    print(f"page faults token by token: {faults_by_token}")
    print(f"a decode step's copies a token: {copies['stacked_experts']:.0f} experts stacked, "
          f"{copies['float32_copy_bytes'] / MB:.0f} MB of float32 copies of 16-bit experts")  # fmt: skip
    print(f"expert cache: {figures.cache_used / MB:.0f} MB held of a {figures.cache_budget / MB:.0f} MB budget")
    print(f"peak RSS {peak_rss / MB:.0f} MB, of which:")
    for name, value in parts.items():
        print(f"  {name:<20}{value / MB:>7.0f} MB")
    print(f"  of the rest, after decoding: MLX's buffer cache {mlx_cache / MB:.0f} MB"
          + (f", malloc's free heap {malloc['heap free'] / MB:.0f} MB ({malloc['mappings']} mappings, "
             f"{malloc['mapped'] / MB:.0f} MB mapped apart)" if malloc else ""))  # fmt: skip
    if kinds:
        print("RSS after decoding, by kind: " + ", ".join(f"{k} {v / MB:.0f} MB" for k, v in kinds.items()))
    figures_out = {"stages_mb": {k: round(v / MB, 1) for k, v in stages.items()},
                   "cache_used_mb": round(figures.cache_used / MB, 1), "parts_mb": {k: round(v / MB, 1) for k, v in parts.items()}, "peak_rss_mb": round(peak_rss / MB, 1),
                   "mlx_mb": {"opened": round(trunk / MB, 1), "prefill_peak": round(prefill_peak / MB, 1),
                              "prefill_active": round(prefill_active / MB, 1),
                              "decode_peak": round(decode_peak / MB, 1), "active_end": round(active / MB, 1)},
                   "mlx_cache_mb": round(mlx_cache / MB, 1), "prefill_s": round(prefill_s, 3), "first_token": first.token,
                   "decode_s": round(decode_s, 3), "tok_s": round(len(tokens) / decode_s, 4), "tokens": tokens,
                   "faults_per_token": round(faults / len(tokens)), "faults_by_token": faults_by_token,
                   "cpu_s_per_token": round(cpu_s / len(tokens), 4),
                   "stacked_experts_per_token": round(copies["stacked_experts"], 1),
                   "float32_copy_mb_per_token": round(copies["float32_copy_bytes"] / MB, 1),
                   "prompt_peak_rss_mb": round(prompt_peak_rss / MB, 1),
                   "prompt_parts_mb": {k: round(v / MB, 1) for k, v in prompt_parts.items()},
                   "malloc": {k: v if k == "mappings" else round(v / MB, 1) for k, v in malloc.items()},
                   "heavy_imports": heavy, "rss_kinds_mb": {k: round(v / MB, 1) for k, v in kinds.items()}, "cache_budget_mb": round(figures.cache_budget / MB, 1),
                   "mlx_cache_limit_mb": round(open_limit / MB, 1)}  # fmt: skip
    config = {"store": str(args.store), "budget": "in RAM" if args.in_ram else args.budget, "prompt_tokens": args.prompt_tokens,
              "tokens": args.tokens, "stacked_prompt": args.stacked_prompt, "mlx_cache_mib": args.mlx_cache}  # fmt: skip
    run_id = Catalogue(catalogue_file()).record(
        Run(
            "process-memory",
            args.store.name,
            config,
            figures_out,
            "pass",
            command=f"{sys.executable} " + " ".join(sys.argv),
            note=args.note,
        )
    )
    print(json.dumps(figures_out))
    print(f"recorded as run {run_id} in {catalogue_file()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
