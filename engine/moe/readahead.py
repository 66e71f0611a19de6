"""Read-ahead: guess the next layer's experts while this one runs, and read the guesses before it asks.

The next MoE layer's router applied to this layer's hidden state names its likely experts (engine/moe/
prefetch.py). In a decode step the most confident are held for drives done early with this layer's reads
(the tail, engine/moe/tail.py); once the layer's reads have landed and the drives are idle, the rest are
read ahead, as many as the compute window before the next router lets the drives read (`window_fill`).
Each decode step's guess is scored when its layer asks: its recall is the share of the experts the layer asked
for that the whole guess named (the top-k of the next router, as bench/trained_routing.py counts it), whatever
the caps read of it; the share that was read ahead (in the tail or the prefetch, cached ones aside) is counted
beside it. A pass of many rows guesses the union of its rows' top-k and is not scored.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from nightshift.engine.instruments.probes import ForeseenCall
from nightshift.engine.instruments.trace import PassTrace
from nightshift.engine.moe.figures import CallCounts
from nightshift.engine.moe.prefetch import Recall, Router, predict, router_of
from nightshift.engine.moe.reader import ExpertReader
from nightshift.engine.moe.residency import Residency

WINDOW_SMOOTHING = 0.2


@dataclass
class NextLayer:
    """The MoE layer after a given one, and (once resolved against a real hidden state) its router."""

    layer: int
    block: nn.Module
    num_experts: int
    router: Router | None = None
    resolved: bool = False


@dataclass(frozen=True)
class Guess:
    """The experts a layer is predicted to ask for, most confident first."""

    layer: int
    experts: list[int]


class ReadAhead:
    """One stream's next-layer guesses, their reads (tail and prefetch) and their recall per layer."""

    def __init__(
        self,
        reader: ExpertReader,
        residency: Residency,
        calls: CallCounts,
        foresight: list[ForeseenCall] | None = None,
    ):
        """`calls`: the stream's call counts; `foresight`: a benchmark's recorded calls to guess from instead of
        the routers (`Instruments.foresight`), found by those counts."""
        self.reader = reader
        self.settings = reader.settings
        self.residency = residency
        self.calls = calls
        self.recall: dict[int, Recall] = {}
        self.windows: dict[int, float] = {}  # rows -> seconds, smoothed readback of decode steps that wide
        self._foresight = foresight
        self._next: dict[int, NextLayer] = {}
        self._predicted: dict[int, set[int]] = {}  # layer -> a decode step's whole guess for it
        self._read_ahead: dict[int, set[int]] = {}  # layer -> what of that guess was read ahead (tail, prefetch)

    def follow(self, layer: int, next_layer: int, block: nn.Module, num_experts: int) -> None:
        """Declare that `next_layer` (its MoE block `block`) follows `layer`: its router predicts from here."""
        self._next[layer] = NextLayer(next_layer, block, num_experts)

    def measured(self, rows: int, seconds: float) -> None:
        """A decode step of `rows` rows read its router's choice back after `seconds`: the compute window a
        read-ahead can fill, smoothed over recent steps of as many rows."""
        old = self.windows.get(rows)
        self.windows[rows] = seconds if old is None else old + WINDOW_SMOOTHING * (seconds - old)

    def score(self, layer: int, unique: list[int]) -> None:
        """Count the experts `layer` asked for against the decode step's guess made for it, if one was (its
        recall), and against what of the guess was read ahead."""
        predicted = self._predicted.pop(layer, None)
        read_ahead = self._read_ahead.pop(layer, set())
        if predicted is None:
            return
        recall = self.recall.setdefault(layer, Recall())
        recall.needed += len(unique)
        recall.predicted_hits += len(predicted.intersection(unique))
        recall.read_ahead_hits += len(read_ahead.intersection(unique))

    def guess(self, layer: int, x: mx.array, k: int, record: PassTrace, step: bool) -> Guess | None:
        """The next MoE layer's experts as predicted from `x`, or None where this pass does not read ahead."""
        nxt = self._next.get(layer)
        wanted_here = self.settings.prefetch or (not step and self.settings.prefill_prefetch)
        if nxt is None or not wanted_here or nxt.layer in self.settings.prefetch_off:
            return None
        if self._foresight is not None:  # this call is counted when it ends: the next one's place is one on
            after = self.calls.calls + 1
            known = self._foresight[after] if after < len(self._foresight) else None
            if known is None or known[0] != nxt.layer:
                return None
            if step:
                self._predicted[nxt.layer] = set(known[1])
            return Guess(nxt.layer, list(known[1]))
        if not nxt.resolved:
            nxt.router, nxt.resolved = router_of(nxt.block, nxt.num_experts, x.shape[-1]), True
        if nxt.router is None:
            return None
        start = time.perf_counter()
        experts = predict(nxt.router, x, k)
        record.predict_s = time.perf_counter() - start
        if step:
            self._predicted[nxt.layer] = set(experts)
        return Guess(nxt.layer, experts)

    def hold_tail(self, guess: Guess | None, step: bool) -> bool:
        """In a decode step, hold the guessed experts not cached (within the prefetch limit) for drives done
        with their share of this layer while another still reads; True when held (the reader ends the tail)."""
        if guess is None or not step or not self.settings.prefetch_tail:
            return False
        held = self.residency.uncached(guess.layer, guess.experts)[: self.settings.prefetch_limit or None]
        self.reader.hold_tail(guess.layer, held)
        return True

    def prefetch(self, guess: Guess, read_in_tail: set[int], rows: int, step: bool) -> None:
        """Start reading the guessed experts not cached nor already read in this pass's tail, within the caps
        (which count reads: a cached guess takes none of the window)."""
        limit = max(0, self.settings.prefetch_limit - len(read_in_tail)) if self.settings.prefetch_limit else None
        fill = self.window_fill(guess.layer, rows) if step and self.settings.prefetch_fill else None
        caps = [c for c in (limit, fill) if c is not None]
        rest = [e for e in self.residency.uncached(guess.layer, guess.experts) if e not in read_in_tail]
        ahead = rest[: min(caps)] if caps else rest
        if step:
            self._read_ahead[guess.layer] = set(ahead) | read_in_tail
        self.reader.prefetch(guess.layer, ahead)

    def window_fill(self, layer: int, rows: int) -> int | None:
        """How many of `layer`'s experts the drives can read while the model computes up to its router.

        The window is the readback time of recent decode steps of `rows` rows (the compute between one layer's
        reads landing and the next layer's router, longer with more rows); beyond what fits in it, a wrong guess
        only takes bandwidth from the demands that follow. None until a window has been measured.
        """
        window = self.windows.get(rows)
        if window is None:
            return None
        in_use = set(self.settings.use_drives or self.reader.manifest.drives)
        bandwidth = self.reader.dispatcher.bandwidth(in_use)
        return max(1, int(window * bandwidth / self.reader.layers[layer].file_bytes))

    def recall_counts(self) -> tuple[int, int, int]:
        """(experts predicted layers needed in decode steps, of them named by their guess, of them read ahead),
        over every layer so far."""
        rows = self.recall.values()
        return sum(r.needed for r in rows), sum(r.predicted_hits for r in rows), sum(r.read_ahead_hits for r in rows)
