"""The bundled reviews' reports laid out and drawn: the layout rules of issue [24] that can be tested.

Each bundled review is checked over its pinned period and its report written on the service's own path
(`write_report`) with a narrative as a real split batch leaves it (nine answers, three at their limit, a
streamed store's figures). The PDF is read back with poppler (`pdftotext -bbox-layout`: every word and
where it is) and its last page drawn with `pdftoppm`; the rules:

- a figure keeps its unit on its line (no line starts with "%", "MB", "s", ...);
- a right-aligned numeric column's header ends where its numbers end;
- a chart labels its bars with the table's precision (19,751.61, not 19,752);
- the last page is not near-empty (a table's last rows alone on it);
- one writing rate per run, named, equal to the run's record; no per-answer rate that reads as a prompt's;
- "has no counterpart in ledger" never breaks before "in ledger".

The quick run checks month-end; the other six reviews are `slow`.
"""

from __future__ import annotations

import pickle
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from nightshift.app.review.narrative import Prompt, read_narrative
from nightshift.app.review.runner import run_checks_for, write_report
from nightshift.app.review.schedule import load_schedules
from nightshift.engine.batch import BatchStats, BatchText, ChatBatch
from nightshift.engine.generation import AnswerFigures, GenerationStats
from tests.helpers.reviews import report_context
from tests.helpers.shared import built_once

pytestmark = pytest.mark.skipif(not shutil.which("pdftoppm"), reason="poppler-utils (pdftoppm, pdftotext) missing")

UNITS = {"%", "MB", "GB", "s", "tok/s", "tokens/s", "days", "tokens"}
NUMBER = re.compile(r"^[+-]?\d[\d,]*(\.\d+)?%?$")
TEXT = ("The month closed with unmatched lines between the bank and the ledger, a duplicate posting and a balance "
        "that does not roll forward.\nF1: the receipt has no counterpart in the bank.\nF2: one of the two rows is "
        "counted twice.")  # fmt: skip
# Nine answers as the bundled month-end's split batch wrote them (bench/batch_eta.py, 2026-12-03): prompt tokens,
# tokens written, how each ended, seconds reading its prompt.
PARTS = [(393, 64, "length", 63.2), (134, 24, "stop", 20.1), (148, 19, "stop", 25.5), (137, 23, "stop", 27.2),
         (180, 64, "length", 19.9), (159, 56, "stop", 20.2), (157, 23, "stop", 19.7), (134, 25, "stop", 18.4),
         (135, 64, "length", 21.6)]  # fmt: skip


def batch_narrative():
    """A split narrative with the figures a real batch of nine answers leaves (a streamed store's, cached)."""
    answers = [AnswerFigures(prompt, 64, prompt, tokens, ended) for prompt, tokens, ended, _ in PARTS]
    stats = GenerationStats(prompt_tokens=sum(p for p, *_ in PARTS), prompt_done=sum(p for p, *_ in PARTS),
                            generated_tokens=362, time_to_first_token=235.8, elapsed=456.8, peak_memory_bytes=5 * 10**8,
                            finish_reason="length", drive_bytes={"store": 141_557_760}, cache_hits=33_563,
                            cache_misses=480, cache_budget=141_557_760, cache_used=141_557_760, prefetch_recall=1.0,
                            answers=answers)  # fmt: skip
    parts = [BatchText("", prompt, tokens, ended, seconds, 220.0) for prompt, tokens, ended, seconds in PARTS]
    narrative = read_narrative(TEXT, stats)
    narrative.batch = ChatBatch(parts, BatchStats(width=9, tokens=[t for _, t, _, _ in PARTS], steps=63,
                                                  decode_seconds=221.0), stats)  # fmt: skip
    return narrative


