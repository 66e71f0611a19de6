"""The model's part of a review: the prompt (a Jinja template), the generation with live statistics, and the
narrative the report prints once every sentence has passed the gate.

The model gets the findings, never raw rows, with every figure as its role's placeholder ({difference}), so
the prompt stays short (on a slow CPU every prompt token costs time) and the model names figures by role:
the report writes them from the finding's own figures (app/review/roles.py), and while it writes digits
are blocked (`Prompt.decoding`, engine/decoding.py). Each answer is then read sentence by sentence through the gate
(app/review/gate.py); a refused sentence is replaced by its finding's plain sentence (templates/prompts/facts.j2).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, TemplateError, TemplateNotFound
from markupsafe import Markup

from nightshift.app.paths import bundled
from nightshift.app.review.checks import SEVERITIES, CheckResult, Finding
from nightshift.app.review.errors import ReviewError
from nightshift.app.review.gate import Answer, Gate, Gated, Sentence, Subject, subjects
from nightshift.app.review.report import template_problem
from nightshift.app.review.roles import fill, with_names
from nightshift.engine.generation import DEFAULT_CHUNK, ChatBatch, Decoding, GenerationStats, LanguageModel

PROMPTS_DIR = bundled("templates") / "prompts"
FACTS_DIR = PROMPTS_DIR  # where facts.j2 is, whatever folder the prompt templates are read from
FACTS = "facts.j2"  # each finding's plain sentence and the summary's, figures as placeholders
# "F3: ..." at the start of a line: the model's line on finding 3.
TAG_LINE = re.compile(r"^\s*\**F(\d+)\**\s*[:.)-]", re.IGNORECASE)
TAG_START = r"(?:^|\n)\s*\**F\d*$"  # a line begun with F and digits so far: a tag being written (numerals allowed)
# Prompt rows read per pass, alone and in a batch alike, so that a review's text alone is its text in a shared
# batch (engine/batch.py `shared_prefix` shares only whole passes): mlx-lm's step, so a narrative's prompt
# (100-400 tokens) is read in one pass. A pass of fewer than engine/cpu_prefill.py MIN_ROWS rows takes MLX's
# quantized CPU kernel (~1 GMAC/s): passes of 16 rows read the month-end's single prompt in 26 s, one pass in 3 s
# (docs/results.md, issue [19]); a split narrative's chats then share no pass (their common start, the system
# message, is ~40 tokens), and read it once each.
NARRATIVE_CHUNK = DEFAULT_CHUNK
EXTRA_HIGH = 10  # high findings not given to the model that still get their plain sentence; the rest are counted
# Control characters other than line breaks and tabs: a model may emit them (a small one often does), and the
# PDF would show each as an empty box (WeasyPrint's .notdef glyph).
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")

Progress = Callable[[GenerationStats, str], None]  # live statistics and the text written so far


# The template blocks each narrative (a schedule's [model] narrative) asks for (a template may define others, such as review.j2's `issues`).
BLOCKS = {"single": ("system", "user"), "split": ("system", "summary", "finding")}


@dataclass(frozen=True)
class Prompt:
    """A review's prompt: the template's system and user blocks, and how many findings it gives the model.

    Split, `user` is the summary's message and `parts` one message per finding that has its own
    (F1, F2, ...: the most severe first, as many as the batch's width leaves room for).
    """

    system: str
    user: str
    findings_given: int
    parts: tuple[str, ...] = ()
    narrative: str = "single"
    repetition_penalty: float = 1.0  # while decoding (1: none); numerals are always blocked (`decoding`)

    @property
    def decoding(self) -> Decoding:
        """How its answers are decoded: no numerals (the report writes figures from their placeholders) except
        in a line's `F3:` tag, and the repetition penalty (on the default model it kept 9 of 79 sentences at 1.3
        against 1 of 69 without, docs/results.md issue [19])."""
        return Decoding(no_numerals=True, numerals_after=TAG_START, repetition_penalty=self.repetition_penalty)

    @property
    def messages(self) -> list[dict[str, str]]:
        """As chat messages, the form a model's chat template takes."""
        return self._chat(self.user)

    @property
    def conversations(self) -> list[list[dict[str, str]]]:
        """Every chat a split narrative answers in one batch: the summary's, then each finding's."""
        return [self.messages, *(self._chat(part) for part in self.parts)]

    def asked(self, finding: int | None) -> str:
        """What the model saw when it wrote the answer on `finding` (None: the summary), which its sentences
        must not echo: the system message and that answer's user message."""
        part = self.parts[finding - 1] if self.narrative == "split" and finding is not None else self.user
        return f"{self.system}\n{part}"

    def _chat(self, user: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]


