"""Logits processors built from a `generation.Decoding`: what shapes each token's logits besides the sampler.

- No numerals: every token whose text holds a digit (or another numeral, such as ¼) is blocked, except
  where the text generated so far ends matching `numerals_after` (a review narrative's `F3:` tag). A
  review's narrative names figures by placeholder and the report writes them (app/review/roles.py).
- A repetition penalty (mlx-lm's `make_repetition_penalty`), over the last REPETITION_CONTEXT tokens.

The `Decoding` is data, so a store over several hosts sends it with the request and every rank builds the
same processors: the tokens are the one process's.
"""

from __future__ import annotations

import re
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import make_repetition_penalty

from nightshift.engine.generation import Decoding, LogitsProcessor

REPETITION_CONTEXT = 20  # tokens the penalty looks back over (mlx-lm's default)
LOOK_BACK = 4  # tokens of the text so far that `numerals_after` is matched against
_numerals: dict[str, list[int]] = {}  # per tokenizer (model directory): its numeral tokens (~0.6 s to find)


def numeral_tokens(tokenizer: Any, key: str) -> list[int]:
    """The ids of every token of the vocabulary whose text holds a numeral; `key` names the vocabulary."""
    if key not in _numerals:
        size = len(tokenizer.get_vocab())
        _numerals[key] = [i for i in range(size) if any(ch.isnumeric() for ch in tokenizer.decode([i]))]
    return _numerals[key]


def logits_processors(decoding: Decoding | None, tokenizer: Any, key: str) -> list[LogitsProcessor]:
    """The processors `decoding` asks for, for the vocabulary of `tokenizer` (named `key`)."""
    if decoding is None:
        return []
    processors: list[LogitsProcessor] = []
    blocked = mx.array(numeral_tokens(tokenizer, key) if decoding.no_numerals else [], dtype=mx.int32)
    if blocked.size:
        after = re.compile(decoding.numerals_after) if decoding.numerals_after else None

        def no_numerals(tokens: mx.array, logits: mx.array) -> mx.array:
            if after is not None and tokens.size and after.search(tokenizer.decode(tokens[-LOOK_BACK:].tolist())):
                return logits
            return logits.at[:, blocked].add(-mx.inf)

        processors.append(no_numerals)
    if decoding.repetition_penalty != 1:
        processors.append(make_repetition_penalty(decoding.repetition_penalty, REPETITION_CONTEXT))
    return processors
