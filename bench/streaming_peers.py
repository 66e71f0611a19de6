"""nightshift beside the engines that stream experts themselves (fastllm, nunspark, AirLLM), at the same total memory.

For each budget (a share of the store's expert bytes) nightshift runs first, in a memory cgroup without a limit, so
its whole process is measured: the group's peak (its own memory and any page cache it caused) is then the memory
limit of every peer's process at that budget, and each peer's own expert cache is given the same bytes nightshift's
cache had. Every engine is its own process in its own interpreter (bench/peers/side_*.py; each peer in the venv its
`bash bench/peers/setup.sh PEER` builds), reads its own copy of the same checkpoint, decodes the same prompt ids greedily for
the same number of tokens, and prints its tokens, times and its own counters. The bench adds what the kernel counts
for the process (os.wait4: peak RSS, blocks read from storage) and the cgroup (peak, OOM kills). The page cache of
each engine's files is dropped before its run, so none starts warm; nightshift reads with O_DIRECT.

    python -m bench.streaming_peers STORE --ftllm HF_DIR --nunspark PACKED_DIR --airllm HF_DIR [--shares 0.1,0.25,0.5]
        [--width 8 [--chats month-end] [--batch-share 0.25]]

A share named twice is measured twice, in the order given (so `--shares 0.25,0.25,0.25` gives alternating pairs).
With `--fill`, nightshift runs once more at each share after the peers, held to the same limit, its cache grown by
what its first run left of that limit (the limit less its peak RSS, less `--fill-margin-mb`): the memory used as a
page-cache engine uses it, where the share alone leaves the rest of the limit (its trunk file's page cache, mostly)
to the peer. Each `--variant KEY=VALUE[,KEY=VALUE]` (nightshift's stream settings by field name, values as JSON,
e.g. `prefetch=false`) adds one more nightshift run at each share, its budget and limit the share's. With `--forced`
(nightshift alone) every run is fed the bench text's ids after the prompt (`forced_ids`), so the variants read for
the same routing.

With `--limits MB,...` (one per share) every side at a share, nightshift's first run included, is held to the limit
given instead of nightshift's measured peak; with `--auto` nightshift's first run uses `--memory-budget auto` (sized
inside that limit, for the prompt and tokens asked) instead of the share: "the same total memory" as a user of
`auto` gets it, the peers' caches still the share.

With `--alternate N` each share is measured in N pairs (nightshift, then the peers; the next pair the other way round,
so drift in a shared machine's load falls on both sides alike), every side after the first pair held to the share's
limit; each pair's ratio of decode tok/s (nightshift over each peer) is printed, and their median. `--peers-first`
starts each share with the peers (it needs `--limits` or `--unlimited`: otherwise nightshift's first run sets the
limit). Every run's CPU seconds are recorded: the process's user + system time from the kernel (os.wait4), over the
tokens it made (load and prompt included), and the side's own count over the decode (after the first token).

Each run is recorded in the run catalogue (kind `streaming-peers`), a peer's failure (killed at the limit, an error)
included with its last line. A peer whose venv is missing is skipped, with the command that builds it. Root only
(memory cgroups).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from nightshift.app.paths import catalogue_file
from nightshift.engine.bench.peer import drop_page_cache
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.moe.settings import AUTO_BUDGET
from nightshift.engine.rig.cgroups import MemoryGroup, command_in

SIDES = Path(__file__).with_name("peers")
TRACED = ("nightshift", "nunspark")  # the sides that can write the experts each layer call asked for
PEERS_HOME = Path(os.environ.get("NIGHTSHIFT_PEERS", "/work/peers"))
PROMPT_TEXT = (
    "The month-end close reconciles the ledger with the bank statements: every payment is matched to an invoice, "
    "every difference is explained, and the accruals are reviewed before the books are locked for the period."
)
# What a forced run feeds after the prompt (`forced_ids`): the bench text and more of the same kind, our own words,
# so that both engines route over ordinary prose rather than over the loops a greedy run of a weak model falls into.
FORCED_TEXT = (
    " This month the review found three payments without an invoice, all to the same supplier, and one invoice paid "
    "twice in the last week of the month. The supplier confirmed the double payment and will credit it next month; "
    "the three payments were deposits on an order that has not yet been delivered, so they belong with the prepaid "
    "expenses and not with the costs of the period. The bank charges were higher than usual because two transfers "
    "went abroad, and the exchange difference on them was booked to the wrong account. Payroll matched the approved "
    "list, but one employee who left in the middle of the month was paid for the whole of it, which the payroll team "
    "has been asked to recover. The accruals for electricity and rent were made as in earlier months; the electricity "
    "bill arrived before the close and was close to the accrual, so no change is needed. The report should say which "
    "of these items change the result for the month, which only move amounts between accounts, and who will follow "
    "each one up before the next close."
)


@dataclass(frozen=True)
class Engine:
    """One engine of the comparison: its interpreter, its side script and the copy of the model it reads."""

    name: str
    python: Path
    model: Path

    @property
    def side(self) -> Path:
        return SIDES / f"side_{self.name}.py"

    def missing(self) -> str | None:
        """Why this engine cannot run here (with the command that fixes it), or None."""
        if not self.python.exists():
            return f"{self.name}: no {self.python}; build it with `bash bench/peers/setup.sh {self.name}`"
        if not self.model.exists():
            return f"{self.name}: no model copy at {self.model}"
        return None


def expert_bytes(store: Path) -> int:
    """The routed experts' bytes of a nightshift store (one replica)."""
    manifest = json.loads((store / "manifest.json").read_text())
    return sum(layer["file_bytes"] * layer["num_experts"] for layer in manifest["layers"])


