"""Three reviews due in the same minute: one after another, as the service did, against one batch ([15]).

    flock /work/notes/bench.lock .venv/bin/python -m bench.service_batch [--reviews month-end daily weekly]
        [--model NAME] [--width 3] [--part-tokens 24] [--rounds 1]

Each way runs the service's own code on the three bundled reviews (as user schedules in a temporary data dir,
on one model loaded once and shared): one after another is `execute` of each run in turn; together is
`execute_batch` of all three, whose narratives generate as one batch. Each way covers the whole review: the
checks, the narrative, the PDF and the index. Rounds run one-after-another, together, together, one-after-
another (ABBA), so a neighbour's load or a warming cache falls on both. Per way it prints the wall time, the
prompt reading and writing times summed over the runs (a batch's are counted once), decode steps and rows, and
the streamed experts read per layer call; checks every run ended done with the same narrative both ways
(greedy); then, where the time goes, decode steps of 1, 3 and 3 x width rows alone; records the run in the catalogue (kind `service-batch`). `--width`/`--part-tokens` set each review's
split narrative (its `[model] batch_width`/`part_tokens`) so that one run fits a bench slot.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nightshift.app.models import open_for_generation, resolve_model
from nightshift.app.paths import catalogue_file
from nightshift.app.review.narrative import CONTROL
from nightshift.app.review.schedule import BUNDLED_DIR
from nightshift.engine.instruments.catalogue import Catalogue, Run

WAYS = ("one-after-another", "together")


def user_schedules(home: Path, reviews: list[str], model: Path, width: int, part_tokens: int) -> None:
    """The bundled reviews as the user's, on `model`, with a split narrative of `width` answers of `part_tokens`."""
    folder = home / "schedules"
    folder.mkdir(parents=True)
    for name in reviews:
        text = (BUNDLED_DIR / f"{name}.toml").read_text().replace('"sample-data/', f'"{BUNDLED_DIR}/sample-data/')
        settings = f'[model]\nname = "{model}"\nnarrative = "split"\nbatch_width = {width}\npart_tokens = {part_tokens}'
        (folder / f"{name}.toml").write_text(text.replace("[model]", settings, 1))


def one_way(way: str, reviews: list[str], model, load, width: int) -> dict[str, Any]:
    """The three runs one way, timed from the first claim to the last outcome recorded."""
    from nightshift.app.daemon.runs import RunQueue
    from nightshift.app.daemon.work import execute, execute_batch

    queue = RunQueue()
    ids = [queue.enqueue(name, origin="manual") for name in reviews]
    before = model.stream.call_counts() if model.stream is not None else None
    started = time.perf_counter()
    if way == "together":
        runs = [queue.claim(run_id, os.getpid()) for run_id in ids]
        finished = execute_batch(queue, runs, [None] * len(runs), load_model=load)
    else:
        finished = [execute(queue, queue.claim(run_id, os.getpid()), load_model=load) for run_id in ids]
    wall = time.perf_counter() - started
    failed = [f"{run.review}: {run.state} {run.error}" for run in finished if run.state != "done"]
    if failed:
        raise SystemExit(f"{way}: a run did not finish: {failed}")
    progress = [run.progress for run in finished]
    # A batch's prompt reading and writing are one time shared by its runs: counted once.
    shared = progress[:1] if way == "together" else progress
    reading = sum(p.time_to_first_token for p in shared)
    writing = sum(p.elapsed - p.time_to_first_token for p in shared)
    figures = {
        "way": way, "answers_per_batch": width * len(finished) // (1 if way == "together" else len(finished)),
        "wall_s": round(wall, 1), "reading_s": round(reading, 1), "writing_s": round(writing, 1),
        "other_s": round(wall - reading - writing, 1),  # checks, PDFs, index
        "prompt_tokens": sum(p.prompt_tokens for p in progress), "generated_tokens": sum(p.generated_tokens for p in progress),
        "decode_tok_s": round(sum(p.generated_tokens - 1 for p in progress) / writing, 2) if writing else 0.0,
        "runs": [{"review": run.review, "tokens": p.generated_tokens, "tok_s": p.decode_tokens_per_s,
                  "batch": p.batch, "batch_tok_s": p.batch_tokens_per_s, "text": CONTROL.sub("", p.text).strip()} for run, p in zip(finished, progress)],
    }  # fmt: skip
    if before is not None:
        after = model.stream.call_counts()
        calls, rows, unique = after.calls - before.calls, after.rows - before.rows, after.unique - before.unique
        figures["stream"] = {"layer_calls": calls, "rows": rows, "experts_read": unique,
                             "experts_per_call": round(unique / calls, 2) if calls else 0.0,
                             "rows_per_call": round(rows / calls, 2) if calls else 0.0}  # fmt: skip
    return figures


