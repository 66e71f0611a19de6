"""How true the dashboard's progress is for a batched narrative: its end, and its ETA at the halfway point.

    .venv/bin/python bench/batch_eta.py [--review month-end] [--model NAME] [--keep FILE]

Writes the review's narrative (split: a summary and one answer per finding, decoded as one batch) on the
model, keeping the run's progress record as the service stores it (app/daemon/work.py's `run_progress`,
once a second) with the time it was taken. Afterwards, for every record while writing, the ETA the dashboard
showed then (app/tui/widgets/job.py's `eta`, from the batch's answers) against the time the writing really
had left; the figure of issue [24] is the one nearest the halfway point of the writing (and of the whole
generation). Also checks that the progress ended at its real total (the bar's end equals the tokens
written). `--keep FILE` pickles the narrative, so its report can be laid out again (bench/report_pages.py).
Prints a table and one JSON line; records the run in the run catalogue (kind `batch-eta`).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

from nightshift.app.daemon.work import run_progress
from nightshift.app.models import open_for_generation, resolve_model
from nightshift.app.paths import catalogue_file
from nightshift.app.review.narrative import write_narrative
from nightshift.app.review.runner import prepare_review
from nightshift.app.review.schedule import find_schedule
from nightshift.app.tui.widgets.job import bar_total, eta
from nightshift.engine.generation import GenerationStats
from nightshift.engine.instruments.catalogue import Catalogue, Run

EVERY_S = 1.0  # as the service stores a running run's progress


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--review", default="month-end")
    parser.add_argument("--model", default=None, help="a model name or directory (default: the default model)")
    parser.add_argument("--keep", type=Path, help="pickle the narrative here (to lay its report out again)")
    args = parser.parse_args()
    schedule = find_schedule(args.review)
    prepared = prepare_review(schedule, schedule.as_of)
    path = resolve_model(args.model)
    model = open_for_generation(path)
    settings = schedule.generation
    records: list[tuple[float, object]] = []
    last = [0.0]

    def record(stats: GenerationStats, text: str) -> None:
        now = time.monotonic()
        if now - last[0] >= EVERY_S or stats.finish_reason is not None:
            last[0] = now
            records.append((now, run_progress(stats, settings.tokens_at_most, text)))

    started = time.monotonic()
    narrative = write_narrative(model, prepared.prompt, settings.answer_tokens, settings.temp, settings.seed, record)
    ended = time.monotonic()
    model.close()
    if args.keep:
        args.keep.write_bytes(pickle.dumps(narrative))
    final = records[-1][1]
    writing = [(t, p) for t, p in records if p.generated_tokens > 1 and p.finish_reason is None]
    first = next(t for t, p in records if p.generated_tokens)
    rows = []
    for t, progress in writing:
        shown, _ = eta(progress, None)
        rows.append({"at_s": round(t - started, 1), "tokens": progress.generated_tokens,
                     "of_at_most": bar_total(progress), "eta_s": None if shown is None else round(shown, 1),
                     "left_s": round(ended - t, 1)})  # fmt: skip
    print(f"{'at s':>7} {'tokens':>7} {'at most':>8} {'ETA s':>7} {'left s':>7} {'ETA/left':>9}")
    for row in rows:
        ratio = row["eta_s"] / row["left_s"] if row["eta_s"] is not None and row["left_s"] > 0 else None
        print(f"{row['at_s']:>7} {row['tokens']:>7} {row['of_at_most']:>8} {row['eta_s']!s:>7} {row['left_s']:>7} "
              f"{'' if ratio is None else f'{ratio:.2f}':>9}")  # fmt: skip

    def nearest(moment: float) -> dict:
        return min(rows, key=lambda row: abs(started + row["at_s"] - moment))

    halfway_writing = nearest(first + (ended - first) / 2)
    halfway_run = nearest(started + (ended - started) / 2) if started + (ended - started) / 2 >= first else None
    figures = {
        "answers": len(final.answers), "limits": [a.max_tokens for a in final.answers],
        "written": [a.tokens for a in final.answers], "endings": [a.finish_reason for a in final.answers],
        "generated_tokens": final.generated_tokens, "bar_end": bar_total(final), "schedule_bound": settings.tokens_at_most,
        "prompt_s": round(first - started, 1), "writing_s": round(ended - first, 1),
        "halfway_writing": halfway_writing, "halfway_run": halfway_run, "rows": rows,
    }  # fmt: skip
    for name in ("halfway_writing", "halfway_run"):
        row = figures[name]
        if row and row["eta_s"] is not None:
            row["error"] = round(row["eta_s"] / row["left_s"] - 1, 3)
    print(f"answers {figures['answers']} (limits {figures['limits']}), written {figures['written']} "
          f"({figures['endings']}); bar ends at {figures['bar_end']} of {final.generated_tokens} written "
          f"(the schedule's bound: {settings.tokens_at_most})")  # fmt: skip
    print(f"ETA at the writing's halfway: {halfway_writing}; at the run's: {halfway_run}")
    print(json.dumps(figures))
    config = {"review": args.review, "part_tokens": settings.part_tokens, "batch_width": settings.batch_width}
    run_id = Catalogue(catalogue_file()).record(Run("batch-eta", path.name, config, figures, "pass",
                                                    command="python " + " ".join(sys.argv)))  # fmt: skip
    print(f"recorded as run {run_id} in {catalogue_file()}")


if __name__ == "__main__":
    main()
