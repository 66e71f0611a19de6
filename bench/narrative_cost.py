"""What a review's narrative adds to its time: the same review with the narrative off and on, side by side.

    .venv/bin/python -m bench.narrative_cost [--review month-end] [--rounds 2] [--model NAME] [--chunk 16 --chunk 2048]

One process, one loaded model (its opening is timed once, apart: the service keeps it loaded). Each round runs
the review off, split, single, single, split, off (so a neighbour's load falls on every variant alike); a
review is the whole of it but the index: sources and checks, the prompt, the narrative (off: none, the
report's narrative is the template's own sentences), the gate, the report's HTML and its PDF. With several
`--chunk`s (prompt rows read a pass) each narrative runs at each, side by side in the same order. Prints each run
(its prompt's first token and its decoding apart), the medians and what the narrative adds to the review off;
records the run in the run catalogue (kind `narrative-cost`). One review off runs first, uncounted: the first PDF
of a process loads WeasyPrint and its fonts.
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
from nightshift.app.review.narrative import NARRATIVE_CHUNK, Narrative, write_narrative
from nightshift.app.review.report import render_html, write_pdf
from nightshift.app.review.runner import _provenance, build_report_context, prepare_review
from nightshift.app.review.schedule import Schedule, find_schedule
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.runtime import Model

VARIANTS = ("off", "split", "single")


def review(
    schedule: Schedule, model: Model, variant: str, folder: Path, chunk: int = NARRATIVE_CHUNK
) -> dict[str, Any]:
    """One review, timed: the narrative `variant` (off, split or single), its prompts read `chunk` rows a pass."""
    started = time.perf_counter()
    if variant != "off":
        schedule = replace(schedule, generation=replace(schedule.generation, narrative=variant))
    prepared = prepare_review(schedule, schedule.as_of)
    settings = schedule.generation
    narrative, prompt, writing = Narrative(""), None, 0.0
    if variant != "off":
        prompt = prepared.prompt
        begun = time.perf_counter()
        narrative = write_narrative(model, prompt, settings.answer_tokens, settings.temp, settings.seed,
                                    prefill_chunk=chunk)  # fmt: skip
        writing = time.perf_counter() - begun
    provenance = _provenance(schedule, prepared.checked, model.path, narrative)
    context = build_report_context(schedule, prepared.checked, prompt, narrative, provenance, datetime.now(UTC))
    write_pdf(render_html(schedule.report_template, context), folder / f"{variant}.pdf")
    stats = narrative.stats
    return {
        "variant": _name(variant, chunk), "review_s": round(time.perf_counter() - started, 2),
        "narrative_s": round(writing, 2), "prompt_tokens": stats.prompt_tokens,
        "generated_tokens": stats.generated_tokens, "first_token_s": round(stats.time_to_first_token, 2),
        "decode_s": round(stats.elapsed - stats.time_to_first_token, 2) if variant != "off" else 0.0,
        "decode_tokens_per_s": round(stats.decode_tokens_per_s, 2),
        "replaced": len(context["narrative"].gated.refused),
    }  # fmt: skip


def _name(variant: str, chunk: int) -> str:
    """A variant's name in the output: the chunk added where it is not the narrative's own."""
    return variant if variant == "off" or chunk == NARRATIVE_CHUNK else f"{variant}@{chunk}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--review", default="month-end")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of off, split, single, single, split, off")
    parser.add_argument("--model", default=None, help="a model name or directory (default: the default model)")
    parser.add_argument("--chunk", type=int, action="append",
                        help=f"prompt rows read a pass, repeatable (default: the narrative's, {NARRATIVE_CHUNK})")  # fmt: skip
    args = parser.parse_args()
    chunks = args.chunk or [NARRATIVE_CHUNK]
    if min(chunks) < 1:
        parser.error(f"--chunk {min(chunks)}: a pass reads at least 1 row")
    variants = ("off", *(_name(v, c) for c in chunks for v in VARIANTS[1:]))
    schedule = find_schedule(args.review)
    path = resolve_model(args.model)
    opened = time.perf_counter()
    model = open_for_generation(path)
    open_s = time.perf_counter() - opened
    with tempfile.TemporaryDirectory(prefix="narrative-cost-") as scratch:  # the PDFs are not kept
        folder = Path(scratch)
        review(schedule, model, "off", folder)  # warm-up, not counted: the first PDF loads WeasyPrint and the fonts
        runs = []
        for _ in range(args.rounds):
            order = [("off", chunks[0]), *((v, c) for c in chunks for v in VARIANTS[1:])]
            for variant, chunk in (*order, *reversed(order)):
                runs.append(review(schedule, model, variant, folder, chunk))
                print(json.dumps(runs[-1]), flush=True)
        model.close()

    def median(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["variant"] == variant)

    medians = {v: median(v, "review_s") for v in variants}
    added = {v: round((medians[v] - medians["off"]) / medians["off"] * 100, 1) for v in variants if v != "off"}
    parts = {v: {k: median(v, k) for k in ("first_token_s", "decode_s", "decode_tokens_per_s")} for v in variants}
    figures = {"model_open_s": round(open_s, 2), "median_review_s": medians, "added_pct": added,
               "median_narrative_parts": parts, "runs": runs}  # fmt: skip
    print(f"model opened in {open_s:.1f} s (once; not in the reviews' times)")
    for variant in variants:
        extra = f", +{added[variant]} % over off" if variant in added else ""
        part = parts[variant]
        writing = (f" (first token {part['first_token_s']:.1f} s, decoding {part['decode_s']:.1f} s at "
                   f"{part['decode_tokens_per_s']:.1f} tok/s)") if variant != "off" else ""  # fmt: skip
        print(f"{variant:<11} median {medians[variant]:.1f} s{extra}{writing}")
    config = {"review": args.review, "rounds": args.rounds, "chunks": chunks,
              **{k: str(v) for k, v in vars(schedule.generation).items()}}  # fmt: skip
    run_id = Catalogue(catalogue_file()).record(
        Run("narrative-cost", path.name, config, figures, "pass", command="python " + " ".join(sys.argv))
    )
    print(json.dumps({k: v for k, v in figures.items() if k != "runs"}))
    print(f"recorded as run {run_id} in {catalogue_file()}")


if __name__ == "__main__":
    main()
