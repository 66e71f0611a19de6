"""Logits processors that hold the model to the narrative's contract while it writes.

- No digits: every token whose text holds a digit (or another numeral, such as ¼) is blocked, except
  right after an `F` that starts a line (a single narrative's `F3:` tag). The model names figures by
  placeholder; the report writes them (app/review/roles.py). The gate refuses a typed figure anyway,
  so this is the first line, not the only one.
- A repetition penalty (mlx-lm's `make_repetition_penalty`, the schedule's `[model] repetition_penalty`,
  1.3 by default): on the default model it turned 1 of 69 sentences kept into 9 of 79 (docs/results.md,
  issue [19], the narrative evaluation).

MLX is imported only here, when a narrative is written.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nightshift.engine.generation import LanguageModel, LogitsProcessor

TAG_START = re.compile(r"(?:^|\n)\s*\**F\d*$")  # a line begun with F and digits so far: a tag being written
REPETITION_CONTEXT = 20  # tokens the penalty looks back over (mlx-lm's default)
_numerals: dict[str, list[int]] = {}  # per model directory: its numeral tokens (a vocabulary decodes in ~0.6 s)


def numeral_tokens(model: LanguageModel) -> list[int]:
    """The ids of every token of the model's vocabulary whose text holds a numeral."""
    key = str(model.path)
    if key not in _numerals:
        tokenizer = model.tokenizer
        size = len(tokenizer.get_vocab())
        _numerals[key] = [i for i in range(size) if any(ch.isnumeric() for ch in tokenizer.decode([i]))]
    return _numerals[key]


def narrative_processors(model: LanguageModel, repetition_penalty: float) -> list[LogitsProcessor]:
    """The processors a narrative is written with: no numerals (outside a tag), and the penalty unless 1."""
    import mlx.core as mx
    from mlx_lm.sample_utils import make_repetition_penalty

    blocked = mx.array(numeral_tokens(model), dtype=mx.int32)
    tokenizer = model.tokenizer

    def no_numerals(tokens: mx.array, logits: mx.array) -> mx.array:
        if tokens.size and TAG_START.search(tokenizer.decode(tokens[-4:].tolist())):
            return logits
        return logits.at[:, blocked].add(-mx.inf)

    processors = [no_numerals] if blocked.size else []
    if repetition_penalty != 1:
        processors.append(make_repetition_penalty(repetition_penalty, REPETITION_CONTEXT))
    return processors
