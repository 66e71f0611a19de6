"""A review's narrative split into a summary and one paragraph per finding, written as one batch.

Each part of a batched narrative is the text that part's chat gets alone (greedy); each finding's
paragraph becomes its "F<n>: " line, so its numbers are checked against that finding's own figures;
the report's provenance shows the batch.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from nightshift.app.review.errors import ReviewError, ScheduleError
from nightshift.app.review.narrative import CONTROL, build_prompt, split_answers, write_narrative
from nightshift.app.review.report import render_html
from nightshift.app.review.runner import Checked
from nightshift.app.review.schedule import load_schedule
from nightshift.engine.generation import BatchText, GenerationStats
from nightshift.engine.runtime import open_model
from tests.helpers.reviews import report_context
from tests.helpers.service import user_schedule

TOKENS = 6


def split_prompt(schedule, checked: Checked, width: int):
    return build_prompt(schedule.prompt_template, schedule.title, checked.window.label, checked.result, 10,
                        "split", width)  # fmt: skip


def test_a_batched_narrative_s_parts_equal_each_part_written_alone(tiny_model, month_end):
    schedule, checked = month_end
    model = open_model(tiny_model)
    prompt = split_prompt(schedule, checked, width=4)
    assert len(prompt.conversations) == 4  # the summary and F1-F3
    seen = []
    batch = model.generate_batch(
        prompt.conversations,
        TOKENS,
        progress=lambda s, texts: seen.append((s.generated_tokens, s.finish_reason, texts)),
    )
    alone = ["".join(chunk.text for chunk in model.generate(chat, max_tokens=TOKENS)) for chat in prompt.conversations]
    assert [part.text for part in batch.parts] == alone
    assert batch.stats.width == 4 and all(part.tokens == TOKENS for part in batch.parts)
    assert batch.generation.generated_tokens == 4 * TOKENS
    assert seen[0] == (0, None, [""] * 4) and seen[-1] == (4 * TOKENS, "length", alone)  # the start and the end
    answers = batch.generation.answers  # the batch's real plan, answer by answer (issue [24])
    assert [(a.max_tokens, a.tokens, a.finish_reason) for a in answers] == [(TOKENS, TOKENS, "length")] * 4
    assert [(a.prompt_done, a.prompt_tokens) for a in answers] == [
        (p.prompt_tokens, p.prompt_tokens) for p in batch.parts
    ]
    assert batch.generation.prompt_done == batch.generation.prompt_tokens  # the prompts' progress ends at its total
    counts = [n for n, _, _ in seen]
    writing = counts.index(4)  # the 4th answer's first token: every prompt has been read
    assert set(counts[:writing]) == {0}  # tokens count once every prompt has been read (chunks read are told)
    assert len(seen) == writing + 1 + 4 * (TOKENS - 1) + 1  # ..., then every later token, the end


def test_a_cancelled_batch_returns_what_it_wrote(tiny_model, month_end):
    schedule, checked = month_end
    cancel = threading.Event()
    batch = open_model(tiny_model).generate_batch(split_prompt(schedule, checked, width=3).conversations, 50,
                                                  cancel=cancel, progress=lambda stats, texts: stats.generated_tokens == 5 and cancel.set())  # fmt: skip
    assert batch.generation.finish_reason == "cancelled" and batch.generation.generated_tokens == 5
    assert {part.finish_reason for part in batch.parts} == {"cancelled"}
    assert sum(part.tokens for part in batch.parts) == 5


def test_each_answer_is_its_finding_s_and_its_figures_are_checked_against_that_finding(month_end):
    schedule, checked = month_end
    # F1 is INV-5010 (1,918.40); F3 the insurance debit (-1,480.00). The third answer states F1's amount.
    texts = ["Eight issues need a look, the insurance first.", "F1: Check 1,918.40\nagainst the bank.", "",
             "Book 1,918.40 for the insurance. Then book the Northwind Insurance debit of 1,480.00."]  # fmt: skip
    narrative = split_answers([BatchText(text, 5, 5, "stop", 0.1, 0.1) for text in texts], GenerationStats())
    assert narrative.text.splitlines()[1:] == [
        "F1: Check 1,918.40 against the bank.",
        "F3: Book 1,918.40 for the insurance. Then book the Northwind Insurance debit of 1,480.00.",
    ]
    assert [answer.finding for answer in narrative.answers] == [None, 1, 2, 3]
    # Each answer's figures against its own finding; grounding (tests/test_narrative_gate.py) would also refuse
    # the summary's wording ("issues", "look"), which no finding holds.
    formal = replace(schedule, generation=replace(schedule.generation, grounding=False))
    shown = report_context(formal, checked, narrative)["narrative"]
    assert [(r.finding, r.reason) for r in shown.gated.refused] == [(2, "empty"), (3, "unplaced")]
    assert shown.comments[1] == ['Check <span class="verified" title="placed from the finding: amount">1,918.40</span> '
                                 "against the bank."]  # fmt: skip
    assert "-1,480.00</span>." in shown.comments[3][0] and len(shown.comments[3]) == 1
    assert shown.lines[2][0].startswith("<em>")  # no answer: the plain sentence


def test_a_split_review_on_the_tiny_model_gates_each_answer_and_shows_the_batch(tiny_model, home, month_end):
    schedule = load_schedule(user_schedule(home, tiny_model, max_tokens=TOKENS))
    schedule.generation.narrative, schedule.generation.part_tokens, schedule.generation.batch_width = "split", TOKENS, 4
    checked = month_end[1]
    prompt = split_prompt(schedule, checked, width=4)
    narrative = write_narrative(open_model(tiny_model), prompt, TOKENS, 0.0, 0)
    batch = narrative.batch
    assert [(a.finding, a.text, a.cut) for a in narrative.answers] == [
        (n or None, CONTROL.sub("", part.text).strip(), part.finish_reason == "length")
        for n, part in enumerate(batch.parts)]  # fmt: skip
    assert not any(ch.isdigit() for part in batch.parts for ch in part.text)  # digits blocked while decoding
    context = report_context(schedule, checked, narrative, prompt)
    shown = context["narrative"]
    assert set(shown.lines) == set(range(1, prompt.findings_given + 1))  # every finding given has a line
    html = render_html(schedule.report_template, context)
    assert "narrative split: 4 answers of up to 6&nbsp;tokens each" in html
    assert f"Answers: one batch, {batch.stats.steps} decode steps" in html
    assert f'<td>summary</td><td class="num">{TOKENS}</td><td>at its limit</td>' in html


@pytest.mark.parametrize(
    ("setting", "message"),
    [('narrative = "both"', "should be one of single, split"), ("batch_width = 1", "should be at least 2"),
     ('narrative = "split"\ntemp = 0.7', "written greedily"), ("temp = 0.7", r"split narrative \(the default\)"),
     ("repetition_penalty = 0.5", r"should be 1 \(none\) or more")],
)  # fmt: skip
def test_split_narrative_settings_are_checked(home, tiny_model, setting, message):
    path = user_schedule(home, tiny_model)
    path.write_text(path.read_text().replace('narrative = "single"\n', f"{setting}\n"))
    with pytest.raises(ScheduleError, match=message):
        load_schedule(path)


def test_a_template_without_the_split_blocks_is_refused(tmp_path: Path, month_end, monkeypatch):
    from nightshift.app.review import narrative

    (tmp_path / "plain.j2").write_text("{% block system %}s{% endblock %}{% block user %}u{% endblock %}")
    monkeypatch.setattr(narrative, "PROMPTS_DIR", tmp_path)
    checked = month_end[1]
    with pytest.raises(ReviewError, match="no block summary, finding: a split narrative needs"):
        build_prompt("plain.j2", "t", "w", checked.result, 10, "split", 3)
    assert build_prompt("plain.j2", "t", "w", checked.result, 10).user == "u"


@pytest.mark.slow
def test_a_narrative_reads_its_prompts_through_the_gemm_not_the_quantized_kernel(sparse_store, month_end):
    """Each chat of a split narrative, and a single one's, is read in one pass of its rows (at least MIN_ROWS), the
    dequantized GEMM path (engine/cpu_prefill.py); passes of 16 rows took MLX's quantized kernel, ~9x slower and
    no GEMM call at all (issue [19])."""
    from nightshift.engine.instruments.probes import Instruments

    schedule, checked = month_end
    instruments = Instruments()
    model = open_model(sparse_store[0], instruments=instruments)
    linear = sum(type(m).__name__ == "PrefillQuantizedLinear" for _, m in model.model.named_modules())
    write_narrative(model, split_prompt(schedule, checked, width=3), 1, 0.0, 0)
    split = instruments.counts()
    single = build_prompt(schedule.prompt_template, schedule.title, checked.window.label, checked.result, 10)
    write_narrative(model, single, 1, 0.0, 0)
    one = {name: count - split[name] for name, count in instruments.counts().items()}
    assert one["gemm_calls"] == linear > 0 and one["expert_gemm_calls"] > 0  # every layer once: one pass
    assert (split["gemm_calls"], split["expert_gemm_calls"]) == (3 * linear, 3 * one["expert_gemm_calls"])
