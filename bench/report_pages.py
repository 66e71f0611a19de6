"""The bundled reviews' reports laid out and drawn as PNG pages, to look at (before and after a layout change).

    .venv/bin/python bench/report_pages.py OUT [--narrative FILE] [--dpi 60] [--reviews month-end daily ...]

Each bundled review is checked over its pinned period and its report written (app/review/runner.py's
`write_report`, the service's own path) with a narrative: the one pickled by `bench/batch_eta.py --keep`
(a real month-end batch: its text, figures and answers) or, without one, a short fixed text. The other
reviews get that narrative's figures with a text of their own. Each PDF is drawn with `pdftoppm` into
OUT/<review>-<page>.png. Nothing is written to the data dir: it runs in a temporary one.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

SHORT = (
    "The period's books were checked against the bank; the findings below are what did not agree.\nF1: see the table."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--narrative", type=Path, help="a narrative pickled by bench/batch_eta.py --keep")
    parser.add_argument("--dpi", type=int, default=60)
    parser.add_argument("--reviews", nargs="*", help="bundled review names (default: all)")
    args = parser.parse_args()
    os.environ["NIGHTSHIFT_HOME"] = tempfile.mkdtemp(prefix="report-pages-")
    from nightshift.app.review.narrative import Prompt, read_narrative
    from nightshift.app.review.runner import run_checks_for, write_report
    from nightshift.app.review.schedule import load_schedules
    from nightshift.engine.generation import GenerationStats

    recorded = pickle.loads(args.narrative.read_bytes()) if args.narrative else None
    schedules, _ = load_schedules()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.reviews or sorted(schedules):
        schedule = schedules[name]
        checked = run_checks_for(schedule, schedule.as_of)
        if recorded is None:
            narrative = read_narrative(SHORT, GenerationStats(prompt_tokens=400, generated_tokens=60, elapsed=30.0))
        elif name == "month-end":
            narrative = recorded
        else:
            narrative = replace(read_narrative(SHORT, recorded.stats), batch=recorded.batch, shared=recorded.shared)
        split = narrative.batch is not None  # the report's gate reads the narrative against its prompt
        prompt = Prompt("system", "summary", len(checked.result.findings), ("a", "b") if split else (),
                        "split" if split else "single")  # fmt: skip
        entry = write_report(schedule, schedule.as_of, checked, prompt, narrative, "/models/smollm2-135m-instruct-moe",
                             time.monotonic())  # fmt: skip
        pdf = args.out / f"{name}.pdf"
        shutil.copy(entry.path, pdf)
        for old in args.out.glob(f"{name}-*.png"):
            old.unlink()
        subprocess.run(["pdftoppm", "-r", str(args.dpi), "-png", str(pdf), str(args.out / name)], check=True)
        pages = sorted(args.out.glob(f"{name}-*.png"))
        print(f"{name}: {len(pages)} page(s): {pdf}")
    shutil.rmtree(os.environ["NIGHTSHIFT_HOME"])


if __name__ == "__main__":
    main()
