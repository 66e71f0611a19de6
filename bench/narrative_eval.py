"""The narrative evaluation: every review's narrative, as its PDF prints it, scored for what a signer must not see.

    .venv/bin/python -m bench.narrative_eval [--books 23] [--model NAME]... [--penalty 1.3]... [--bundled]

On generated books (bench/narrative_books.py: languages, formats, sizes, planted faults), the held-out German
month-end (bench/helpers/german.py) and, with
--bundled, the bundled reviews, each review runs as `review run` does (checks, prompt, narrative, report
context) on each model and repetition penalty, and the report's HTML (what WeasyPrint lays out) is scored
from the narrative box alone, without the gate's own records:

- figures not placed: a digit in the box's text outside the template's placed figures and F-tags;
- wrong figures: a placed figure whose text is not its role's value in its finding (or the summary);
- misattributed figures: a figure the box's sentence puts in another role (verify.placed re-reads the
  printed text, the template's own sentences included);
- degenerate sentences: a four-word run twice in a sentence, a paragraph that ends mid-sentence, words
  about the text itself in a model sentence, a sentence printed twice;
- high findings not covered: neither a line of their own nor counted in the summary's range.

Beside the scores it keeps what the model did (sentences written, kept, refused by reason), what the grounding
check (app/review/grounding.py, a schedule's `[model] grounding`) would refuse of the sentences kept without it,
and the time of each narrative. Prints a table per model and penalty and one JSON line; records each pass in the run
catalogue (kind `narrative-eval`).
"""

from __future__ import annotations

import argparse
import html as html_text
import json
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.narrative_books import evaluation_books, held_out
from nightshift.app.models import open_for_generation, resolve_model
from nightshift.app.paths import catalogue_file
from nightshift.app.review.checks import Finding
from nightshift.app.review.narrative import by_severity, shown_narrative, write_narrative
from nightshift.app.review.report import render_html
from nightshift.app.review.roles import cues, written
from nightshift.app.review.runner import _provenance, build_report_context, prepare_review
from nightshift.app.review.schedule import Schedule, load_schedule, load_schedules
from nightshift.app.review.verify import placed
from nightshift.engine.instruments.catalogue import Catalogue, Run

PLACED = re.compile(r'<span class="(?:verified|name)" title="placed from the finding: (\w+)">(.*?)</span>')
FOUR = 4


def score(page: str, findings: list[Finding], period: str, previous: str) -> dict[str, Any]:
    """The narrative box of a report's HTML, scored (see the module's doc)."""
    box = page[page.index('<div class="model-written">') : page.index("</div>", page.index('class="model-written"'))]
    box = re.sub(r'<p class="disclaimer">.*?</p>', "", box, flags=re.S)
    counts = by_severity(findings)
    summary_roles = {"findings": sum(f.stands_for for f in findings), **counts, "period": period,
                     "previous": previous}  # fmt: skip
    out = Counter()
    lines, sentences_seen = set(), Counter()
    counted: set[int] = set()
    for paragraph in re.findall(r"<p>(.*?)</p>", box, flags=re.S):
        tag = re.match(r"F(\d+): ", paragraph)
        number = int(tag.group(1)) if tag else None
        body = paragraph[tag.end() :] if tag else paragraph
        roles = summary_roles if number is None else {"period": period, "previous": previous,
                                                      **findings[number - 1].figures.roles}  # fmt: skip
        if number is not None:
            lines.add(number)
        for role, shown in PLACED.findall(body):
            out["placed figures"] += 1
            out["wrong figures"] += role not in roles or html_text.unescape(shown) != written(roles[role])
        bare = html_text.unescape(re.sub(r"<[^>]+>", "", PLACED.sub("", body)))
        out["figures not placed"] += len(re.findall(r"\d+", re.sub(r"\bF\d+\b", "", bare)))
        printed = html_text.unescape(re.sub(r"<[^>]+>", "", body))
        left = re.search(r"see F(\d+) to F(\d+)", printed)
        if number is None and left:
            counted |= set(range(int(left.group(1)), int(left.group(2)) + 1))
        out["degenerate"] += not re.search(r"[.!?)]$", printed.strip())
        for sentence, model in _sentences(body):
            out["sentences printed"] += 1
            out["model sentences printed"] += model
            words = re.findall(r"[^\W\d_]+", sentence.lower())  # figures are not words: 1,205.00 on 2026-10-28
            grams = [tuple(words[i : i + FOUR]) for i in range(len(words) - FOUR + 1)]
            meta = model and re.search(r"\b(summary|sentences?|here is|as an ai)\b", sentence, re.I)
            sentences_seen[sentence] += 1
            out["degenerate"] += len(grams) != len(set(grams)) or bool(meta) or sentences_seen[sentence] == 2
            _, problem = placed(sentence, roles, cues(roles), len(findings))
            out["misattributed figures"] += problem is not None
    high = {n for n, f in enumerate(findings, 1) if f.severity == "high"}
    out["high findings"] = len(high)
    out["high not covered"] = len(high - lines - counted)
    return dict(out)


