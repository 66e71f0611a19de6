"""Speculative decoding: a small resident drafter proposes tokens, the streamed target checks them in one pass.

Checking k drafted tokens is one forward pass of the target over k+1 rows, so each streaming
layer reads the union of those rows' experts once instead of k+1 times. The loop is our own
(mlx-lm's `speculative_generate_step` fits neither a switch-off nor per-verify statistics) but
keeps its rules: a drafted token is accepted when the target's own sample at that row equals
it (the verify pass runs attention row by row, `engine/row_attention.py`, so that sample is
exactly plain decoding's), the first disagreement is replaced by the target's token, and the
caches are trimmed back with mlx-lm's `trim` (recurrent caches, e.g. Kimi K3's delta-attention
state, are restored from a snapshot and the accepted rows replayed). Greedy output is the
target's greedy output.

Drafting pays only while enough drafts are accepted: the loop times plain decode steps, then
each draft+verify round, and switches drafting off for the rest of the generation once the
acceptance of recent rounds is at or below the break-even it measured.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache

from nightshift.engine.errors import NightshiftError
from nightshift.engine.generation import DraftStats
from nightshift.engine.moe.stream import ExpertStream
from nightshift.engine.row_attention import attention_row_by_row
from nightshift.engine.store.manifest import write_json_atomic

Sampler = Callable[[mx.array], mx.array]
CALIBRATION_STEPS = 3  # plain steps timed before drafting starts (the first one is not used: warm-up)
MIN_ROUNDS = 4  # rounds seen before the switch-off may judge
WINDOW = 8  # rounds the switch-off judges on
FALLBACK_DEPTH = 2  # mlx-lm's default, for a drafter no benchmark has measured with this model
DRAFT_FILE = "draft.json"  # beside the target model: drafter directory name -> best depth and its figures


class DraftError(NightshiftError):
    """A drafter that cannot serve a model (other vocabulary or tokenizer), or a bad draft depth."""


def check_depth(depth: int) -> int:
    if not isinstance(depth, int) or depth < 0:
        raise DraftError(f"draft depth {depth!r}: give a whole number of tokens, 0 (no drafting) or more")
    return depth


def check_pair(
    target_vocab: dict[str, int],
    target_width: int,
    drafter_vocab: dict[str, int],
    drafter_width: int,
    drafter_name: str,
) -> None:
    """Raise DraftError unless the drafter's tokens mean what the target's do and its logits are as wide."""
    if drafter_vocab != target_vocab:
        differing = sorted(set(drafter_vocab.items()) ^ set(target_vocab.items()))[:3]
        raise DraftError(
            f"drafter {drafter_name} has another tokenizer ({len(drafter_vocab)} tokens vs the model's "
            f"{len(target_vocab)}; e.g. {differing}); a drafter must share the model's tokenizer "
            "(make one with `nightshift model drafter`)"
        )
    if drafter_width != target_width:
        raise DraftError(
            f"drafter {drafter_name} scores {drafter_width} tokens, the model {target_width}; a drafter must have "
            "the model's vocabulary (make one with `nightshift model drafter`)"
        )


def default_depth(target: Path, drafter: Path) -> int:
    """The depth `nightshift bench draft` measured best for this model and drafter, else mlx-lm's default."""
    try:
        entry = json.loads((Path(target) / DRAFT_FILE).read_text()).get(Path(drafter).name, {})
        return check_depth(entry["depth"])
    except (OSError, ValueError, KeyError, TypeError, DraftError):
        return FALLBACK_DEPTH


def record_best_depth(target: Path, drafter: Path, depth: int, figures: dict) -> Path:
    """Remember `depth` as the best for (target, drafter) in the target's `draft.json`; returns that file."""
    path = Path(target) / DRAFT_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[Path(drafter).name] = {"depth": depth, "drafter": str(drafter), **figures}
    write_json_atomic(path, data)
    return path


# --- rewinding caches ---------------------------------------------------------------------------------------


def _copied(state: Any) -> Any:
    """`state` with its containers copied (the arrays themselves are immutable values to MLX)."""
    if isinstance(state, list):
        return [_copied(s) for s in state]
    if isinstance(state, tuple):
        return tuple(_copied(s) for s in state)
    return state