def prompt_ids(store: Path, count: int, width: int = 1) -> list[list[int]]:
    """`width` prompts of `count` token ids of the bench text, by the store's tokenizer (every copy has the same
    one): the first from its start, each next from two tokens further on."""
    ids = Tokenizer.from_file(str(store / "tokenizer.json")).encode(PROMPT_TEXT).ids
    if len(ids) < count + 2 * (width - 1):
        raise SystemExit(f"--prompt-tokens {count} at width {width}: the bench text has {len(ids)} tokens; ask less")
    return [ids[2 * i : 2 * i + count] for i in range(width)]


def forced_ids(store: Path, prompt: list[int], count: int) -> list[int]:
    """The `count` ids that follow `prompt` (the bench text's first ids, `prompt_ids`) in the bench text and
    `FORCED_TEXT` after it, by the store's tokenizer: what a forced run feeds each engine, the same for every one."""
    ids = Tokenizer.from_file(str(store / "tokenizer.json")).encode(PROMPT_TEXT + FORCED_TEXT).ids
    if ids[: len(prompt)] != prompt or len(ids) < len(prompt) + count:
        raise SystemExit(
            f"--forced: the bench text gives {len(ids) - len(prompt)} ids after the prompt; ask fewer tokens"
        )
    return ids[len(prompt) : len(prompt) + count]


def chat_prompts(store: Path, review: str, width: int) -> list[list[int]]:
    """The first `width` finding chats of `review`'s split narrative (the batch the service decodes together), as
    token ids by the store's tokenizer and chat template."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from bench.routing_traces import review_chats
    from nightshift.engine.generation import chat_prompt

    findings = [messages for name, messages, _ in review_chats(review) if name.split()[-1].startswith("F")]
    if len(findings) < width:
        raise SystemExit(
            f"--chats {review}: its split narrative has {len(findings)} finding chats; ask --width up to that"
        )
    tokenizer = load_tokenizer(store)
    return [chat_prompt(tokenizer, messages) for messages in findings[:width]]


def filled_budget(budget: int, limit: int, peak_rss: int, margin: int, total: int) -> int:
    """`--fill`'s cache: the budget grown by what a run with it left of `limit` (less `margin`), at most every
    expert's bytes (`total`), never below the budget."""
    return max(budget, min(total, budget + limit - peak_rss - margin))