def _sentences(body: str) -> list[tuple[str, bool]]:
    """A paragraph's sentences as printed (figures as the text shows them), each with whether the model wrote it."""
    parts = re.split(r"(<em>.*?</em>)", body, flags=re.S)
    out = []
    for part in parts:
        model = not part.startswith("<em>")
        text = html_text.unescape(re.sub(r"<[^>]+>", "", part)).strip()
        out += [(s, model) for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
    return out


def review_figures(schedule: Schedule, model, penalty: float | None) -> dict[str, Any]:
    """One review's narrative written (at `penalty`, None: the schedule's), its report's HTML rendered and scored."""
    if penalty is not None:
        schedule = replace(schedule, generation=replace(schedule.generation, repetition_penalty=penalty))
    prepared = prepare_review(schedule, schedule.as_of)
    settings = schedule.generation
    started = time.perf_counter()
    narrative = write_narrative(model, prepared.prompt, settings.answer_tokens, settings.temp, settings.seed)
    seconds = time.perf_counter() - started
    checked = prepared.checked
    provenance = _provenance(schedule, checked, model.path, narrative)
    context = build_report_context(schedule, checked, prepared.prompt, narrative, provenance, datetime.now(UTC))
    page = render_html(schedule.report_template, context)
    gated = context["narrative"].gated
    findings = checked.result.findings
    grounded = shown_narrative(narrative, prepared.prompt, findings, checked.window.label, checked.previous.label,
                               grounding=True).gated  # fmt: skip
    ungrounded = [(r.finding, r.detail, r.text) for r in grounded.refused if r.reason == "ungrounded"]
    model_lines = sum(any(not s.plain for s in line) for line in gated.lines.values())
    return {
        "review": schedule.name, "findings": len(findings), "given": prepared.prompt.findings_given,
        "narrative_s": round(seconds, 1), "prompt_tokens": narrative.stats.prompt_tokens,
        "generated_tokens": narrative.stats.generated_tokens, "written": gated.written, "kept": gated.kept,
        "refused": dict(Counter(r.reason for r in gated.refused)), "lines_with_model_text": model_lines,
        "model_sentences": [s.text for s in gated.summary if not s.plain]
        + [s.text for line in gated.lines.values() for s in line if not s.plain],
        "refusals": [(r.finding, r.reason, r.text) for r in gated.refused],
        "kept_sentences": [(None, s.text) for s in gated.summary if not s.plain]
        + [(n, s.text) for n, line in gated.lines.items() for s in line if not s.plain],
        "ungrounded": len(ungrounded), "ungrounded_sentences": ungrounded,
        **score(page, findings, checked.window.label, checked.previous.label),
    }  # fmt: skip


TOTALS = ("findings", "high findings", "written", "kept", "ungrounded", "lines_with_model_text", "sentences printed",
          "model sentences printed", "placed figures", "figures not placed", "wrong figures",
          "misattributed figures", "degenerate", "high not covered")  # fmt: skip


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = {key: sum(row.get(key, 0) for row in rows) for key in TOTALS}
    out["refused"] = dict(sum((Counter(row["refused"]) for row in rows), Counter()))
    out["narrative_s median"] = statistics.median(row["narrative_s"] for row in rows)
    out["narrative_s total"] = round(sum(row["narrative_s"] for row in rows), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--books", type=int, default=23, help="generated sets of books")
    parser.add_argument("--model", action="append", help="a model name or directory (default: the default model)")
    parser.add_argument(
        "--penalty",
        action="append",
        type=float,
        help="repetition penalties to run (default: each schedule's, 1.3 unless it says)",
    )
    parser.add_argument("--bundled", action="store_true", help="the bundled reviews too")
    parser.add_argument("--out", type=Path, help="write every review's figures here as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="narrative-eval-") as scratch:  # the books and PDFs are not kept
        folder = Path(scratch)
        books = evaluation_books(folder, args.books) + held_out(folder)
        reviews = [load_schedule(book.schedule) for book in books]
        if args.bundled:
            reviews += list(load_schedules()[0].values())
        results = []
        for name in args.model or [None]:
            path = resolve_model(name)
            model = open_for_generation(path)
            for penalty in args.penalty or [None]:
                rows = []
                for schedule in reviews:
                    rows.append(review_figures(schedule, model, penalty))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                summed = totals(rows)
                results.append({"model": path.name, "penalty": penalty, "totals": summed, "reviews": rows})
                print(f"--- {path.name}, repetition penalty {penalty}: {len(rows)} reviews")
                for key, value in summed.items():
                    print(f"  {key:<26}{value}")
                config = {"books": args.books, "bundled": args.bundled, "penalty": penalty, "reviews": len(rows)}
                run_id = Catalogue(catalogue_file()).record(
                    Run("narrative-eval", path.name, config, summed, "pass", command="python " + " ".join(sys.argv))
                )
                print(f"  recorded as run {run_id} in {catalogue_file()}")
            model.close()
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1, default=str))
    print(json.dumps([{k: v for k, v in r.items() if k != "reviews"} for r in results], default=str))


if __name__ == "__main__":
    main()
