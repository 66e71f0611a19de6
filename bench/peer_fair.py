"""nightshift against llama.cpp given its best layout and read-ahead, both held to the same total memory (issue [22]).

    python -m bench.peer_fair STORE --llama striped=DIR [--llama drives=DIR] [--shares 0.1,0.25,0.5] [--tokens 16]
        [--read-ahead-kb 4,8 | --probe-read-ahead 4,8,16,32,64,128] [--rounds 1] [--peer-python PYTHON]
        [--limits MB,... [--auto]]

STORE is the nightshift store (its drives: the rig's); each `--llama LAYOUT=DIR` is a directory holding the same
model as one GGUF (or a split one, its files linked from DIR): `striped` on the rig's drives striped into one
volume (bench/peer_striped.py), `drives` one file per drive. For each budget (a share of the store's expert bytes):

1. nightshift runs alone in a memory cgroup without a limit: the group's peak (its whole process, its own memory
   and any page cache it caused, from start to exit) plus `--slack-mib` is the budget's memory limit;
2. then, `--rounds` times, nightshift (its cache held to the budget) and llama.cpp in each layout (through mmap:
   its page cache is its cache) run in turn, each in a fresh memory cgroup held to that same limit from its start,
   the order alternating from round to round and budget to budget. Each llama.cpp run starts with its model's
   page cache dropped and the read-ahead of the device under it (the btrfs volume's bdi, or each rig drive's
   queue) set to `--read-ahead-kb` (several, comma-separated: one llama.cpp run at each in every round);
   nightshift reads with O_DIRECT and no read-ahead applies.

With `--forced` neither engine chooses its tokens: both are fed the bench text's ids after the prompt
(bench/streaming_peers.py `forced_ids`), so they read for the same routing; free-running, each follows its own
greedy tokens, which part at the first step (float32 against bf16-rounded activations), and a weak model's loops
make one engine's text far more repetitive, so cheaper to cache, than the other's.

With `--llama-limit experts` llama.cpp is held instead to the same bytes *for experts* as nightshift's cache
([13]'s definition): its own memory (RssAnon, measured once per layout in a run without a limit) + the GGUF's
non-expert tensors (they stay in the page cache) + the budget + the slack; nightshift keeps its measured peak.

With `--limits MB,...` (one per share) step 1 is skipped: every side at a share is held to the limit given. With
`--auto` as well, nightshift's cache is `--memory-budget auto`, sized by nightshift inside that limit (its cgroup's)
for the prompt and tokens asked, instead of the share: one limit for each whole process, each engine spending it
as it will (the share then only names the limit; the cache auto chose is printed and recorded in its counters).

Every run is recorded in the run catalogue (kind `peer-fair`: engine, layout, share, limit, read-ahead, the load
average at its start, CPU seconds a token as bench/streaming_peers.py counts them) and printed with nightshift's
decode tok/s over llama.cpp's from the same round, and where llama.cpp's greedy tokens first part from nightshift's;
with more than one round, each share ends with the median of its rounds' ratios. With `--probe-read-ahead`, step 2 is llama.cpp alone at
each read-ahead in turn (the sweep that picks `--read-ahead-kb`). The sides are bench/peers/side_nightshift.py
and side_llamacpp.py, run as bench/streaming_peers.py runs them. Root only; run it under `nightshift rig run`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.streaming_peers import (
    Engine,
    auto_cache,
    expert_bytes,
    forced_ids,
    hit_rate,
    median_line,
    model_files,
    prompt_ids,
    rates,
    run_side,
    share_limits,
    speed_ratio,
)
from nightshift.app.paths import catalogue_file
from nightshift.engine.bench.decode import first_difference
from nightshift.engine.bench.peer import read_gguf
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.moe.settings import AUTO_BUDGET

KIND = "peer-fair"
NIGHTSHIFT = "nightshift"
LLAMA = "llamacpp"


@dataclass(frozen=True)
class Side:
    """One engine in one layout (nightshift has one: its store's drives)."""

    engine: Engine
    layout: str

    @property
    def label(self) -> str:
        return self.engine.name if self.engine.name == NIGHTSHIFT else f"{LLAMA}-{self.layout}"


def read_ahead_files(directory: Path) -> list[Path]:
    """The sysfs read_ahead_kb that applies to each model file in `directory`: a btrfs volume's bdi, else the
    queue of the block device under the file system."""
    files = set()
    for path in model_files(directory):
        kind, source = findmnt(path, "FSTYPE,SOURCE").split()
        if kind == "btrfs":
            files.add(Path(f"/sys/fs/btrfs/{findmnt(path, 'UUID').strip()}/bdi/read_ahead_kb"))
        else:
            files.add(Path(f"/sys/class/block/{Path(source).name}/queue/read_ahead_kb"))
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SystemExit(f"no read-ahead setting at {', '.join(missing)}: is {directory} on a block device?")
    return sorted(files)


def findmnt(path: Path, columns: str) -> str:
    argv = ["findmnt", "-n", "-o", columns, "--target", str(path.resolve())]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def set_read_ahead(directory: Path, kb: int) -> None:
    for file in read_ahead_files(directory):
        file.write_text(f"{kb}\n")


class Bench:
    """Runs sides, records each run, prints its row."""

    def __init__(self, store: Path, job: dict, catalogue: Catalogue, limit_mode: str):
        self.store, self.job, self.catalogue, self.limit_mode = store, job, catalogue, limit_mode

    def measure(self, side: Side, share: float, limit: int | None, read_ahead: int | None, round_: int) -> dict:
        load = os.getloadavg()
        if read_ahead is not None:
            set_read_ahead(side.engine.model, read_ahead)
        figures = run_side(side.engine, {**self.job, "model": str(side.engine.model)}, limit)
        figures.update(rates(figures, len(self.job["prompt"])))
        rate = hit_rate(side.engine.name, figures.get("counters", {}))
        config = {"engine": side.engine.name, "layout": side.layout, "share": share, "budget_bytes": self.job["budget"],
                  "limit_bytes": limit, "limit_mode": self.limit_mode, "read_ahead_kb": read_ahead, "round": round_,
                  "tokens": self.job["tokens"], "prompt_tokens": len(self.job["prompt"]),
                  "forced": "forced" in self.job,
                  "threads": self.job["threads"]}  # fmt: skip
        verdict = "fail" if "error" in figures else "measured"
        run = Run(KIND, self.store.name, config, {**figures, "hit_rate": rate, "load": load}, verdict,
                  command=" ".join(sys.argv), note=figures.get("error", ""))  # fmt: skip
        figures["run"] = self.catalogue.record(run)
        figures["load"] = load[0]
        read_mb_s = figures.get("decode_read_bytes", 0) / 1e6 / figures["decode_s"] if figures.get("decode_s") else 0
        print(
            f"{share:>5.2f} {round_:>2} {side.label:>16} {(limit or figures['group_peak_bytes']) / 1e6:>8.0f} "
            f"{'' if read_ahead is None else read_ahead:>5} {figures.get('decode_tok_s', 0):>8.3f} "
            f"{figures.get('decode_read_mb_per_token', 0):>8.2f} {read_mb_s:>7.2f} "
            f"{'' if rate is None else f'{rate:.3f}':>6} {figures['peak_rss_bytes'] / 1e6:>8.0f} "
            f"{figures['group_peak_bytes'] / 1e6:>8.0f} {figures.get('cpu_s_per_token', 0):>7.3f} "
            f"{figures.get('decode_cpu_s_per_token', 0):>7.3f} {load[0]:>5.2f}  run {figures['run']} "
            f"{figures.get('error') or ''}",
            flush=True,
        )
        return figures


HEADER = (f"{'share':>5} {'r':>2} {'engine':>16} {'limit MB':>8} {'RA KB':>5} {'tok/s':>8} {'MB/token':>8} "
          f"{'MB/s':>7} {'hits':>6} {'RSS MB':>8} {'group MB':>8} {'CPU s/t':>7} {'dec CPU':>7} "
          f"{'load':>5}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", type=Path, help="the nightshift store (its expert bytes set the budgets)")
    parser.add_argument(
        "--llama", action="append", default=[], metavar="LAYOUT=DIR", help="llama.cpp's GGUF in a layout"
    )
    parser.add_argument("--shares", default="0.1,0.25,0.5", help="budgets as shares of the expert bytes")
    parser.add_argument("--tokens", type=int, default=16, help="tokens to generate")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--forced", action="store_true",
                        help="feed both engines the bench text's next ids, not each one's greedy choice")  # fmt: skip
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds per budget")
    parser.add_argument(
        "--read-ahead-kb", help="llama.cpp's device read-ahead(s), comma-separated KB (default: leave it)"
    )
    parser.add_argument("--probe-read-ahead", help="read-aheads to sweep, llama.cpp alone (comma-separated KB)")
    parser.add_argument("--llama-limit", choices=("total", "experts"), default="total",
                        help="nightshift's peak, or llama.cpp's own need + the same share of experts")  # fmt: skip
    parser.add_argument("--slack-mib", type=int, default=16, help="over nightshift's measured peak")
    parser.add_argument("--limits", help="each share's memory limit in MB, comma-separated (default: ns's peak)")
    parser.add_argument("--auto", action="store_true", help="nightshift's cache sized by itself in --limits")
    parser.add_argument("--peer-python", type=Path, default=os.environ.get("NIGHTSHIFT_LLAMA_CPP_PYTHON"))
    parser.add_argument("--catalogue", type=Path, help="run catalogue (default: the data dir's)")
    args = parser.parse_args()
    if not args.llama or args.peer_python is None:
        raise SystemExit("give --llama LAYOUT=DIR and the peer's python (--peer-python or NIGHTSHIFT_LLAMA_CPP_PYTHON)")
    shares = [float(s) for s in args.shares.split(",")]
    given = share_limits(args.limits, shares)
    if args.auto and not given:
        raise SystemExit("--auto sizes nightshift's cache inside a memory limit: give the limits with --limits")
    ours = Side(Engine(NIGHTSHIFT, Path(sys.executable), args.store), "drives")
    theirs = [
        Side(Engine(LLAMA, args.peer_python, Path(d)), layout) for layout, d in (a.split("=", 1) for a in args.llama)
    ]
    read_aheads = [int(kb) for kb in args.read_ahead_kb.split(",")] if args.read_ahead_kb else [None]
    bench = Bench(args.store, {}, Catalogue(args.catalogue or catalogue_file()), args.llama_limit)
    total = expert_bytes(args.store)
    prompt = prompt_ids(args.store, args.prompt_tokens)[0]
    forced = {"forced": forced_ids(args.store, prompt, args.tokens)} if args.forced else {}
    print(f"experts {total / 1e6:.1f} MB; prompt {len(prompt)} tokens; {args.tokens} tokens"
          f"{' (forced: the bench text)' if forced else ''}; load {os.getloadavg()}")  # fmt: skip
    print(HEADER)
    own_need = {}  # per layout (--llama-limit experts): llama.cpp's memory besides the experts, its expert bytes
    if args.llama_limit == "experts":
        bench.job = {"budget": 0, "prompt": prompt, "prompts": [prompt], "tokens": args.tokens,
                     "threads": args.threads, "width": 1, **forced}  # fmt: skip
        for side in theirs:
            alone = bench.measure(side, 0.0, None, read_aheads[0], 0)
            gguf = read_gguf(sorted(side.engine.model.glob("*.gguf"))[0])
            own_need[side.label] = (alone["counters"]["rss_anon_bytes"] + gguf.trunk_bytes, gguf.expert_bytes)
    for index, share in enumerate(shares):
        budget = AUTO_BUDGET if args.auto else int(share * total)
        bench.job = {"budget": budget, "prompt": prompt, "prompts": [prompt], "tokens": args.tokens,
                     "threads": args.threads, "width": 1, **forced}  # fmt: skip
        if given:
            limit = given[index]
        else:
            alone = bench.measure(ours, share, None, None, 0)
            limit = alone["group_peak_bytes"] + (args.slack_mib << 20)
        limits = {side.label: limit for side in [ours, *theirs]}
        for label, (need, experts) in own_need.items():  # the same share of its own expert bytes
            limits[label] = need + int(share * experts) + (args.slack_mib << 20)
        if args.probe_read_ahead:
            for kb in (int(k) for k in args.probe_read_ahead.split(",")):
                for side in theirs:
                    bench.measure(side, share, limits[side.label], kb, 0)
            continue
        peers = [(side, kb) for side in theirs for kb in read_aheads]
        ratios: dict[tuple[str, int | None], list[float | None]] = {(side.label, kb): [] for side, kb in peers}
        for round_ in range(1, args.rounds + 1):
            order = [(ours, None), *peers] if (index + round_) % 2 else [*peers, (ours, None)]
            done = {}
            for side, kb in order:
                done[side.label, kb] = bench.measure(side, share, limits[side.label], kb, round_)
            mine = done[ours.label, None]
            if args.auto and (said := auto_cache(mine)):
                print(said, flush=True)
            for side, kb in peers:
                other = done[side.label, kb]
                ratios[side.label, kb].append(speed_ratio(mine, other))
                if "error" in mine or "error" in other:
                    continue
                parted = first_difference(mine["tokens"][0], other["tokens"][0])
                said = "equal" + " (forced)" * bool(forced) if parted is None else f"part at step {parted}"
                print(f"      share {share:.2f} round {round_}: nightshift / {side.label} at {kb} KB = "
                      f"{ratios[side.label, kb][-1]:.2f}x; tokens {said}", flush=True)  # fmt: skip
        for (label, kb), each in ratios.items() if args.rounds > 1 else ():
            print("      " + median_line(f"share {share:.2f}, nightshift / {label} at {kb} KB", each), flush=True)
    print(f"recorded in {bench.catalogue.path}; load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