def settings_of(text: str) -> dict:
    """`--variant`'s KEY=VALUE[,KEY=VALUE] as stream settings (values as JSON: false, 2, "odds"), checked by name."""
    from dataclasses import fields

    from nightshift.engine.moe.settings import StreamSettings

    names = {f.name for f in fields(StreamSettings)}
    settings = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in names or not value:
            raise argparse.ArgumentTypeError(f"{item!r}: give KEY=VALUE with KEY one of nightshift's stream settings")
        try:
            settings[key] = json.loads(value)
        except json.JSONDecodeError:
            settings[key] = value
    return settings


def model_files(model: Path) -> list[Path]:
    return [p for p in model.rglob("*") if p.is_file()]


def run_side(engine: Engine, job: dict, limit: int | None) -> dict:
    """Run one engine's side in a fresh memory cgroup (held to `limit` bytes if given); what it and the kernel say."""
    drop_page_cache(model_files(engine.model))
    group = MemoryGroup.create(f"nightshift-peers-{engine.name}-{os.getpid()}", limit)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    argv = [str(engine.python), str(engine.side), json.dumps(job)]
    try:
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            began = time.perf_counter()
            proc = subprocess.Popen(command_in(group.procs_file, argv), stdout=out, stderr=err, env=env)
            _, status, usage = os.wait4(proc.pid, 0)  # this process's own rusage, not the children's sum
            proc.returncode = os.waitstatus_to_exitcode(status)
            wall = time.perf_counter() - began
            out.seek(0), err.seek(0)
            said, complaint = out.read(), err.read()
        figures = {
            "wall_s": wall,
            "peak_rss_bytes": usage.ru_maxrss * 1024,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "process_read_bytes": usage.ru_inblock * 512,
            "group_peak_bytes": group.figure("peak"),
            "oom_kills": group.oom_kills(),
            "returncode": proc.returncode,
        }
        lines = [line for line in said.splitlines() if line.startswith("{")]
        if proc.returncode == 0 and lines:
            figures.update(json.loads(lines[-1]))
        else:
            tail = [line.strip() for line in (complaint or said).splitlines() if line.strip()]
            last = tail[-1] if tail else f"exit {proc.returncode}, nothing said"
            killed = f"killed at the memory limit ({limit / 1e6:.0f} MB; OOM kills {figures['oom_kills']}); "
            figures["error"] = (killed if figures["oom_kills"] and limit else "") + f"its last line: {last}"
        return figures
    finally:
        group.remove()


def share_limits(given: str | None, shares: list[float]) -> list[int]:
    """`--limits MB,...` in bytes, one per share (none given: []); a count that is not one per share is refused."""
    limits = [int(float(mb) * 1e6) for mb in given.split(",")] if given else []
    if limits and len(limits) != len(shares):
        raise SystemExit(f"--limits gives {len(limits)} limits for {len(shares)} shares: give one per share")
    return limits


def auto_cache(figures: dict) -> str | None:
    """The line that says what cache `--memory-budget auto` chose in a nightshift run: sized at open, its budget and
    what it held at the end (grown inside a limit), the cache's used bytes (None if it did not say)."""
    if "counters" not in figures:
        return None
    counters = figures["counters"]
    return (
        f"{'':>6} auto: nightshift's cache {counters['budget']['bytes'] / 1e6:.1f} MB at open, "
        f"{counters.get('cache_budget', 0) / 1e6:.1f} MB at the end, {counters['cache_used'] / 1e6:.1f} MB held"
    )


def rates(figures: dict, prompt_tokens: int) -> dict:
    """Prompt and decode tok/s (`prompt_tokens`: every prompt's together), what the prompts read and what each decoded
    token read, and CPU seconds a token (the whole process's over every token made; the decode's over the tokens
    after the first), where the side finished."""
    if "tokens" not in figures:
        return {}
    made = sum(len(t) for t in figures["tokens"])
    after_first = max(made - len(figures["tokens"]), 1)
    return {
        "prompt_tok_s": prompt_tokens / figures["prompt_s"] if figures["prompt_s"] else 0.0,
        "decode_tok_s": after_first / figures["decode_s"] if figures["decode_s"] else 0.0,
        "aggregate_tok_s": made / (figures["prompt_s"] + figures["decode_s"]),
        "prompt_read_mb": figures["prompt_read_bytes"] / 1e6,
        "decode_read_mb_per_token": figures["decode_read_bytes"] / 1e6 / after_first,
        "cpu_s_per_token": figures["cpu_s"] / made,
        "decode_cpu_s_per_token": figures.get("decode_cpu_s", 0.0) / after_first,
    }


