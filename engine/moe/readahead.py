"""Read-ahead: guess the next layer's experts while this one runs, and read the guesses before it asks.

The next MoE layer's router applied to this layer's hidden state names its likely experts (engine/moe/
prefetch.py). In a decode step the most confident are held for drives done early with this layer's reads
(the tail, engine/moe/tail.py); once the layer's reads have landed and the drives are idle, the rest are
read ahead within the compute window before the next router (`StreamSettings.prefetch_cap`): by default each
uncached guess, most confident first, only while the time it saves if right beats what it costs if wrong
(`odds`: a read that runs past the window delays the next layer's own reads, and a wrong one's CPU is lost to
the compute), from how often guesses of its rank among the uncached were used so far (`RankOdds`); or as many
as the window holds (`window_fill`).
With `spare_demand_drives`, a read-ahead that would end past the window on a drive likely to hold one of the next
layer's demand reads (an uncached guess not read ahead) is held back: it would share that drive with the demands.
Each decode step's guess is scored when its layer asks: its recall is the share of the experts the layer asked
for that the whole guess named (the top-k of the next router, as bench/trained_routing.py counts it), whatever
the caps read of it; the share that was read ahead (in the tail or the prefetch, cached ones aside) is counted
beside it. A pass of many rows guesses the union of its rows' top-k and is not scored.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

from nightshift.engine.instruments.probes import ForeseenCall
from nightshift.engine.instruments.trace import PassTrace
from nightshift.engine.moe.figures import CallCounts
from nightshift.engine.moe.prefetch import Recall, Router, router_logits, router_of, top_experts
from nightshift.engine.moe.reader import ExpertReader
from nightshift.engine.moe.residency import Residency
from nightshift.engine.moe.settings import GUESSES, ODDS

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


@dataclass
class RankOdds:
    """Over decode steps: how often the layer used the uncached guess at each rank (most confident first).

    `odds` starts at one half (one use in two looks) and follows what is counted: after a few tokens the
    counts rule.
    """

    seen: list[int] = field(default_factory=list)
    used: list[int] = field(default_factory=list)

    def count(self, ranked: list[int], used: set[int]) -> None:
        """One step's uncached guesses in rank order against the experts its layer used."""
        for rank, expert in enumerate(ranked):
            if rank == len(self.seen):
                self.seen.append(0)
                self.used.append(0)
            self.seen[rank] += 1
            self.used[rank] += expert in used

    def odds(self, rank: int) -> float:
        seen, used = (self.seen[rank], self.used[rank]) if rank < len(self.seen) else (0, 0)
        return (used + 1) / (seen + 2)


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
        self._uncached: dict[int, list[int]] = {}  # layer -> that guess's experts not cached, in rank order
        self.odds = RankOdds()

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
        uncached = self._uncached.pop(layer, [])
        if predicted is None:
            return
        self.odds.count(uncached, set(unique))
        recall = self.recall.setdefault(layer, Recall())
        recall.needed += len(unique)
        recall.predicted_hits += len(predicted.intersection(unique))
        recall.read_ahead_hits += len(read_ahead.intersection(unique))

    def queue(self, layer: int, x: mx.array, step: bool) -> mx.array | None:
        """The next MoE layer's router on `x`, queued as soon as this layer's router is read back, so that it is
        computed while the layer looks up and demands its experts (`guess` reads it back); None where this pass does
        not read ahead or its guess is foreseen. (Queued instead after the cached experts, on a second CPU stream,
        it ran beside them but the decode was ~8 % slower: docs/results.md, session 13.)"""
        nxt = self._next.get(layer)
        if not self._reads_ahead(nxt, step) or self._foresight is not None:
            return None
        if not nxt.resolved:
            nxt.router, nxt.resolved = router_of(nxt.block, nxt.num_experts, x.shape[-1]), True
        return None if nxt.router is None else router_logits(nxt.router, x)

    def guess(self, layer: int, logits: mx.array | None, k: int, record: PassTrace, step: bool) -> Guess | None:
        """The next MoE layer's experts as predicted by its router's `logits` (`queue`), or None where this pass
        does not read ahead."""
        nxt = self._next.get(layer)
        if not self._reads_ahead(nxt, step):
            return None
        if self._foresight is not None:  # this call is counted when it ends: the next one's place is one on
            after = self.calls.calls + 1
            known = self._foresight[after] if after < len(self._foresight) else None
            if known is None or known[0] != nxt.layer:
                return None
            if step:
                self._predicted[nxt.layer] = set(known[1])
            return Guess(nxt.layer, list(known[1]))
        if logits is None:
            return None
        start = time.perf_counter()
        experts = top_experts(logits, k)
        record.predict_s = time.perf_counter() - start
        if step:
            self._predicted[nxt.layer] = set(experts)
        return Guess(nxt.layer, experts)

    def _reads_ahead(self, nxt: NextLayer | None, step: bool) -> bool:
        """Whether a pass (a decode step or not) reads ahead into the next MoE layer `nxt` (None: there is none)."""
        wanted_here = self.settings.prefetch or (not step and self.settings.prefill_prefetch)
        return nxt is not None and wanted_here and nxt.layer not in self.settings.prefetch_off

    def hold_tail(self, guess: Guess | None, step: bool) -> bool:
        """In a decode step, hold the guessed experts not cached (within the prefetch limit) for drives done
        with their share of this layer while another still reads; True when held (the reader ends the tail).
        With one drive in use there is no tail: none is done while another reads (holding cost ~75 us a layer
        call for nothing on moe128-mixtral's 4-bit copy)."""
        if guess is None or not step or not self.settings.prefetch_tail or len(self._drives_in_use()) < 2:
            return False
        held = self.residency.uncached(guess.layer, guess.experts)[: self.settings.prefetch_limit or None]
        self.reader.hold_tail(guess.layer, held)
        return True

    def prefetch(self, guess: Guess, read_in_tail: set[int], rows: int, step: bool) -> None:
        """Start reading the guessed experts not cached nor already read in this pass's tail, within the prefetch
        limit and, in a decode step, the window (`StreamSettings.prefetch_cap` says how it counts)."""
        uncached = self.residency.uncached(guess.layer, guess.experts)
        limit = max(0, self.settings.prefetch_limit - len(read_in_tail)) if self.settings.prefetch_limit else None
        fill = self.window_fill(guess.layer, rows) if step and self.settings.prefetch_fill else None
        if fill is not None and self.settings.prefetch_cap == GUESSES:  # the window counts cached guesses too
            counted = set([e for e in guess.experts if e not in read_in_tail][:fill])
            rest, fill = [e for e in uncached if e in counted], None
        else:
            rest = [e for e in uncached if e not in read_in_tail]
        if fill is not None and self.settings.prefetch_cap == ODDS:
            paying = self._paying(guess.layer, rows, [(rank, e) for rank, e in enumerate(uncached) if e in rest])
            self.reader.counts.declined_prefetch += max(0, min(fill, len(rest)) - len(paying))
            rest, fill = paying, None
        caps = [c for c in (limit, fill) if c is not None]
        ahead = rest[: min(caps)] if caps else rest
        if step and self.settings.spare_demand_drives and rows in self.windows:
            unread = [(rank, e) for rank, e in enumerate(uncached) if e not in ahead and e not in read_in_tail]
            kept = self._spare(guess.layer, ahead, unread, self.windows[rows])
            self.reader.counts.spared_prefetch += len(ahead) - len(kept)
            ahead = kept
        if step:
            self._read_ahead[guess.layer] = set(ahead) | read_in_tail
            self._uncached[guess.layer] = uncached
        self.reader.prefetch(guess.layer, ahead)

    def _paying(self, layer: int, rows: int, ranked: list[tuple[int, int]]) -> list[int]:
        """The uncached guesses (rank among the uncached, expert) worth reading ahead, in order.

        A read holds one of the D drives in use for T = D x t (t: one expert at the drives' summed bandwidth), so
        the read-aheads start in waves of D: the n-th starts (n // D) x T into the window W and has W_n = W -
        (n // D) x T of it left. Right (odds p), it saves min(T, W_n) of its drive's share of the next layer's
        reads; wrong, it holds its drive for max(0, T - W_n) after the next layer asks, and its read's CPU c
        (measured: the reader's `cpu_per_read`) was spent for nothing, taken from the compute where the cores are
        busy. Read while p x min(T, W_n) > (1 - p) x (max(0, T - W_n) + c): with slow drives (T >> c) a full window
        always pays and a read that would run past it only when it is likely to be used; with drives so fast that a
        read takes about its own CPU, only a guess likely to be used pays (on moe128-mixtral's 4-bit copy at 25 %,
        guesses used 7-18 % of the time were read ~70 a token, and reading none was 9-12 % faster; docs/results.md,
        session 13). Counted as one drive of D times the bandwidth (T = t, one read after another), a window
        shorter than one read on its drive looked like room for a read: on the 192-neuron export over 4 drives at
        20 MB/s (W 6 ms, t 8 ms, T 33 ms) guesses used half the time were read into the next layer's reads; timed
        on their drives, 1.04x faster (docs/results.md, session 14).
        """
        window, read_s = self.windows[rows], self._read_seconds(layer)
        if math.isinf(read_s):  # the drives deliver nothing in a window: no read ahead pays
            return []
        drives = len(self._drives_in_use())
        drive_s = read_s * drives
        cpu_s = self.reader.counts.cpu_per_read()
        paying: list[int] = []
        for rank, expert in ranked:
            left, odds = window - len(paying) // drives * drive_s, self.odds.odds(rank)
            if odds * min(drive_s, left) <= (1 - odds) * (max(0.0, drive_s - left) + cpu_s):
                break
            paying.append(expert)
        return paying

    def _spare(self, layer: int, ahead: list[int], unread: list[tuple[int, int]], window: float) -> list[int]:
        """The read-aheads of `ahead` (in order) that do not hold up the next layer's likely demand reads.

        `unread`: the uncached guesses not read ahead (rank among the uncached, expert); a drive is wanted when it
        holds a replica of one and they are more likely than not to bring it a demand read (1 - prod(1 - p) >= 1/2,
        p: the rank's odds). A read-ahead goes where the dispatcher would place it (the replica expected to finish
        first, the read-aheads kept before it counted); on a wanted drive it is kept only if it ends within the
        window, before the next layer asks.
        """
        spec = self.reader.layers[layer]
        dispatcher, placer = self.reader.dispatcher, self.reader.placer
        no_demand: dict[str, float] = {}  # drive -> odds that none of the unread guesses on it is asked for
        for rank, expert in unread:
            for drive, _ in placer.replicas(layer, expert):
                no_demand[drive] = no_demand.get(drive, 1.0) * (1 - self.odds.odds(rank))
        wanted = {drive for drive, odds in no_demand.items() if odds <= 0.5}
        queued: dict[str, int] = {}
        kept = []
        for expert in ahead:
            drives = [drive for drive, _ in placer.replicas(layer, expert)]
            ends = {d: dispatcher.expected_completion(d, queued.get(d, 0) + spec.file_bytes) for d in drives}
            drive = min(drives, key=ends.__getitem__)
            if drive in wanted and ends[drive] > window:
                continue
            queued[drive] = queued.get(drive, 0) + spec.file_bytes
            kept.append(expert)
        return kept

    def window_fill(self, layer: int, rows: int) -> int | None:
        """How many of `layer`'s experts the drives can read while the model computes up to its router.

        The window is the readback time of recent decode steps of `rows` rows (the compute between one layer's
        reads landing and the next layer's router, longer with more rows); beyond what fits in it, a wrong guess
        only takes bandwidth from the demands that follow. None until a window has been measured.
        """
        window = self.windows.get(rows)
        if window is None:
            return None
        return max(1, int(window / self._read_seconds(layer)))

    def _read_seconds(self, layer: int) -> float:
        """One of `layer`'s experts read at the drives' aggregate bandwidth (a layer's reads are balanced)."""
        bandwidth = self.reader.dispatcher.bandwidth(self._drives_in_use())
        return self.reader.layers[layer].file_bytes / bandwidth if bandwidth > 0 else math.inf  # delivering nothing

    def _drives_in_use(self) -> set[str]:
        return set(self.settings.use_drives or self.reader.manifest.drives)

    def recall_counts(self) -> tuple[int, int, int]:
        """(experts predicted layers needed in decode steps, of them named by their guess, of them read ahead),
        over every layer so far."""
        rows = self.recall.values()
        return sum(r.needed for r in rows), sum(r.predicted_hits for r in rows), sum(r.read_ahead_hits for r in rows)
