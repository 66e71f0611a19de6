"""The model's part of a review: the prompt (a Jinja template) and the generation, with live statistics.

The model gets the findings and summary tables, never raw rows, so the prompt
stays a few hundred tokens: on a slow CPU every prompt token costs time.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from jinja2 import Environment, FileSystemLoader, StrictUndefined, TemplateError, TemplateNotFound

from nightshift.app.paths import bundled
from nightshift.app.review.checks import CheckResult
from nightshift.app.review.errors import ReviewError
from nightshift.app.review.report import template_problem
from nightshift.app.review.verify import TAG_LINE
from nightshift.engine.generation import ChatBatch, GenerationStats, LanguageModel

PROMPTS_DIR = bundled("templates") / "prompts"
# "F3: ..." at the start of a line: the model's comment on finding 3.
COMMENT = re.compile(r"^\s*\**F(\d+)\**\s*[:.)-]\s*(.+)$", re.MULTILINE)
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

    @property
    def messages(self) -> list[dict[str, str]]:
        """As chat messages, the form a model's chat template takes."""
        return self._chat(self.user)

    @property
    def conversations(self) -> list[list[dict[str, str]]]:
        """Every chat a split narrative answers in one batch: the summary's, then each finding's."""
        return [self.messages, *(self._chat(part) for part in self.parts)]

    def _chat(self, user: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]


@dataclass
class Narrative:
    text: str
    comments: dict[int, str] = field(default_factory=dict)  # finding number (1-based) -> comment
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


def build_prompt(template: str, title: str, window_label: str, result: CheckResult, limit: int,
                 narrative: str = "single", width: int = 1) -> Prompt:  # fmt: skip
    """The chat messages for a review, from templates/prompts/`template`'s blocks.

    `narrative` single: the `system` and `user` blocks; split: `system`, `summary`, and the `finding`
    block once for each of the first `width` - 1 findings given (the batch holds the summary too).
    """
    environment = Environment(loader=FileSystemLoader(PROMPTS_DIR), undefined=StrictUndefined, autoescape=False)
    findings = result.findings[:limit]
    values = {
        "review": title, "window": window_label, "findings": findings, "total_findings": result.total_findings,
        "omitted": len(result.findings) - len(findings), "tables": result.tables,
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
            return Prompt(block("system"), block("user"), len(findings))
        parts = tuple(block("finding", finding=f, number=n) for n, f in enumerate(findings[: width - 1], 1))
        return Prompt(block("system"), block("summary"), len(findings), parts, narrative)
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
    progress: Progress | None = None, cancel: threading.Event | None = None,
) -> Narrative:  # fmt: skip
    """Generate the narrative; `progress` sees the live statistics and the text so far after every token.

    A split prompt's chats are answered together as one batch, greedily, each with up to `max_tokens`.
    """
    prompts = check_fits(model, prompt, max_tokens)
    if prompt.narrative == "split":
        return _write_split(model, prompt, max_tokens, temp, progress, cancel)
    text, stats = [], GenerationStats(prompt_tokens=len(prompts[0]))
    if progress is not None:
        progress(stats, "")  # the prompt is being read: on a slow machine, minutes before the first token
    on_prefill = (lambda read: progress(read, "")) if progress is not None else None  # a chunk of the prompt read
    chunks = model.generate_tokens(prompts[0], max_tokens=max_tokens, temp=temp, seed=seed, cancel=cancel,
                                   on_prefill=on_prefill)  # fmt: skip
    for chunk in chunks:
        text.append(chunk.text)
        stats = chunk.stats
        if progress is not None:
            progress(stats, "".join(text))
    return split_narrative("".join(text).strip(), stats)


def _write_split(model: LanguageModel, prompt: Prompt, max_tokens: int, temp: float, progress: Progress | None,
                 cancel: threading.Event | None) -> Narrative:  # fmt: skip
    """The summary and one paragraph per finding, decoded as one batch, joined as "F3: ..." lines."""
    if temp != 0:
        raise ReviewError(f"a split narrative is written greedily (temperature 0), not at {temp}: set `temp = 0` "
                          'or `narrative = "single"` in the schedule\'s [model]')  # fmt: skip
    shown = (lambda stats, texts: progress(stats, joined(texts))) if progress is not None else None
    batch = model.generate_batch(prompt.conversations, max_tokens, cancel=cancel, progress=shown)
    narrative = split_narrative(joined([part.text for part in batch.parts]), batch.generation)
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
    batch = model.generate_batch(conversations, jobs[0].max_tokens, cancel=everyone_left, progress=shown)
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
                        finish_reason=_finish_reason(parts))  # fmt: skip
        narrative = split_narrative(job.text([part.text for part in parts]).strip(), stats)
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
    """A split narrative's text: the summary, then each finding's paragraph on one "F<n>: " line (so that
    its numbers are checked against that finding's own figures), an empty one left out."""
    lines = [texts[0].strip()] if texts and texts[0].strip() else []
    for number, text in enumerate(texts[1:], 1):
        paragraph = " ".join(TAG_LINE.sub("", text.strip(), count=1).split())
        if paragraph:
            lines.append(f"F{number}: {paragraph}")
    return "\n".join(lines)


def split_narrative(text: str, stats: GenerationStats) -> Narrative:
    """The narrative, control characters dropped, with its per-finding comments ("F3: ..." lines) picked out."""
    text = CONTROL.sub("", text)
    comments = {int(number): comment.strip() for number, comment in COMMENT.findall(text)}
    return Narrative(text, comments, stats)
