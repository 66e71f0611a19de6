"""A batch's progress told from its real plan: its answers, each with its own prompt and token limit.

A split narrative is several answers (the summary, one per finding) decoded together, each up to
its own limit; a shared batch holds several runs' answers. Its summed figures alone mislead: the
schedule's bound is not the batch's (4 answers of 64 tokens is 256, not the 11 x 64 a full batch may
write), an answer that ends early lowers what the batch can still write, and the batch ends when its
longest answer does. These functions read the answers (`AnswerFigures`, kept by the engine and stored
with the run's progress) and work for the engine's statistics and the queue's record alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from nightshift.engine.generation import AnswerFigures


class Figures(Protocol):
    """What both the engine's `GenerationStats` and the queue's `RunProgress` carry."""

    answers: list[AnswerFigures]
    elapsed: float
    time_to_first_token: float
    generated_tokens: int


def batched(figures: Figures) -> bool:
    return len(figures.answers) > 1


def reading(answers: Sequence[AnswerFigures]) -> tuple[int, AnswerFigures] | None:
    """The answer whose prompt is being read (1-based) while prompts are read; None once all are."""
    return next(((n, a) for n, a in enumerate(answers, 1) if a.prompt_done < a.prompt_tokens), None)


def tokens_at_most(answers: Sequence[AnswerFigures]) -> int:
    """The most the batch can write in all now: what ended answers wrote, the others' limits. At the end it is
    exactly what was written, so a bar against it ends full."""
    return sum(a.tokens if a.finish_reason else a.max_tokens for a in answers)


def steps_left(answers: Sequence[AnswerFigures]) -> int:
    """Decode steps the batch may still take: the longest way any answer still open has to its limit."""
    return max((a.max_tokens - a.tokens for a in answers if not a.finish_reason), default=0)


def seconds_per_step(figures: Figures) -> float | None:
    """The measured time of one decode step (each step writes a token of every open answer), None before two."""
    steps = max((a.tokens for a in figures.answers), default=0) - 1  # every answer's first token came with its prompt
    decoding = figures.elapsed - figures.time_to_first_token
    return decoding / steps if steps > 0 and figures.time_to_first_token and decoding > 0 else None


def eta(figures: Figures) -> float | None:
    """Seconds left at most: the steps left at the measured time per step (answers ending early make it less)."""
    per_step = seconds_per_step(figures)
    return steps_left(figures.answers) * per_step if per_step is not None else None


def endings(answers: Sequence[AnswerFigures]) -> str:
    """How the answers ended, in words: `2 ended by themselves, 2 reached their 64-token limit`."""
    stopped = sum(a.finish_reason == "stop" for a in answers)
    capped = [a for a in answers if a.finish_reason == "length"]
    limits = sorted({a.max_tokens for a in capped})
    limit = f"their {limits[0]}-token limit" if len(limits) == 1 else "their token limits"
    said = [f"{stopped} ended by themselves" if stopped else "", f"{len(capped)} reached {limit}" if capped else ""]
    open_ = len(answers) - stopped - len(capped)
    said.append(f"{open_} still open" if open_ else "")
    return ", ".join(part for part in said if part)