def single_narrative():
    """A one-answer narrative, short: the layout where the last tables once spilled alone onto a page."""
    stats = GenerationStats(prompt_tokens=412, generated_tokens=60, time_to_first_token=34.6, elapsed=64.0,
                            peak_memory_bytes=4 * 10**8, finish_reason="stop")  # fmt: skip
    return read_narrative("The books agree with the bank but for the findings below.\nF1: see the table.", stats)


NARRATIVES = {"batch": batch_narrative, "single": single_narrative}


@dataclass(frozen=True)
class Word:
    text: str
    page: int
    x0: float
    y0: float
    x1: float
    y1: float


@dataclass(frozen=True)
class Laid:
    """A review's report: its context, its PDF, every word with its place, its pages' sizes, its plain text."""

    context: dict
    pdf: Path
    words: list[Word]
    page_height: float
    pages: int
    text: str
    wrapped_starts: list[str]  # each text block's lines after its first (where a wrap put them), as read
    wrapped_starts: list[str]  # each text block's lines after its first (where a wrap put them), as read


WORD = re.compile(r'<word xMin="([\d.]+)" yMin="([\d.]+)" xMax="([\d.]+)" yMax="([\d.]+)">([^<]*)</word>')


def lay_out(name: str, narrative_kind: str) -> Laid:
    schedule = load_schedules()[0][name]
    checked = run_checks_for(schedule, schedule.as_of)
    narrative = NARRATIVES[narrative_kind]()
    split = narrative_kind == "batch"
    prompt = Prompt("system", "summary", len(checked.result.findings), ("a", "b") if split else (),
                    "split" if split else "single")  # fmt: skip
    entry = write_report(schedule, schedule.as_of, checked, prompt, narrative, "/models/smollm2-135m-instruct-moe",
                         time.monotonic())  # fmt: skip
    context = report_context(schedule, checked, narrative, prompt)
    xml = subprocess.run(["pdftotext", "-bbox-layout", entry.path, "-"], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    words, height = [], 0.0
    for number, page in enumerate(xml.split("<page ")[1:], 1):
        height = float(re.search(r'height="([\d.]+)"', page).group(1))
        words += [Word(text.replace("&amp;", "&"), number, float(a), float(b), float(c), float(d))
                  for a, b, c, d, text in WORD.findall(page)]  # fmt: skip
    text = subprocess.run(["pdftotext", "-layout", entry.path, "-"], capture_output=True, text=True, check=True).stdout
    wrapped = [" ".join(text for *_, text in WORD.findall(line))
               for block in xml.split("<block ")[1:] for line in block.split("<line ")[2:]]  # fmt: skip
    return Laid(context, Path(entry.path), words, height, max(w.page for w in words), text, wrapped)


def rows(words: list[Word]) -> list[list[Word]]:
    """Words on one page grouped into visual lines (same baseline), top to bottom, each left to right."""
    lines: dict[float, list[Word]] = {}
    for word in words:
        key = next((y for y in lines if abs(y - word.y1) < 2.0), word.y1)
        lines.setdefault(key, []).append(word)
    return [sorted(lines[y], key=lambda w: w.x0) for y in sorted(lines)]


CASES = [(name, "batch") for name in sorted(load_schedules()[0])] + [("weekly", "single")]


@pytest.fixture(scope="module", params=[
    pytest.param(case, id="-".join(case), marks=() if case == ("month-end", "batch") else pytest.mark.slow)
    for case in CASES
])  # fmt: skip
def laid(request, tmp_path_factory) -> Laid:
    """The case's report laid out once per session (its PDF in the session's shared folder): each xdist worker
    that runs one of its tests reads what the first one laid out (tests only read it)."""

    def keep(folder: Path) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("NIGHTSHIFT_HOME", str(folder / "home"))
            (folder / "laid.pickle").write_bytes(pickle.dumps(lay_out(*request.param)))

    return pickle.loads(
        (built_once(tmp_path_factory, "layout-" + "-".join(request.param), keep) / "laid.pickle").read_bytes()
    )


def test_no_unit_starts_a_line(laid):
    """A line of a text block that wrapped (not its first) never begins with a unit cut from its figure."""
    assert laid.wrapped_starts, "no wrapped lines found: the reading of the PDF is broken"
    orphans = [words for words in laid.wrapped_starts if words.split()[0] in UNITS]
    assert not orphans, f"a unit alone at the start of a line: {orphans}"


def test_numeric_headers_end_where_their_numbers_end(laid):
    """For every table whose last column is numeric: its header's right edge is its numbers' right edge."""
    checked = 0
    top, bottom = laid.page_height * 24 / 297, laid.page_height * 275 / 297  # inside the running header and footer
    for page in range(1, laid.pages + 1):
        lines = rows([w for w in laid.words if w.page == page and top < w.y0 and w.y1 < bottom])
        for n, line in enumerate(lines):
            header = line[-1]
            if header.text not in ("amount", "total", "difference", "findings", "s"):
                continue
            below = []
            for following in lines[n + 1 : n + 40]:
                last = following[-1]
                if last.text in ("amount", "total", "difference", "findings", "s") or last.x1 < header.x0:
                    break
                if NUMBER.match(last.text):
                    below.append(last)
            assert below, f"page {page}: no numbers under {header.text!r}"
            misplaced = [w.text for w in below if abs(w.x1 - header.x1) > 1.5]
            assert not misplaced, (
                f"page {page}: {header.text!r} ends at {header.x1:.1f}, its numbers {misplaced} do not"
            )
            checked += 1
    assert checked >= 3  # the checks on the title page, the findings, and at least one summary table


def test_charts_label_bars_with_the_tables_precision(laid):
    for table, chart in laid.context["tables"]:
        if chart is None:
            continue
        labels = re.findall(r">([+-]?\d[\d,.]*)</text>", str(chart))
        cells = {cell for row in table.rows for cell in row}
        assert labels and set(labels) <= cells, f"{table.title}: chart labels {set(labels) - cells} not in the table"


def test_the_last_page_is_not_near_empty(laid):
    """Drawn with pdftoppm: the last page's ink reaches at least a fifth of the way down its text area."""
    drawn = subprocess.run(["pdftoppm", "-gray", "-r", "30", "-f", str(laid.pages), "-l", str(laid.pages),
                            str(laid.pdf)], capture_output=True, check=True).stdout  # fmt: skip
    _, rest = drawn.split(b"\n", 1)  # P5
    sizes, rest = rest.split(b"\n", 1)
    width, height = map(int, sizes.split())
    _, pixels = rest.split(b"\n", 1)
    page = np.frombuffer(pixels[: width * height], dtype=np.uint8).reshape(height, width)
    top, bottom = int(height * 24 / 297), int(height * 275 / 297)  # the text area, inside header and footer
    inked = np.nonzero((page[top:bottom] < 200).any(axis=1))[0]
    filled = (inked.max() + 1) / (bottom - top) if len(inked) else 0.0
    assert laid.pages == 1 or filled >= 0.2, f"the last page ({laid.pages}) is {filled:.0%} filled"


def test_one_writing_rate_named_and_equal_to_the_record(laid):
    stats = laid.context["provenance"].stats
    flat = " ".join(laid.text.split())
    rates = re.findall(r"([\d.]+) tok/s", flat)
    assert rates == [f"{stats.decode_tokens_per_s:.1f}"], rates  # the run record's figure (work.py), once
    assert "over the time from the first token to the last" in flat  # its meaning named
    assert not re.search(r"read in [\d.]+ s, [\d.]+ tok/s", flat)  # no per-answer rate beside its prompt


def test_a_phrase_that_ends_a_clause_stays_with_its_word(laid):
    flat_lines = [" ".join(line.split()) for line in laid.text.splitlines()]
    for finding in laid.context["findings"]:
        if found := re.search(r"has no counterpart in (\S+) \(", finding.detail):
            assert any(f"counterpart in {found.group(1)}" in line for line in flat_lines), finding.detail