@dataclass
class Narrative:
    """What the model wrote: its text as one (the live display), and its answers (the summary, each finding's)."""

    text: str
    answers: list[Answer] = field(default_factory=list)
    stats: GenerationStats = field(default_factory=GenerationStats)
    batch: ChatBatch | None = None  # split: the batch that wrote it (width, per-part figures)
    shared: SharedBatch | None = None  # the service's batching: the other reviews it was generated with


@dataclass(frozen=True)
class SharedBatch:
    """Several reviews' narratives decoded as one batch (runs due together): who shared it and the rates.

    A review's answers are its own rows in the batch, so its text is what it would be alone (greedy);
    only the time is shared.
    """

    members: tuple[tuple[int | None, str], ...]  # (run id, review) in the batch's order
    sequences: int  # rows decoded together: every review's answers
    steps: int
    decode_tokens_per_s: float  # every review's tokens together
    member_tokens_per_s: tuple[float, ...]  # each review's own tokens over its time in the batch, as `members`
    member_prefill_tokens_per_s: tuple[float, ...]  # each review's prompts over the time reading them
    own: int = 0  # which of the members this review is

    @property
    def own_tokens_per_s(self) -> float:
        return self.member_tokens_per_s[self.own]

    @property
    def own_prefill_tokens_per_s(self) -> float:
        return self.member_prefill_tokens_per_s[self.own]

    @property
    def others(self) -> list[tuple[tuple[int | None, str], float]]:
        """The other reviews in the batch with their own rates."""
        return [(m, r) for i, (m, r) in enumerate(zip(self.members, self.member_tokens_per_s, strict=True))
                if i != self.own]  # fmt: skip


@dataclass
class NarrativeJob:
    """One review's part of a shared batch: its prompt and settings, and its own progress and cancel.

    `on_cancel` is called once, at the first token after `cancel` is set: the review leaves the batch
    there (its answers are decoded to their end with the others, unread: the engine cannot drop a row
    mid-batch) and the others go on.
    """

    prompt: Prompt
    max_tokens: int
    member: tuple[int | None, str]  # (run id, review)
    progress: Progress | None = None
    cancel: threading.Event | None = None
    on_cancel: Callable[[], None] | None = None

    @property
    def conversations(self) -> list[list[dict[str, str]]]:
        return self.prompt.conversations if self.prompt.narrative == "split" else [self.prompt.messages]

    def text(self, texts: list[str]) -> str:
        """Its narrative from its answers' texts."""
        return joined(texts) if self.prompt.narrative == "split" else texts[0]

    def narrative(self, parts: list, stats: GenerationStats) -> Narrative:
        """Its narrative from its answers in the batch (engine.batch.BatchText)."""
        if self.prompt.narrative == "split":
            return split_answers(parts, stats)
        return read_narrative(parts[0].text, stats, parts[0].finish_reason == "length")


def _environment() -> Environment:
    """The prompt templates; facts.j2 always found (a template of one's own imports or is handed it)."""
    loader = FileSystemLoader([PROMPTS_DIR, FACTS_DIR])
    return Environment(loader=loader, undefined=StrictUndefined, autoescape=False)