def hit_rate(name: str, counters: dict) -> float | None:
    """The expert cache's hit rate as the engine counts it (None where it keeps no such count)."""
    if name == "ftllm":
        hits, misses = counters.get("cpu_hits", 0), counters.get("misses", 0)
    else:
        hits, misses = counters.get("hits", 0), counters.get("misses", 0)
    return hits / (hits + misses) if hits + misses else None


def speed_ratio(ours: dict, theirs: dict) -> float | None:
    """nightshift's decode tok/s over a peer's in one pair (None where either failed)."""
    if "error" in ours or "error" in theirs or not theirs.get("decode_tok_s"):
        return None
    return ours["decode_tok_s"] / theirs["decode_tok_s"]


def pair_order(nightshift: Engine, peers: list[Engine], pair: int, peers_first: bool) -> list[Engine]:
    """The order of pair `pair` (0 first): nightshift first, then the peers, flipped every other pair."""
    ours_first = (pair % 2 == 0) != peers_first
    return [nightshift, *peers] if ours_first else [*peers, nightshift]


def median_line(label: str, ratios: list[float | None]) -> str:
    """The median of the pairs' ratios, with each pair's (a failed pair is named, not counted)."""
    done = [r for r in ratios if r is not None]
    each = ", ".join("failed" if r is None else f"{r:.2f}" for r in ratios)
    if not done:
        return f"{label}: no pair finished ({each})"
    return f"{label}: median {statistics.median(done):.2f}x over {len(done)} pairs ({each})"


