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

from jinja2 import Environment, FileSystemLoader, StrictUndefined, TemplateError, TemplateNotFound

from nightshift.app.paths import bundled
from nightshift.app.review.checks import CheckResult
from nightshift.app.review.errors import ReviewError
from nightshift.app.review.report import template_problem
from nightshift.engine import GenerationStats, Model

PROMPTS_DIR = bundled("templates") / "prompts"
# "F3: ..." at the start of a line: the model's comment on finding 3.
COMMENT = re.compile(r"^\s*\**F(\d+)\**\s*[:.)-]\s*(.+)$", re.MULTILINE)
# Control characters other than line breaks and tabs: a model may emit them (a small one often does), and the
# PDF would show each as an empty box (WeasyPrint's .notdef glyph).
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")

Progress = Callable[[GenerationStats, str], None]  # live statistics and the text written so far


@dataclass(frozen=True)
class Prompt:
    """A review's prompt: the template's system and user blocks, and how many findings it gives the model."""

    system: str
    user: str
    findings_given: int

    @property
    def messages(self) -> list[dict[str, str]]:
        """As chat messages, the form a model's chat template takes."""
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]


@dataclass
class Narrative:
    text: str
    comments: dict[int, str] = field(default_factory=dict)  # finding number (1-based) -> comment
    stats: GenerationStats = field(default_factory=GenerationStats)


def build_prompt(template: str, title: str, window_label: str, result: CheckResult, limit: int) -> Prompt:
    """The chat messages for a review, from templates/prompts/`template`'s system and user blocks."""
    environment = Environment(loader=FileSystemLoader(PROMPTS_DIR), undefined=StrictUndefined, autoescape=False)
    findings = result.findings[:limit]
    try:
        compiled = environment.get_template(template)
        context = compiled.new_context({
            "review": title, "window": window_label, "findings": findings, "total_findings": result.total_findings,
            "omitted": len(result.findings) - len(findings), "tables": result.tables,
        })  # fmt: skip
        blocks = {name: "".join(render(context)).strip() for name, render in compiled.blocks.items()}
    except TemplateNotFound:
        raise ReviewError(f"no prompt template {template!r} in {PROMPTS_DIR}") from None
    except TemplateError as exc:
        raise ReviewError(template_problem(PROMPTS_DIR, template, exc)) from None
    if set(blocks) != {"system", "user"}:
        raise ReviewError(f"prompt template {template!r} must define exactly the blocks `system` and `user`")
    return Prompt(blocks["system"], blocks["user"], len(findings))


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
    """Generate the narrative; `progress` sees the live statistics and the text so far after every token."""
    tokens = model.chat_tokens(prompt.messages)
    limit = context_length(model)
    if limit is not None and len(tokens) + max_tokens > limit:
        raise ReviewError(
            f"the prompt is {len(tokens)} tokens and {max_tokens} more are asked for, over the model's "
            f"context of {limit}; lower `prompt_findings` or `max_tokens` in the schedule's [model]"
        )
    text, stats = [], GenerationStats(prompt_tokens=len(tokens))
    if progress is not None:
        progress(stats, "")  # the prompt is being read: on a slow machine, minutes before the first token
    on_prefill = (lambda read: progress(read, "")) if progress is not None else None  # a chunk of the prompt read
    chunks = model.generate(prompt.messages, max_tokens=max_tokens, temp=temp, seed=seed, cancel=cancel,
                            on_prefill=on_prefill)  # fmt: skip
    for chunk in chunks:
        text.append(chunk.text)
        stats = chunk.stats
        if progress is not None:
            progress(stats, "".join(text))
    return split_narrative("".join(text).strip(), stats)


def split_narrative(text: str, stats: GenerationStats) -> Narrative:
    """The narrative, control characters dropped, with its per-finding comments ("F3: ..." lines) picked out."""
    text = CONTROL.sub("", text)
    comments = {int(number): comment.strip() for number, comment in COMMENT.findall(text)}
    return Narrative(text, comments, stats)