def build_prompt(template: str, title: str, window_label: str, result: CheckResult, limit: int,
                 narrative: str = "single", width: int = 1, repetition_penalty: float = 1.0) -> Prompt:  # fmt: skip
    """The chat messages for a review, from templates/prompts/`template`'s blocks.

    `narrative` single: the `system` and `user` blocks; split: `system`, `summary`, and the `finding`
    block once for each of the first `width` - 1 findings given (the batch holds the summary too).
    """
    environment = _environment()
    findings = result.findings[:limit]
    values = {
        "review": title, "window": window_label, "findings": findings, "total_findings": result.total_findings,
        "omitted": len(result.findings) - len(findings), "tables": result.tables,
        "severities": by_severity(result.findings), "say": environment.get_template(FACTS).module,
        "named": lambda text, f: with_names(str(text), f.figures.roles),
    }  # fmt: skip
    needed = BLOCKS[narrative]
    try:
        compiled = environment.get_template(template)
        missing = [name for name in needed if name not in compiled.blocks]
        if missing:
            raise ReviewError(f"prompt template {template!r} has no block {', '.join(missing)}: a {narrative} "
                              f"narrative needs the blocks {', '.join(needed)} (see templates/prompts/review.j2)")  # fmt: skip

        def block(name: str, **more: object) -> str:
            return "".join(compiled.blocks[name](compiled.new_context({**values, **more}))).strip()

        if narrative == "single":
            return Prompt(block("system"), block("user"), len(findings), repetition_penalty=repetition_penalty)
        parts = tuple(block("finding", finding=f, number=n) for n, f in enumerate(findings[: width - 1], 1))
        return Prompt(block("system"), block("summary"), len(findings), parts, narrative, repetition_penalty)
    except TemplateNotFound:
        raise ReviewError(f"no prompt template {template!r} in {PROMPTS_DIR}") from None
    except TemplateError as exc:
        raise ReviewError(template_problem(PROMPTS_DIR, template, exc)) from None