def rewindable(cache: list[Any], rows: int) -> bool:
    """Whether every cache can be taken back after `rows` more tokens (a sliding window must not wrap)."""

    def ok(c: Any) -> bool:
        if isinstance(c, ArraysCache):
            return True
        window = getattr(c, "max_size", None)
        return c.is_trimmable() and (window is None or c.offset + rows < window)

    return all(ok(c) for c in cache)


def trims_only(cache: list[Any]) -> bool:
    return all(c.is_trimmable() for c in cache)


def checkpoint(cache: list[Any]) -> list[Any]:
    """Where each cache stands: its offset (trimmable) or a snapshot of its state (recurrent)."""
    return [_copied(c.state) if isinstance(c, ArraysCache) else c.offset for c in cache]


def restore(cache: list[Any], mark: list[Any], plus: int = 0) -> None:
    """Put every cache back where `checkpoint` found it (trimmable ones `plus` rows further)."""
    for c, m in zip(cache, mark):
        if isinstance(m, int):
            c.trim(c.offset - m - plus)
        else:
            c.state = _copied(m)


# --- the loop ------------------------------------------------------------------------------------------------


def _logits(model: nn.Module, cache: list[Any], tokens: list[int]) -> mx.array:
    """Log-probabilities of the next token after each of `tokens` (rows x vocab), computed as mlx-lm's decode
    loop does (in the model's dtype), so a greedy pick rounds exactly as plain decoding's does."""
    logits = model(mx.array(tokens, mx.uint32)[None], cache=cache)[0]
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


class ExpertCount:
    """Unique experts the streaming layers read during a block of code (nothing for a model held in RAM)."""

    def __init__(self, stream: ExpertStream | None):
        self.stream = stream

    def __call__(self) -> tuple[int, int]:
        if self.stream is None:
            return 0, 0
        calls = self.stream.call_counts()
        return calls.calls, calls.unique


class BreakEven:
    """Times plain steps and draft+verify rounds; says when drafting no longer pays.

    A round of d drafts at acceptance a yields 1 + a*d tokens in `round_s`; plain decoding yields
    one in `plain_s`. Drafting pays while a > (round_s / plain_s - 1) / d, the break-even.
    """

    def __init__(self, stats: DraftStats, calibrate: bool):
        self.stats = stats
        self.plain_times: list[float] = []
        self.rounds: deque[tuple[float, int, int]] = deque(maxlen=WINDOW)
        self.calibrate = calibrate

    def calibrating(self) -> bool:
        return self.calibrate and len(self.plain_times) < CALIBRATION_STEPS

    def plain(self, seconds: float) -> None:
        self.plain_times.append(seconds)
        timed = self.plain_times[1:] or self.plain_times
        self.stats.plain_step_s = sum(timed) / len(timed)

    def round(self, seconds: float, drafted: int, accepted: int) -> bool:
        """Record a round; True when drafting should stop (acceptance at or below break-even)."""
        self.rounds.append((seconds, drafted, accepted))
        s = self.stats
        s.round_s = sum(r[0] for r in self.rounds) / len(self.rounds)
        drafted_sum = sum(r[1] for r in self.rounds)
        if not self.calibrate or not s.plain_step_s or not drafted_sum:
            return False
        s.break_even_acceptance = max(0.0, (s.round_s / s.plain_step_s - 1) * len(self.rounds) / drafted_sum)
        recent = sum(r[2] for r in self.rounds) / drafted_sum
        return len(self.rounds) >= MIN_ROUNDS and recent <= s.break_even_acceptance


@dataclass
class Pair:
    """The target (streamed or in RAM) and the drafter, with their caches holding the same context."""

    target: nn.Module
    target_cache: list[Any]
    drafter: nn.Module
    draft_cache: list[Any]
    sampler: Sampler
    stream: ExpertStream | None = None


