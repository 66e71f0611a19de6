"""What a stream counts as it goes (`Tally`), and its figures at one moment (`StreamFigures`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nightshift.engine.instruments.probes import RoutedCall
from nightshift.engine.moe.reads import Key, ReadCounts
from nightshift.engine.moe.warm import WarmCounts
from nightshift.engine.store.manifest import MoeLayer


@dataclass(frozen=True)
class PrefillReads:
    """One prefill's reads: bytes read from the drives, and the bytes of the distinct experts it needed."""

    bytes_read: int
    unique_bytes: int

    @property
    def amplification(self) -> float:
        return self.bytes_read / self.unique_bytes if self.unique_bytes else 0.0


@dataclass
class CallCounts:
    """Streaming layer calls, the rows they carried and the unique experts they selected (summed over calls).

    unique / calls is the mean number of experts one layer call reads: 1 row needs top-k, a speculative
    verify of k+1 rows needs the union of theirs.
    """

    calls: int = 0
    rows: int = 0
    unique: int = 0
    overlapped: int = 0  # experts run while others of their pass were still being read (the overlap proof)


@dataclass(frozen=True)
class DriveFigures:
    """What one drive has delivered so far."""

    bytes: int
    reads: int


@dataclass(frozen=True)
class StreamFigures:
    """A stream's counters at one moment, typed for the caller (made JSON only where a record is written).

    drives: bytes and reads completed per drive name.
    reads: what the reader did (demand, prefetch, joined, split, fallbacks, ...): config assertions check these.
    replica_choices: reads that had more than one replica to choose from (where the dispatch policy mattered).
    cache_hits, cache_misses: lookups in the RAM expert cache (0 without one).
    warm: what the warm start read and kept (engine/moe/warm.py); warm_hits: lookups it served.
    cache_budget, cache_used: the cache's budget now (auto: lowered while another process needs the RAM)
    and the bytes it holds; resident_layers: layers held stacked, as in RAM; cache_evictions.
    distinct_experts_read: (layer, expert) pairs read and used; with the drives' reads summed, the proof that
    no expert was read twice (equal when split reads are off).
    prefetch_recall: of the experts layers needed in decode steps, the share their next-layer guess had named
        (recall_hits of recall_needed: the counts, so a caller can take the recall of a stretch of them);
        recall_read_ahead: of them, those the caps let the tail or the prefetch read ahead.
    recall_per_layer: the same per predicted layer, rounded to 4 places.
    calls: streaming layer calls, the rows they carried, their unique and overlapped experts.
    """

    drives: dict[str, DriveFigures]
    reads: ReadCounts
    replica_choices: int
    cache_hits: int
    cache_misses: int
    cache_budget: int
    cache_used: int
    cache_evictions: int
    resident_layers: int
    distinct_experts_read: int
    prefetch_recall: float
    recall_per_layer: dict[int, float]
    calls: CallCounts
    recall_needed: int = 0
    recall_hits: int = 0
    recall_read_ahead: int = 0
    warm: WarmCounts = field(default_factory=WarmCounts)
    warm_hits: int = 0

    @property
    def bytes_read(self) -> int:
        """Bytes read from all drives together."""
        return sum(d.bytes for d in self.drives.values())

    @property
    def cache_hit_rate(self) -> float:
        lookups = self.cache_hits + self.cache_misses
        return self.cache_hits / lookups if lookups else 0.0


class Tally:
    """What a stream counts of its layer calls: calls, rows and experts (`calls`), lookups per expert (the
    routing profile's, saved at close), the experts read and used, and while prefilling, what the prompt needs."""

    def __init__(self, routing: list[RoutedCall] | None = None):
        """`routing`: a benchmark's log of every call (`Instruments.routing`), or None."""
        self.calls = CallCounts()
        self.lookups: dict[Key, int] = {}
        self.read: set[Key] = set()  # experts read and used: drive reads beyond these are re-reads
        self._routing = routing
        self._prefill_needed: set[Key] | None = None
        self._prefill_bytes_at = 0

    def note(self, layer: int, unique: list[int], rows: int, counts: list[int]) -> None:
        """One call's experts (`counts`: rows that chose each) into the lookup counts (and the routing log, when
        recording)."""
        for expert in unique:
            self.lookups[(layer, expert)] = self.lookups.get((layer, expert), 0) + 1
        if self._routing is not None:
            self._routing.append((layer, tuple(unique), rows, tuple(counts)))

    def need(self, layer: int, unique: list[int]) -> None:
        """A pass's experts toward the prompt's unique bytes, while prefilling."""
        if self._prefill_needed is not None:
            self._prefill_needed.update((layer, e) for e in unique)

    def call(self, rows: int, unique: int, overlapped: int = 0) -> None:
        """One layer call done: its rows, its unique experts, those run while others were still read."""
        self.calls.calls += 1
        self.calls.rows += rows
        self.calls.unique += unique
        self.calls.overlapped += overlapped

    def begin_prefill(self, bytes_read: int) -> None:
        """Start counting what a prompt needs; `bytes_read`: the drives' total so far."""
        self._prefill_needed = set()
        self._prefill_bytes_at = bytes_read

    def end_prefill(self, bytes_read: int, layers: dict[int, MoeLayer]) -> PrefillReads:
        """The prompt's reads since `begin_prefill` (`bytes_read`: the drives' total now)."""
        needed, self._prefill_needed = self._prefill_needed or set(), None
        unique = sum(layers[layer].file_bytes for layer, _ in needed)
        return PrefillReads(bytes_read - self._prefill_bytes_at, unique)