def step_cost(model, widths: list[int], tokens: int, prompt_tokens: int) -> list[dict[str, Any]]:
    """Where a batch's time goes: decode steps of 1, 3, 9 ... rows on the same loaded model (calibration prompts
    of `prompt_tokens`, every sequence run to `tokens`), each step's seconds and the experts a layer call read."""
    from nightshift.engine.batch import batch_tokens
    from nightshift.engine.generation import BatchStats
    from nightshift.engine.store.upkeep import calibration_prompts

    prompts = calibration_prompts(model.tokenizer, length=prompt_tokens)
    costs = []
    for width in widths:
        stats = BatchStats(width=width)
        batch_tokens(model.model, prompts[:width], tokens, model.stream, stats=stats)
        costs.append({"width": width, "steps": stats.steps, "s_per_step": round(stats.decode_seconds / stats.steps, 4),
                      "s_per_row": round(stats.decode_seconds / stats.rows, 4),
                      "aggregate_tok_s": round(stats.decode_tokens_per_s, 2),
                      "experts_per_layer_call": round(stats.experts_per_layer_call, 2)})  # fmt: skip
        print(json.dumps(costs[-1]), flush=True)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reviews", nargs="+", default=["month-end", "daily", "weekly"])
    parser.add_argument("--model", default=None, help="a model name or directory (default: the default model)")
    parser.add_argument("--width", type=int, default=3, help="answers per review: the summary and width-1 findings")
    parser.add_argument("--part-tokens", type=int, default=24, help="tokens per answer at most")
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds of one-after-another, together, together, one-after-another"
    )
    args = parser.parse_args()
    path = resolve_model(args.model)
    catalogue = catalogue_file()
    home = Path(tempfile.mkdtemp(prefix="nightshift-service-batch-"))
    os.environ["NIGHTSHIFT_HOME"] = str(home)  # the runs, reports and index of this benchmark only
    user_schedules(home, args.reviews, path, args.width, args.part_tokens)
    model = open_for_generation(path)

    def load(_path: Path, **_settings: object):
        return model  # one model for both ways, as the service keeps it loaded

    ways = [way for _ in range(args.rounds) for way in (*WAYS, *reversed(WAYS))]
    results = []
    for way in ways:
        results.append(one_way(way, args.reviews, model, load, args.width))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "runs"}), flush=True)
    widths = [1, len(args.reviews), len(args.reviews) * args.width]
    costs = step_cost(model, widths, 12, 32)
    resident = model.stream.figures().resident_layers if model.stream is not None else None
    model.close()
    texts = {
        way: {tuple(r["text"] for r in result["runs"]) for result in results if result["way"] == way} for way in WAYS
    }
    same_text = len(texts["together"] | texts["one-after-another"]) == 1
    keys = ("wall_s", "reading_s", "writing_s", "other_s", "decode_tok_s")
    medians = {
        way: {key: statistics.median(r[key] for r in results if r["way"] == way) for key in keys} for way in WAYS
    }
    print(f"{'':<14}" + "".join(f"{way:>20}" for way in WAYS))
    for key in keys:
        print(f"{key:<14}" + "".join(f"{medians[way][key]:>20}" for way in WAYS))
    ratio = medians["one-after-another"]["wall_s"] / medians["together"]["wall_s"]
    print(f"together finishes in {1 / ratio:.2f}x the time of one after another; same texts both ways: {same_text}")
    for cost in costs:
        print(f"width {cost['width']:>2}: {cost['s_per_step']:.3f} s a step, {cost['s_per_row']:.3f} s a row, "
              f"{cost['experts_per_layer_call']} experts a layer call")  # fmt: skip
    print(f"layers resident in RAM (stacked, as the in-RAM model): {resident}")
    figures = {"step_cost": costs, "resident_layers": resident, "medians": medians, "ratio": round(ratio, 3), "same_text": same_text, "results": results,
               "load": os.getloadavg()}  # fmt: skip
    config = {"reviews": args.reviews, "width": args.width, "part_tokens": args.part_tokens, "rounds": args.rounds}
    verdict = "win" if ratio > 1 and same_text else "loss"
    run_id = Catalogue(catalogue).record(Run("service-batch", path.name, config, figures, verdict,
                                             command="python " + " ".join(sys.argv)))  # fmt: skip
    print(f"recorded as run {run_id} in {catalogue}")


if __name__ == "__main__":
    main()
