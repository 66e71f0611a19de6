"""What a review's narrative adds to its time: the same review with the narrative off and on, side by side.

    .venv/bin/python -m bench.narrative_cost [--review month-end] [--rounds 2] [--model NAME]

One process, one loaded model (its opening is timed once, apart: the service keeps it loaded). Each round runs
the review off, split, single, single, split, off (so a neighbour's load falls on every variant alike); a
review is the whole of it but the index: sources and checks, the prompt, the narrative (off: none, the
report's narrative is the template's own sentences), the gate, the report's HTML and its PDF. Prints each run,
the medians and what the narrative adds to the review off; records the run in the run catalogue (kind
`narrative-cost`). One review off runs first, uncounted: the first PDF of a process loads WeasyPrint and its fonts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nightshift.app.models import open_for_generation, resolve_model
from nightshift.app.paths import catalogue_file
from nightshift.app.review.narrative import Narrative, write_narrative
from nightshift.app.review.report import render_html, write_pdf
from nightshift.app.review.runner import _provenance, build_report_context, prepare_review
from nightshift.app.review.schedule import Schedule, find_schedule
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.runtime import Model

VARIANTS = ("off", "split", "single")


def review(schedule: Schedule, model: Model, variant: str, folder: Path) -> dict[str, Any]:
    """One review, timed: the narrative `variant` (off, split or single)."""
    started = time.perf_counter()
    if variant != "off":
        schedule = replace(schedule, generation=replace(schedule.generation, narrative=variant))
    prepared = prepare_review(schedule, schedule.as_of)
    settings = schedule.generation
    narrative, prompt, writing = Narrative(""), None, 0.0
    if variant != "off":
        prompt = prepared.prompt
        begun = time.perf_counter()
        narrative = write_narrative(model, prompt, settings.answer_tokens, settings.temp, settings.seed)
        writing = time.perf_counter() - begun
    provenance = _provenance(schedule, prepared.checked, model.path, narrative)
    context = build_report_context(schedule, prepared.checked, prompt, narrative, provenance, datetime.now(UTC))
    write_pdf(render_html(schedule.report_template, context), folder / f"{variant}.pdf")
    stats = narrative.stats
    return {
        "variant": variant, "review_s": round(time.perf_counter() - started, 2), "narrative_s": round(writing, 2),
        "prompt_tokens": stats.prompt_tokens, "generated_tokens": stats.generated_tokens,
        "first_token_s": round(stats.time_to_first_token, 2), "replaced": len(context["narrative"].gated.refused),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--review", default="month-end")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of off, split, single, single, split, off")
    parser.add_argument("--model", default=None, help="a model name or directory (default: the default model)")
    args = parser.parse_args()
    schedule = find_schedule(args.review)
    path = resolve_model(args.model)
    opened = time.perf_counter()
    model = open_for_generation(path)
    open_s = time.perf_counter() - opened
    folder = Path(tempfile.mkdtemp(prefix="narrative-cost-"))
    review(schedule, model, "off", folder)  # warm-up, not counted: the first PDF loads WeasyPrint and the fonts
    runs = []
    for _ in range(args.rounds):
        for variant in (*VARIANTS, *reversed(VARIANTS)):
            runs.append(review(schedule, model, variant, folder))
            print(json.dumps(runs[-1]), flush=True)
    model.close()
    medians = {v: statistics.median(r["review_s"] for r in runs if r["variant"] == v) for v in VARIANTS}
    added = {v: round((medians[v] - medians["off"]) / medians["off"] * 100, 1) for v in VARIANTS if v != "off"}
    figures = {"model_open_s": round(open_s, 2), "median_review_s": medians, "added_pct": added, "runs": runs}
    print(f"model opened in {open_s:.1f} s (once; not in the reviews' times)")
    for variant in VARIANTS:
        extra = f", +{added[variant]} % over off" if variant in added else ""
        print(f"{variant:<7} median {medians[variant]:.1f} s{extra}")
    config = {"review": args.review, "rounds": args.rounds, **{k: str(v) for k, v in vars(schedule.generation).items()}}
    run_id = Catalogue(catalogue_file()).record(
        Run("narrative-cost", path.name, config, figures, "pass", command="python " + " ".join(sys.argv))
    )
    print(json.dumps({k: v for k, v in figures.items() if k != "runs"}))
    print(f"recorded as run {run_id} in {catalogue_file()}")


if __name__ == "__main__":
    main()