def speculative_tokens(
    pair: Pair, first: int, depth: int, stats: DraftStats, limit: int | None = None, switch_off: bool = True
) -> Iterator[int]:
    """Tokens after `first`, which both caches hold the context before but not `first` itself.

    Yields at most `limit` tokens (None: until the caller stops). `depth` 0 decodes plainly.
    With `switch_off`, drafting starts after a few timed plain steps and stops for good when
    it does not pay; without it, every step drafts (what the token-identity tests exercise).
    """
    stats.depth = check_depth(depth)
    judge = BreakEven(stats, calibrate=switch_off)
    count = ExpertCount(pair.stream)
    y, unseen = first, [first]  # unseen: tokens the drafter has not been fed yet
    produced = 0
    while limit is None or produced < limit:
        room = depth if limit is None else min(depth, limit - produced - 1)
        if not stats.switched_off and room > 0 and not rewindable(pair.target_cache + pair.draft_cache, room + 1):
            _switch_off(stats, produced, "a cache of the model cannot be rewound (sliding window full)")
        if stats.switched_off or room <= 0 or judge.calibrating():
            start, before = time.perf_counter(), count()
            y = int(pair.sampler(_logits(pair.target, pair.target_cache, [y]))[0])
            judge.plain(time.perf_counter() - start)
            _add(stats, "plain", before, count())
            stats.plain_steps += 1
            if not stats.switched_off:
                unseen.append(y)
            produced += 1
            yield y
            continue
        start = time.perf_counter()
        emitted, unseen = _round(pair, y, unseen, room, stats, count)
        y = emitted[-1]
        if judge.round(time.perf_counter() - start, room, len(emitted) - 1):
            _switch_off(stats, produced + len(emitted), "acceptance at or below the measured break-even")
        for token in emitted:
            produced += 1
            yield token


def _switch_off(stats: DraftStats, produced: int, reason: str) -> None:
    stats.switched_off += 1
    stats.switched_off_after = produced
    stats.switch_off_reason = reason


def _add(stats: DraftStats, kind: str, before: tuple[int, int], after: tuple[int, int]) -> None:
    calls, unique = after[0] - before[0], after[1] - before[1]
    setattr(stats, f"{kind}_layer_calls", getattr(stats, f"{kind}_layer_calls") + calls)
    setattr(stats, f"{kind}_unique_experts", getattr(stats, f"{kind}_unique_experts") + unique)


def _round(
    pair: Pair, y: int, unseen: list[int], depth: int, stats: DraftStats, count: ExpertCount
) -> tuple[list[int], list[int]]:
    """One draft+verify round: (tokens it yields, tokens the drafter has not seen after it)."""
    marks, drafts, feed = [], [], unseen
    for _ in range(depth):
        drafts.append(int(pair.sampler(_logits(pair.drafter, pair.draft_cache, feed)[-1:])[0]))
        marks.append(checkpoint(pair.draft_cache))  # after the context + drafts[:i]
        feed = drafts[-1:]
    target_mark = checkpoint(pair.target_cache)
    before = count()
    with attention_row_by_row(pair.target):  # each row as a decode step computes it: greedy identity
        verified = pair.sampler(_logits(pair.target, pair.target_cache, [y, *drafts])).tolist()
    _add(stats, "verify", before, count())
    accepted = next((i for i, (d, t) in enumerate(zip(drafts, verified)) if d != t), depth)
    stats.rounds += 1
    stats.drafted += depth
    stats.accepted += accepted
    if accepted < depth:
        _rewind_target(pair, target_mark, [y, *drafts[:accepted]], stats)
        restore(pair.draft_cache, marks[accepted])
        return [*drafts[:accepted], verified[accepted]], [verified[accepted]]
    return [*drafts, verified[depth]], [drafts[-1], verified[depth]]


def _rewind_target(pair: Pair, mark: list[Any], keep: list[int], stats: DraftStats) -> None:
    """Leave the target's cache holding the context plus `keep` (the verify pass fed it more)."""
    if trims_only(pair.target_cache):
        restore(pair.target_cache, mark, plus=len(keep))
        return
    restore(pair.target_cache, mark)  # a recurrent state cannot be trimmed: go back and replay the accepted rows
    with attention_row_by_row(pair.target):
        pair.target(mx.array(keep, mx.uint32)[None], cache=pair.target_cache)
        mx.eval([c.state for c in pair.target_cache])
    stats.replays += 1
