"""The model's part of a review: the prompt (a Jinja template) and the generation, with live statistics.

The model gets the findings and summary tables, never raw rows, so the prompt
stays a few hundred tokens: on a slow CPU every prompt token costs time.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jinja2 import Environment, FileSystemLoader, StrictUndefined, TemplateError, TemplateNotFound

from nightshift.app.paths import bundled
from nightshift.app.review.checks import CheckResult
from nightshift.app.review.errors import ReviewError
from nightshift.app.review.report import template_problem
from nightshift.app.review.verify import TAG_LINE
from nightshift.engine import GenerationStats, Model

if TYPE_CHECKING:
    from nightshift.engine.batch import ChatBatch

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


def context_length(model: Model) -> int | None:
    """The model's context window from its config.json, when it says."""
    try:
        config = json.loads((model.path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config.get("max_position_embeddings")


def write_narrative(
    model: Model, prompt: Prompt, max_tokens: int, temp: float, seed: int,
    progress: Progress | None = None, cancel: threading.Event | None = None,
) -> Narrative:  # fmt: skip
    """Generate the narrative; `progress` sees the live statistics and the text so far after every token.

    A split prompt's chats are answered together as one batch, greedily, each with up to `max_tokens`.
    """
    conversations = prompt.conversations if prompt.narrative == "split" else [prompt.messages]
    prompts = [model.chat_tokens(messages) for messages in conversations]
    limit = context_length(model)
    longest = max(len(tokens) for tokens in prompts)
    if limit is not None and longest + max_tokens > limit:
        raise ReviewError(
            f"the prompt is {longest} tokens and {max_tokens} more are asked for, over the model's "
            f"context of {limit}; lower `prompt_findings` or `max_tokens` in the schedule's [model]"
        )
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


def _write_split(model: Model, prompt: Prompt, max_tokens: int, temp: float, progress: Progress | None,
                 cancel: threading.Event | None) -> Narrative:  # fmt: skip
    """The summary and one paragraph per finding, decoded as one batch, joined as "F3: ..." lines."""
    from nightshift.engine.batch import generate_batch  # MLX: only when a narrative is written

    if temp != 0:
        raise ReviewError(f"a split narrative is written greedily (temperature 0), not at {temp}: set `temp = 0` "
                          'or `narrative = "single"` in the schedule\'s [model]')  # fmt: skip
    shown = (lambda stats, texts: progress(stats, joined(texts))) if progress is not None else None
    batch = generate_batch(model, prompt.conversations, max_tokens, cancel=cancel, progress=shown)
    narrative = split_narrative(joined([part.text for part in batch.parts]), batch.generation)
    narrative.batch = batch
    return narrative


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
