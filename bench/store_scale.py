"""A store larger than RAM and a size ladder at constant bytes per token ([22]), against mlx-lm's lazy load.

Models are the bench preset (kimi_k3, 12 MoE layers, 16 of N MXFP4 experts of 1.67 MB per token) grown by
`model synth --experts N`: every size reads the same 321 MB per token, so time per token should not grow with
the store. Every timed process runs alone as a child of this script, its RSS sampled every 20 ms (psutil),
inside a memory cgroup (root) that holds it to `--limit` and keeps a failed peer from starving the machine.

    make   --experts N --work DIR: synth (time, peak RSS, MB/s), then `model import` (the same), recorded
    ladder STORE...: nightshift streams each store in turn, the order reversed every round; s/token, peak RSS
    versus STORE SRC: nightshift on STORE against mlx-lm's `load(SRC, lazy=True)` of its source checkpoint,
           alternated; greedy tokens compared; a side killed for memory is reported as such

    python -m bench.store_scale make --experts 1576 --work DIR --catalogue CAT [--drop-source]
    python -m bench.store_scale ladder STORE... --tokens 6 --rounds 2 --budget 0 --limit 6471639304 --catalogue CAT
    python -m bench.store_scale versus STORE SRC --budget 4708380672 --limit 6471639304 --tokens 6 --catalogue CAT

(docs/results.md, "A store larger than RAM": the runs, their limits and what they measured.)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
from tokenizers import Tokenizer

from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.moe.settings import parse_budget
from nightshift.engine.rig.cgroups import MemoryGroup, command_in
from nightshift.engine.store.manifest import read_manifest

# The prompt's unique experts grow with the store (up to 16 per row and layer): a short prompt keeps the first
# token cheap.
PROMPT = "The month-end close"
SAMPLE_S = 0.02
RAM = psutil.virtual_memory().total


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def run_child(argv: list[str], limit: int | None = None) -> dict:
    """Run `argv` in a fresh memory cgroup (held to `limit` bytes if given), sampling its RSS: its last JSON line
    (none if it was killed), its progress lines, wall time, peak sampled RSS, the cgroup's peak (RSS and page
    cache) and whether it was killed for memory."""
    group = MemoryGroup.create(f"nightshift-store-scale-{os.getpid()}-{time.monotonic_ns()}", limit)
    try:
        began = time.perf_counter()
        child = subprocess.Popen(command_in(group.procs_file, argv), stdout=subprocess.PIPE, text=True)
        samples: list[int] = []
        done = threading.Event()

        def sample() -> None:
            process = psutil.Process(child.pid)
            while not done.is_set():
                try:
                    samples.append(process.memory_info().rss)
                except psutil.Error:
                    return
                done.wait(SAMPLE_S)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        out, _ = child.communicate()
        done.set()
        sampler.join()
        wall = time.perf_counter() - began
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return {
            **(lines[-1] if lines and "progress" not in lines[-1] else {}),
            "progress": [line for line in lines if "progress" in line],
            "rc": child.returncode,
            "wall_s": round(wall, 2),
            "rss_peak_sampled": max(samples, default=0),
            "rss_samples": len(samples),
            "group_peak": group.figure("peak"),
            "oom_kills": group.oom_kills(),
            "load": load(),
        }
    finally:
        group.remove()


def timed_command(argv: list[str], env: dict) -> dict:
    """Wall time and peak RSS (the kernel's, for the child alone) of a command outside any limit."""
    began = time.perf_counter()
    child = subprocess.Popen(argv, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    if status:
        raise SystemExit(f"{shlex.join(argv)} failed ({status})")
    return {"s": round(time.perf_counter() - began, 2), "peak_rss": usage.ru_maxrss * 1024}


def make(args: argparse.Namespace) -> dict:
    """Synth and import one size; figures of both steps."""
    work = Path(args.work)
    src, home = work / f"src-e{args.experts}", work / "home"
    env = {**os.environ, "NIGHTSHIFT_HOME": str(home)}
    cli = [str(Path(sys.executable).with_name("nightshift"))]
    synth = [*cli, "model", "synth", "--arch", "kimi_k3", "--preset", "bench", "--experts", str(args.experts)]
    figures: dict = {"experts": args.experts, "ram": RAM, "load_before": load()}
    if not src.is_dir():
        figures["synth"] = timed_command([*synth, "--seed", str(args.seed), "--out", str(src)], env)
    figures["checkpoint_bytes"] = tree_bytes(src)
    name = f"kimi-bench-e{args.experts}"
    figures["import"] = timed_command([*cli, "model", "import", str(src), "--name", name], env)
    store = home / "models" / name
    figures["store_bytes"] = tree_bytes(store)
    figures["expert_bytes"] = read_manifest(store).expert_bytes
    figures["checkpoint_of_ram"] = round(figures["checkpoint_bytes"] / RAM, 3)
    for step in ("synth", "import"):
        if step in figures:
            figures[step]["MB_per_s"] = round(figures["checkpoint_bytes"] / figures[step]["s"] / 1e6, 1)
    figures["load_after"] = load()
    if args.drop_source:
        shutil.rmtree(src)
    print(json.dumps(figures))
    return {"model": name, "store": str(store), "figures": figures}


def prompt_ids(model: str, text: str) -> list[int]:
    """`text` in token ids, by the model's tokenizer.json (a store's is its checkpoint's)."""
    return Tokenizer.from_file(str(Path(model) / "tokenizer.json")).encode(text).ids


def side_nightshift(store: str, budget: int, tokens: int, prompt: str) -> dict:
    from nightshift.engine.moe.settings import StreamSettings
    from nightshift.engine.runtime import open_model

    began = time.perf_counter()
    model = open_model(Path(store), stream=StreamSettings(cache_bytes=budget))
    opened = time.perf_counter()
    rss_open = psutil.Process().memory_info().rss
    stamps, out = [], []
    for chunk in model.generate_tokens(prompt_ids(store, prompt), max_tokens=tokens):
        stamps.append(time.perf_counter())
        out.append(chunk.token)
        rss, cached = psutil.Process().memory_info().rss, chunk.stats.cache_used
        print(
            json.dumps({"progress": len(out), "s": stamps[-1] - opened, "rss": rss, "cache_used": cached}), flush=True
        )
    stats = chunk.stats
    model.close()
    trunk = Path(store) / read_manifest(Path(store)).trunk["file"]
    return {
        "open_s": opened - began,
        "rss_after_open": rss_open,
        "trunk_bytes": trunk.stat().st_size,
        "bytes_read": sum(stats.drive_bytes.values()),
        "cache_hits": stats.cache_hits,
        "cache_misses": stats.cache_misses,
        "cache_used": stats.cache_used,
        **_timing(opened, stamps, out),
    }


def side_mlx_lm(src: str, tokens: int, prompt: str) -> dict:
    import mlx.core as mx
    from mlx_lm import load as mlx_load
    from mlx_lm.generate import generate_step

    began = time.perf_counter()
    model, _ = mlx_load(src, lazy=True)
    opened = time.perf_counter()
    stamps, out = [], []
    for token, _ in generate_step(mx.array(prompt_ids(src, prompt)), model, max_tokens=tokens):
        stamps.append(time.perf_counter())
        out.append(int(token))
    return {"open_s": opened - began, **_timing(opened, stamps, out)}


def _timing(opened: float, stamps: list[float], out: list[int]) -> dict:
    """First token after opening (the prompt, and for mlx-lm's lazy load every weight read), decode s/token after."""
    decode = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else None
    return {"tokens": out, "first_token_s": stamps[0] - opened, "s_per_token": decode}


def side_argv(kind: str, model: str, args: argparse.Namespace) -> list[str]:
    options = ["--budget", str(args.budget), "--tokens", str(args.tokens), "--prompt", args.prompt]
    return [sys.executable, "-m", "bench.store_scale", "side", kind, model, *options]


def ladder(args: argparse.Namespace) -> list[dict]:
    """Each store streamed in turn, the order reversed every round."""
    runs = []
    for round_ in range(args.rounds):
        order = args.stores if round_ % 2 == 0 else args.stores[::-1]
        for store in order:
            result = run_child(side_argv("nightshift", store, args), args.limit)
            result |= {"round": round_, "store": store, "expert_bytes": read_manifest(Path(store)).expert_bytes}
            print(json.dumps({k: v for k, v in result.items() if k != "progress"}), flush=True)
            runs.append(result)
    return runs


def versus(args: argparse.Namespace) -> list[dict]:
    """nightshift on the store against mlx-lm on its source checkpoint, alternated, which goes first swapped."""
    runs = []
    sides = [("nightshift", args.store), ("mlx-lm", args.src)]
    sides = sides if args.first == "nightshift" else sides[::-1]
    for round_ in range(args.rounds):
        for kind, model in sides if round_ % 2 == 0 else sides[::-1]:
            result = run_child(side_argv(kind, model, args), args.limit)
            result |= {"round": round_, "side": kind, "model": model}
            print(json.dumps({k: v for k, v in result.items() if k != "progress"}), flush=True)
            runs.append(result)
    return runs


def record(args: argparse.Namespace, kind: str, model: str, figures: dict, verdict: str, argv: list[str]) -> None:
    run = Run(
        kind=kind,
        model=model,
        config={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "catalogue"},
        figures=figures,
        verdict=verdict,
        command=shlex.join(["python", "-m", "bench.store_scale", *argv]),
        note=f"shared 2-core machine, RAM {RAM} bytes; load {load()}",
    )
    print(f"recorded run {Catalogue(args.catalogue).record(run)} ({verdict})")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    mk = commands.add_parser("make")
    mk.add_argument("--experts", type=int, required=True)
    mk.add_argument("--work", type=Path, required=True)
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--drop-source", action="store_true", help="delete the source checkpoint once imported")
    for name in ("ladder", "versus"):
        sub = commands.add_parser(name)
        sub.add_argument("--tokens", type=int, default=8)
        sub.add_argument("--prompt", default=PROMPT, help=f"the prompt (default {PROMPT!r})")
        sub.add_argument("--rounds", type=int, default=2)
        sub.add_argument("--budget", type=parse_budget, default=0, help="nightshift's expert cache (0: none)")
        sub.add_argument("--limit", type=parse_budget, help="each process's memory cgroup limit (default: none)")
    commands.choices["ladder"].add_argument("stores", nargs="+")
    commands.choices["versus"].add_argument("store")
    commands.choices["versus"].add_argument("src")
    commands.choices["versus"].add_argument("--first", choices=["nightshift", "mlx-lm"], default="nightshift")
    for sub in commands.choices.values():
        sub.add_argument("--catalogue", type=Path, required=True)
    side = commands.add_parser("side")
    side.add_argument("kind", choices=["nightshift", "mlx-lm"])
    side.add_argument("model")
    side.add_argument("--budget", type=int, default=0)
    side.add_argument("--tokens", type=int, default=8)
    side.add_argument("--prompt", default=PROMPT)
    args = parser.parse_args(argv)
    if args.command == "side":
        if args.kind == "nightshift":
            result = side_nightshift(args.model, args.budget, args.tokens, args.prompt)
        else:
            result = side_mlx_lm(args.model, args.tokens, args.prompt)
        print(json.dumps(result), flush=True)
        return 0
    if args.command == "make":
        made = make(args)
        record(args, "store-scale-make", made["model"], made["figures"], "done", argv)
        return 0
    runs, models = (ladder(args), args.stores) if args.command == "ladder" else (versus(args), [args.store, args.src])
    verdict = "done" if all(r["rc"] == 0 for r in runs) else "a side failed"
    record(args, f"store-scale-{args.command}", ",".join(Path(m).name for m in models), {"runs": runs}, verdict, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
