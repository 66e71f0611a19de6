"""A review's narrative as one prompt (single) or as a summary plus one prompt per finding in one batch (split).

    .venv/bin/python -m bench.narrative_split [--review month-end] [--model NAME] [--rounds 1]

Side by side in one process on one loaded model (the default model unless --model): each round writes the
review's narrative single, split, split, single (ABBA, so a cache warming or a neighbour's load falls on
both), and times reading the prompt(s), writing, and the whole narrative. Its text then passes the report's
gate (app/review/runner.py's build_report_context): sentences written, kept and refused, and the findings
given to the model whose line keeps a sentence of the model's, and one stating a figure of their own.
Prints a table and one JSON line; records the run in the run catalogue (kind `narrative-split`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from nightshift.app.models import open_for_generation, resolve_model
from nightshift.app.paths import catalogue_file
from nightshift.app.review.narrative import Narrative, Prompt, build_prompt, write_narrative
from nightshift.app.review.runner import Checked, _provenance, build_report_context, run_checks_for
from nightshift.app.review.schedule import Schedule, find_schedule
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.runtime import Model

MODES = ("single", "split")


def narrative_figures(schedule: Schedule, checked: Checked, model: Model, mode: str) -> dict[str, Any]:
    """One narrative written in `mode`: its times and the narrative check's counts."""
    settings = replace(schedule.generation, narrative=mode)
    schedule = replace(schedule, generation=settings)
    prompt = build_prompt(schedule.prompt_template, schedule.title, checked.window.label, checked.result,
                          settings.prompt_findings, mode, settings.batch_width)  # fmt: skip
    started = time.perf_counter()
    narrative = write_narrative(model, prompt, settings.answer_tokens, settings.temp, settings.seed)
    total = time.perf_counter() - started
    stats = narrative.stats
    reading = narrative.batch.stats.prefill_seconds if narrative.batch else stats.time_to_first_token
    figures = {
        "mode": mode, "total_s": round(total, 2), "prompt_s": round(reading, 2),
        "writing_s": round(total - reading, 2), "prompt_tokens": stats.prompt_tokens,
        "generated_tokens": stats.generated_tokens, **check_counts(schedule, checked, narrative, prompt),
        "text": narrative.text,
    }  # fmt: skip
    if narrative.batch is not None:
        batch = narrative.batch
        figures["batch"] = {
            "width": batch.stats.width, "steps": batch.stats.steps,
            "decode_tok_s": round(batch.stats.decode_tokens_per_s, 2),
            "parts": [{"prompt_tokens": p.prompt_tokens, "tokens": p.tokens, "finish": p.finish_reason,
                       "prompt_s": round(p.prefill_seconds, 2), "tok_s": round(p.decode_tokens_per_s, 2)}
                      for p in batch.parts],
        }  # fmt: skip
    else:
        figures["decode_tok_s"] = round(stats.decode_tokens_per_s, 2)
    return figures


def check_counts(schedule: Schedule, checked: Checked, narrative: Narrative, prompt: Prompt) -> dict[str, int]:
    """The report's gate on the text: sentences written, kept, refused; findings with a model sentence, with a figure."""
    provenance = _provenance(schedule, checked, "bench", narrative)
    context = build_report_context(schedule, checked, prompt, narrative, provenance, datetime.now(UTC))
    shown = context["narrative"]
    comments = {n: " ".join(text) for n, text in shown.comments.items() if 1 <= n <= prompt.findings_given}
    return {
        "written": shown.gated.written, "kept": shown.gated.kept, "refused": len(shown.gated.refused),
        "findings_given": prompt.findings_given, "findings_covered": len(comments),
        "findings_with_own_figure": sum('class="verified"' in text for text in comments.values()),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--review", default="month-end")
    parser.add_argument("--model", default=None, help="a model name or directory (default: the default model)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of single, split, split, single")
    args = parser.parse_args()
    schedule = find_schedule(args.review)
    checked = run_checks_for(schedule, schedule.as_of)
    path = resolve_model(args.model)
    model = open_for_generation(path)
    runs = [narrative_figures(schedule, checked, model, mode) for _ in range(args.rounds)
            for mode in (*MODES, *reversed(MODES))]  # fmt: skip
    model.close()
    keys = ("total_s", "prompt_s", "writing_s", "generated_tokens", "written", "kept", "refused",
            "findings_covered", "findings_with_own_figure")  # fmt: skip
    medians = {
        mode: {key: statistics.median(r[key] for r in runs if r["mode"] == mode) for key in keys} for mode in MODES
    }
    print(f"{'':<26}" + "".join(f"{mode:>12}" for mode in MODES))
    for key in keys:
        print(f"{key:<26}" + "".join(f"{medians[mode][key]:>12}" for mode in MODES))
    for r in runs:
        print(
            f"--- {r['mode']}: {r['total_s']} s, {r.get('batch', {}).get('decode_tok_s', r.get('decode_tok_s'))} tok/s\n{r['text']}"
        )
    figures = {"medians": medians, "runs": runs, "findings": checked.result.total_findings}
    print(json.dumps(figures))
    config = {"review": args.review, "rounds": args.rounds, "max_tokens": schedule.generation.max_tokens,
              "part_tokens": schedule.generation.part_tokens, "batch_width": schedule.generation.batch_width}  # fmt: skip
    run_id = Catalogue(catalogue_file()).record(Run("narrative-split", path.name, config, figures, "pass",
                                                    command="python " + " ".join(sys.argv)))  # fmt: skip
    print(f"recorded as run {run_id} in {catalogue_file()}")


if __name__ == "__main__":
    main()
