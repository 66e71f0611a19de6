"""One answer of a batch as it goes: light (no MLX), so the run queue can keep it without loading the engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AnswerFigures:
    """One answer of a batch (engine/batch.py) so far: its prompt read, its tokens against its own limit, and how
    it ended. A batch's progress is told from these (its real plan), not from its summed figures alone."""

    prompt_tokens: int
    max_tokens: int
    prompt_done: int = 0
    tokens: int = 0  # written so far, an end token included
    finish_reason: str | None = None  # stop (an end token) or length (its max_tokens), once it ended