def context_length(model: LanguageModel) -> int | None:
    """The model's context window from its config.json, when it says."""
    try:
        config = json.loads((model.path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config.get("max_position_embeddings")


def check_fits(model: LanguageModel, prompt: Prompt, max_tokens: int) -> list[list[int]]:
    """The prompt's chats as tokens, refused when the longest and `max_tokens` exceed the model's context."""
    conversations = prompt.conversations if prompt.narrative == "split" else [prompt.messages]
    prompts = [model.chat_tokens(messages) for messages in conversations]
    limit = context_length(model)
    longest = max(len(tokens) for tokens in prompts)
    if limit is not None and longest + max_tokens > limit:
        raise ReviewError(
            f"the prompt is {longest} tokens and {max_tokens} more are asked for, over the model's "
            f"context of {limit}; lower `prompt_findings` or `max_tokens` in the schedule's [model]"
        )
    return prompts


def write_narrative(
    model: LanguageModel, prompt: Prompt, max_tokens: int, temp: float, seed: int,
    progress: Progress | None = None, cancel: threading.Event | None = None, prefill_chunk: int = NARRATIVE_CHUNK,
) -> Narrative:  # fmt: skip
    """Generate the narrative; `progress` sees the live statistics and the text so far after every token.

    A split prompt's chats are answered together as one batch, greedily, each with up to `max_tokens`.
    `prefill_chunk`: prompt rows a pass (another than NARRATIVE_CHUNK only to measure one against it).
    """
    prompts = check_fits(model, prompt, max_tokens)
    if prompt.narrative == "split":
        return _write_split(model, prompt, max_tokens, temp, progress, cancel, prefill_chunk)
    text, stats = [], GenerationStats(prompt_tokens=len(prompts[0]))
    if progress is not None:
        progress(stats, "")  # the prompt is being read: on a slow machine, minutes before the first token
    on_prefill = (lambda read: progress(read, "")) if progress is not None else None  # a chunk of the prompt read
    chunks = model.generate_tokens(prompts[0], max_tokens=max_tokens, temp=temp, seed=seed, cancel=cancel,
                                   prefill_chunk=prefill_chunk, on_prefill=on_prefill,
                                   decoding=prompt.decoding)  # fmt: skip
    for chunk in chunks:
        text.append(chunk.text)
        stats = chunk.stats
        if progress is not None:
            progress(stats, "".join(text))
    return read_narrative("".join(text), stats, stats.finish_reason == "length")


def _write_split(model: LanguageModel, prompt: Prompt, max_tokens: int, temp: float, progress: Progress | None,
                 cancel: threading.Event | None, prefill_chunk: int) -> Narrative:  # fmt: skip
    """The summary and one paragraph per finding, decoded as one batch, joined as "F3: ..." lines."""
    if temp != 0:
        raise ReviewError(f"a split narrative is written greedily (temperature 0), not at {temp}: set `temp = 0` "
                          'or `narrative = "single"` in the schedule\'s [model]')  # fmt: skip
    shown = (lambda stats, texts: progress(stats, joined(texts))) if progress is not None else None
    batch = model.generate_batch(prompt.conversations, max_tokens, prefill_chunk=prefill_chunk, cancel=cancel,
                                 progress=shown, decodings=[prompt.decoding] * len(prompt.conversations))  # fmt: skip
    narrative = split_answers(batch.parts, batch.generation)
    narrative.batch = batch
    return narrative


def write_narratives(model: LanguageModel, jobs: list[NarrativeJob]) -> list[Narrative | None]:
    """Several reviews' narratives decoded as one batch, greedily: the union of their answers, each review's
    answers up to its `max_tokens` (one for all: reviews are batched only when it is the same).

    Returns each review's narrative, with its own text, figures and answers and the batch it shared; None
    for a review that left the batch (its `cancel`). Every review leaving ends the batch at that token.
    """
    if len({job.max_tokens for job in jobs}) > 1:
        raise ReviewError("reviews are batched only with the same tokens per answer; this is a bug in the batching")
    spans, start = [], 0
    for job in jobs:
        spans.append(slice(start, start + len(job.conversations)))
        start += len(job.conversations)
    left = [False] * len(jobs)
    everyone_left = threading.Event()

    def shown(stats: GenerationStats, texts: list[str]) -> None:
        for i, (job, span) in enumerate(zip(jobs, spans, strict=True)):
            if not left[i] and job.cancel is not None and job.cancel.is_set():
                left[i] = True
                if job.on_cancel is not None:
                    job.on_cancel()
            if not left[i] and job.progress is not None:
                job.progress(stats, job.text(texts[span]))
        if all(left):
            everyone_left.set()

    conversations = [chat for job in jobs for chat in job.conversations]
    decodings = [job.prompt.decoding for job in jobs for _ in job.conversations]
    batch = model.generate_batch(conversations, jobs[0].max_tokens, prefill_chunk=NARRATIVE_CHUNK,
                                 cancel=everyone_left, progress=shown, decodings=decodings)  # fmt: skip
    rates = [_rate(batch.parts[span]) for span in spans]
    shared = SharedBatch(tuple(job.member for job in jobs), len(conversations), batch.stats.steps,
                         batch.stats.decode_tokens_per_s, tuple(rates),
                         tuple(_prefill_rate(batch.parts[span]) for span in spans))  # fmt: skip
    narratives: list[Narrative | None] = []
    for own, (job, span, gone) in enumerate(zip(jobs, spans, left, strict=True)):
        if gone:
            narratives.append(None)
            continue
        parts = batch.parts[span]
        stats = replace(batch.generation, prompt_tokens=sum(p.prompt_tokens for p in parts),
                        prompt_done=sum(p.prompt_tokens for p in parts), generated_tokens=sum(p.tokens for p in parts),
                        finish_reason=_finish_reason(parts), answers=batch.generation.answers[span])  # fmt: skip
        narrative = job.narrative(parts, stats)
        narrative.batch = ChatBatch(parts, batch.stats, stats) if job.prompt.narrative == "split" else None
        narrative.shared = replace(shared, own=own)
        narratives.append(narrative)
    return narratives


def _rate(parts: list) -> float:
    """A review's decode rate in a shared batch: its tokens after each answer's first, over its time there."""
    seconds = max((part.decode_seconds for part in parts), default=0.0)
    return sum(max(part.tokens - 1, 0) for part in parts) / seconds if seconds > 0 else 0.0


def _prefill_rate(parts: list) -> float:
    """A review's prompt reading rate in a shared batch: its prompts (each read alone) over their time."""
    seconds = sum(part.prefill_seconds for part in parts)
    return sum(part.prompt_tokens for part in parts) / seconds if seconds > 0 else 0.0


def _finish_reason(parts: list) -> str:
    """Stop when every answer ended at an end token, else what the first that did not ended with."""
    return next((part.finish_reason for part in parts if part.finish_reason != "stop"), "stop")


def joined(texts: list[str]) -> str:
    """A split narrative's text as one (the live display): the summary, then each finding's paragraph on
    one "F<n>: " line, an empty one left out."""
    lines = [texts[0].strip()] if texts and texts[0].strip() else []
    for number, text in enumerate(texts[1:], 1):
        paragraph = " ".join(TAG_LINE.sub("", text.strip(), count=1).split())
        if paragraph:
            lines.append(f"F{number}: {paragraph}")
    return "\n".join(lines)


def split_answers(parts: list, stats: GenerationStats) -> Narrative:
    """A split narrative from its batch's parts (engine.batch.BatchText): the summary, then finding 1, 2, ..."""
    answers = [Answer(CONTROL.sub("", part.text).strip(), number or None, part.finish_reason == "length")
               for number, part in enumerate(parts)]  # fmt: skip
    return Narrative(joined([answer.text for answer in answers]), answers, stats)


def read_narrative(text: str, stats: GenerationStats, cut: bool = False) -> Narrative:
    """A single answer's narrative, control characters dropped: lines tagged "F3: ..." are finding 3's, the
    rest the summary's; `cut` (it ended at the token limit) falls on its last part."""
    text = CONTROL.sub("", text).strip()
    parts: list[tuple[int | None, list[str]]] = [(None, [])]
    for line in text.splitlines():
        tag = TAG_LINE.match(line)
        if tag:
            parts.append((int(tag.group(1)), [line[tag.end() :]]))
        else:
            parts[-1][1].append(line)
    answers = [Answer("\n".join(lines).strip(), number, cut and at == len(parts) - 1)
               for at, (number, lines) in enumerate(parts)]  # fmt: skip
    return Narrative(text, [answer for answer in answers if answer.text or answer.finding is not None], stats)


def by_severity(findings: list[Finding]) -> dict[str, int]:
    """Findings by severity, a cap's summary counted as the findings it stands for."""
    return {severity: sum(f.summarized.get(severity, 0) if f.summarized else f.severity == severity
                          for f in findings) for severity in SEVERITIES}  # fmt: skip


@dataclass
class Shown:
    """The narrative as the report prints it: the summary, each finding's line, and what the gate did."""

    summary: list[Markup]  # sentences, figures placed, the template's own in <em>
    lines: dict[int, list[Markup]]  # finding number -> its sentences
    comments: dict[int, list[Markup]]  # finding number -> the model's own sentences in its line (the table's)
    gated: Gated
    left_out: list[int]  # high findings in no line of the narrative (the summary counts them)


def shown_narrative(narrative: Narrative, prompt: Prompt | None, findings: list[Finding], period: str,
                    previous: str, grounding: bool = False) -> Shown:  # fmt: skip
    """The narrative the report prints: every sentence through the gate, figures placed from the findings.

    Every finding given to the model gets a line, and so do up to EXTRA_HIGH high ones past those (their
    plain sentences); the summary says how many high findings are in no line and where to find them.
    Without a prompt (the narrative skipped) the lines and the summary are the template's own. `grounding`: the
    gate refuses a sentence with words its finding does not hold (app/review/grounding.py).
    """
    facts: Any = _environment().get_template(FACTS).module  # its macros: facts, counts, coverage
    given = prompt.findings_given if prompt is not None else 0
    high = [n for n, f in enumerate(findings, 1) if f.severity == "high" and n > given]
    shown = [*range(1, given + 1), *high[:EXTRA_HIGH]]
    left_out = high[EXTRA_HIGH:]
    counts = by_severity(findings)
    roles = {"findings": sum(f.stands_for for f in findings), **counts, "period": period, "previous": previous,
             "left_out": len(left_out), "first_left": f"F{left_out[0]}" if left_out else "",
             "last_left": f"F{left_out[-1]}" if left_out else ""}  # fmt: skip
    summary = Subject(roles, str(facts.counts(roles)))
    common = {"period": period, "previous": previous}
    finding_subjects = subjects([(f.figures.kind, {**common, **f.figures.roles}) for f in findings],
                                [str(facts.facts(f)) for f in findings])  # fmt: skip
    gate = Gate(finding_subjects, summary, prompt.asked if prompt is not None else lambda finding: "", grounding)
    gated = gate.gate(narrative.answers if prompt is not None else [], shown)
    coverage = str(facts.coverage(roles))
    gated.summary += [Sentence(coverage, True)] if coverage else []

    def placed(sentences: list[Sentence], subject: Subject) -> list[Markup]:
        return [Markup("<em>{}</em>").format(fill(s.text, subject.roles)) if s.plain else fill(s.text, subject.roles)
                for s in sentences]  # fmt: skip

    lines = {n: placed(sentences, finding_subjects[n - 1]) for n, sentences in gated.lines.items()}
    comments = {n: placed([s for s in sentences if not s.plain], finding_subjects[n - 1])
                for n, sentences in gated.lines.items()}  # fmt: skip
    return Shown(placed(gated.summary, summary), lines, {n: c for n, c in comments.items() if c}, gated, left_out)