def measure(engine: Engine, job: dict, share: float, limit: int | None, catalogue: Catalogue) -> dict:
    """One engine's run of `job` under `limit`: measured, recorded in the catalogue (with the load average at its
    start), printed as a row."""
    load = os.getloadavg()
    figures = run_side(engine, {**job, "model": str(engine.model)}, limit)
    prompt = len(job["prompts"][0])
    figures.update(rates(figures, sum(map(len, job["prompts"]))))
    rate = hit_rate(engine.name, figures.get("counters", {}))
    config = {"engine": engine.name, "share": share, "budget_bytes": job["budget"], "limit_bytes": limit,
              "prompt_tokens": prompt, "tokens": job["tokens"], "threads": job["threads"], "width": job["width"],
              "fill": bool(job.get("fill")), "settings": job.get("settings", {}), "pair": job.get("pair", 0),
              "order": job.get("order", ""), "forced": "forced" in job}  # fmt: skip
    verdict = "fail" if "error" in figures else "measured"
    run = Run("streaming-peers", engine.model.name, config, {**figures, "hit_rate": rate, "load": load},
              verdict, command=" ".join(sys.argv), note=figures.get("error", ""))  # fmt: skip
    run_id = catalogue.record(run)
    said = figures.get("error") or figures["tokens"][0]
    rate_text = "" if rate is None else f"{rate:.3f}"
    print(
        f"{share:>6.2f} {job['width']:>3} {engine.name:>10} {(limit or figures['group_peak_bytes']) / 1e6:>9.0f} "
        f"{figures.get('prompt_tok_s', 0):>10.2f} {figures.get('decode_tok_s', 0):>10.3f} "
        f"{figures.get('aggregate_tok_s', 0):>9.3f} {figures['peak_rss_bytes'] / 1e6:>11.0f} "
        f"{figures.get('prompt_read_mb', 0):>9.1f} {figures.get('decode_read_mb_per_token', 0):>8.1f} "
        f"{rate_text:>8} {figures.get('cpu_s_per_token', 0):>7.3f} {figures.get('decode_cpu_s_per_token', 0):>7.3f} "
        f"{load[0]:>5.2f}  {said} (run {run_id})",
        flush=True,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", type=Path, help="the nightshift store (its expert bytes set the budgets)")
    parser.add_argument("--ftllm", type=Path, help="the HF safetensors copy fastllm reads")
    parser.add_argument("--nunspark", type=Path, help="nunspark's packed copy (`nunspark pack` of a 4-bit MLX copy)")
    parser.add_argument("--airllm", type=Path, help="the HF safetensors copy AirLLM splits")
    parser.add_argument("--shares", default="0.1,0.25,0.5", help="budgets as shares of the expert bytes")
    parser.add_argument("--tokens", type=int, default=8, help="tokens to generate")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--catalogue", type=Path, help="run catalogue (default: the data dir's)")
    parser.add_argument("--width", type=int, default=0, help="also decode this many prompts together (0: not)")
    parser.add_argument("--chats", metavar="REVIEW", help="batch REVIEW's finding chats (month-end), not bench text")
    parser.add_argument("--batch-share", type=float, help="the batched pair's budget (default: the middle share)")
    parser.add_argument("--unlimited", action="store_true", help="peers without a memory limit (peak still measured)")
    parser.add_argument("--traces", type=Path, help="a folder for each run's routing trace (nightshift, nunspark)")
    parser.add_argument("--fill", action="store_true", help="also nightshift at each limit, its cache grown to fill it")
    parser.add_argument("--fill-margin-mb", type=float, default=24, help="what --fill leaves of the limit")
    parser.add_argument("--limits", help="each share's memory limit in MB, comma-separated (default: ns's peak)")
    parser.add_argument("--auto", action="store_true", help="nightshift's first run with the auto memory budget")
    parser.add_argument(
        "--alternate",
        type=int,
        default=1,
        metavar="N",
        help="N pairs at each share, the order flipped each pair; ratios and their median",
    )
    parser.add_argument("--peers-first", action="store_true", help="each share's first pair starts with the peers")
    parser.add_argument("--variant", action="append", type=settings_of, default=[], metavar="KEY=VALUE[,...]",
                        help="one more nightshift run at each share with these stream settings")  # fmt: skip
    parser.add_argument("--forced", action="store_true",
                        help="nightshift alone (and its variants) fed the bench text's ids, not its greedy choice")  # fmt: skip
    args = parser.parse_args()

    nightshift = Engine("nightshift", Path(sys.executable), args.store)
    peers = [
        Engine(name, PEERS_HOME / name / "venv" / "bin" / "python", model)
        for name, model in (("ftllm", args.ftllm), ("nunspark", args.nunspark), ("airllm", args.airllm))
        if model is not None
    ]
    for why in filter(None, (p.missing() for p in peers)):
        print(f"skipped: {why}")
    peers = [p for p in peers if p.missing() is None]
    if args.forced and (peers or args.width > 1):
        raise SystemExit("--forced: only nightshift's side takes forced ids here (bench.peer_fair for llama.cpp's)")
    catalogue = Catalogue(args.catalogue or catalogue_file())
    if args.traces:
        args.traces.mkdir(parents=True, exist_ok=True)
    total = expert_bytes(args.store)
    prompt = prompt_ids(args.store, args.prompt_tokens)[0]
    print(
        f"experts {total / 1e6:.1f} MB; prompt {len(prompt)} tokens; {args.tokens} tokens; load {os.getloadavg()[0]:.2f}"
    )
    header = f"{'share':>6} {'w':>3} {'engine':>10} {'limit MB':>9} {'prompt t/s':>10} {'decode t/s':>10} {'all t/s':>9} {'peak RSS MB':>11}"
    print(header + f" {'prompt MB':>9} {'MB/token':>8} {'hit rate':>8} {'CPU s/t':>7} {'dec CPU':>7} {'load':>5}"
          "  tokens / error")  # fmt: skip
    shares = [float(s) for s in args.shares.split(",") if s]  # "": only the batched pair
    if args.auto and args.fill:
        raise SystemExit("--fill grows the share's cache into the limit, --auto sizes it there: give one of them")
    limits = share_limits(args.limits, shares)
    if args.peers_first and not (limits or args.unlimited):
        raise SystemExit(
            "--peers-first: the peers' limit is nightshift's measured peak; give --limits (or --unlimited)"
        )
    if args.width > 1 and not shares and args.batch_share is None:
        raise SystemExit("--shares '' measures only the batched pair: give its budget with --batch-share")
    forced = {"forced": forced_ids(args.store, prompt, args.tokens)} if args.forced else {}
    for index, share in enumerate(shares):
        budget = int(share * total)
        job = {"budget": budget, "prompts": [prompt], "prompt": prompt, "tokens": args.tokens,
               "threads": args.threads, "width": 1, **forced}  # fmt: skip
        order = peers[index % len(peers) :] + peers[: index % len(peers)] if peers else []
        limit, first = (limits[index] if limits else None), {}
        ratios: dict[str, list[float | None]] = {peer.name: [] for peer in order}
        for pair in range(args.alternate):
            sequence = pair_order(nightshift, order, pair, args.peers_first)
            label = "peers first" if sequence[0] is not nightshift else "nightshift first"
            done = {}
            for engine in sequence:
                trace = None
                if args.traces and engine.name in TRACED:  # the first pair's named as before, later ones numbered
                    trace = args.traces / f"{engine.name}-{share:g}{f'-{pair + 1}' if pair else ''}.jsonl"
                own = {"budget": AUTO_BUDGET} if engine is nightshift and args.auto else {}
                paired = {"trace": trace and str(trace), "pair": pair + 1, "order": label, **own}
                done[engine.name] = figures = measure(engine, {**job, **paired}, share, limit, catalogue)
                if own and (said := auto_cache(figures)):
                    print(said)
                if engine is nightshift and not first:
                    first = figures
                    limit = figures["group_peak_bytes"] if not (args.unlimited or limits) else limit
            for peer in order:
                ratios[peer.name].append(speed_ratio(done["nightshift"], done[peer.name]))
                if args.alternate > 1:
                    said = ratios[peer.name][-1]
                    print(f"{'':>6} pair {pair + 1} ({label}): nightshift / {peer.name} = "
                          f"{'failed' if said is None else f'{said:.2f}x'}", flush=True)  # fmt: skip
        for peer in order if args.alternate > 1 else []:
            print(f"{'':>6} " + median_line(f"share {share:g}, nightshift / {peer.name}", ratios[peer.name]))
        if args.fill and limit and "error" not in first:
            grown = filled_budget(budget, limit, first["peak_rss_bytes"], int(args.fill_margin_mb * 1e6), total)
            if grown > budget:
                print(f"{'':>6} fill: nightshift's cache {budget / 1e6:.1f} -> {grown / 1e6:.1f} MB in the same limit")
                measure(nightshift, {**job, "budget": grown, "trace": None, "fill": True}, share, limit, catalogue)
        for settings in args.variant if limit else []:
            print(f"{'':>6} variant: nightshift with {settings}")
            measure(nightshift, {**job, "trace": None, "settings": settings}, share, limit, catalogue)
    if args.width > 1:  # the batched pair: nightshift's width against nunspark's batched decode, at the middle budget
        share = args.batch_share if args.batch_share is not None else shares[len(shares) // 2]
        if args.chats:
            prompts = chat_prompts(args.store, args.chats, args.width)
        else:
            prompts = prompt_ids(args.store, args.prompt_tokens, args.width)
        print(f"batched: {len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens")
        job = {"budget": int(share * total), "prompts": prompts, "prompt": prompts[0], "tokens": args.tokens,
               "threads": args.threads, "width": args.width}  # fmt: skip
        limit = None
        for engine in [nightshift, *(p for p in peers if p.name == "nunspark")]:
            figures = measure(engine, job, share, limit, catalogue)
            limit = figures["group_peak_bytes"] if engine is nightshift and not args.unlimited else limit
    print(f"recorded in {catalogue.path}; load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
