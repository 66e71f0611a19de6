"""The barrier trace: what each pass (one layer's demand for its experts) waited on.

A pass records, for every expert it needed, where the bytes came from (a drive
read it issued, a prefetch read it joined, or the RAM cache), the drive, start
and end of the read and its size; how long the layer stalled reading the router's
indices back from MLX (evaluation, not I/O); and how long it then waited for
reads. The read that landed last is the barrier: shaving anything else is moot.
Times are seconds since the trace began.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

CACHE = "cache"
DEMAND = "demand"
PREFETCH = "prefetch"


@dataclass(frozen=True)
class ExpertRead:
    """How one expert reached a pass: source is CACHE, DEMAND (read for this pass) or PREFETCH (joined)."""

    expert: int
    source: str
    drive: str = ""
    start: float = 0.0
    end: float = 0.0
    nbytes: int = 0
    split: bool = False


@dataclass
class PassTrace:
    layer: int
    began: float
    rows: int = 1  # token rows in this call: 1 in decode, a chunk in prefill, k+1 in a speculative verify
    readback_s: float = 0.0  # router indices evaluated and copied to the host
    predict_s: float = 0.0  # the next layer's router logits (queued at the readback) read back, their top-k taken
    asked: float = 0.0  # when the wait for the pass's reads began (trace time)
    wait_s: float = 0.0  # from asking for the experts until the last one landed
    expert_s: float = 0.0  # queueing experts on MLX's stream as they landed, inside the wait (overlap; 0 when off)
    overlapped: int = 0  # experts run before the pass's last read landed
    reads: list[ExpertRead] = field(default_factory=list)

    @property
    def last(self) -> ExpertRead | None:
        """The read that landed last (the barrier), or None when nothing was read."""
        timed = [r for r in self.reads if r.source != CACHE]
        return max(timed, key=lambda r: r.end) if timed else None


@dataclass(frozen=True)
class DriveRead:
    """One read a drive carried out, whoever asked for it (a part of a cut read, an aborted read-ahead, a
    fallback): what a layer waited behind. `nbytes`: what was read, less than asked for when aborted."""

    layer: int
    expert: int
    source: str  # DEMAND or PREFETCH (read-aheads, tail and warm start alike)
    drive: str
    start: float
    end: float
    nbytes: int


class Trace:
    """The most recent passes (a ring of `keep`), appended by the streaming layer, and the drives' reads (a ring
    of `keep` too); thread-safe reads. `settle`, when set, is called before the passes are read: the stream adds a
    layer call's record at the next call (`ExpertStream.settle_accounts`), so the reads of passes come from the
    thread that runs the model, as the stream's figures do."""

    def __init__(self, keep: int = 100_000):
        self.settle: Callable[[], None] | None = None
        self.origin = time.perf_counter()
        self._passes: deque[PassTrace] = deque(maxlen=keep)
        self._drive_reads: deque[DriveRead] = deque(maxlen=keep)
        self._barriers: Counter[str] = Counter()  # kept passes whose barrier (last read) was on each drive
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def begin(self, layer: int) -> PassTrace:
        return PassTrace(layer=layer, began=self.now())

    def add(self, record: PassTrace) -> None:
        with self._lock:
            if len(self._passes) == self._passes.maxlen and (dropped := self._passes[0].last) is not None:
                self._barriers[dropped.drive] -= 1
            self._passes.append(record)
            if (last := record.last) is not None:
                self._barriers[last.drive] += 1

    def barrier_counts(self) -> dict[str, int]:
        """Per drive, how many kept passes its read landed last in; counted as passes are added (cheap per token)."""
        if self.settle is not None:
            self.settle()
        with self._lock:
            return {drive: n for drive, n in self._barriers.items() if n}

    def passes(self) -> list[PassTrace]:
        if self.settle is not None:
            self.settle()
        with self._lock:
            return list(self._passes)

    def read_done(self, read: DriveRead) -> None:
        """A drive finished (or stopped) a read; called by the reader threads."""
        with self._lock:
            self._drive_reads.append(read)

    def drive_reads(self) -> list[DriveRead]:
        with self._lock:
            return list(self._drive_reads)

    def summary(self) -> dict:
        """Totals over the kept passes: where a layer's time went, and which drive held the barrier."""
        passes = self.passes()
        sources: dict[str, int] = {}
        for p in passes:
            for r in p.reads:
                sources[r.source] = sources.get(r.source, 0) + 1
        one_row = [p for p in passes if p.rows == 1]  # decode steps; a prefill chunk's pass computes far longer
        return {
            "passes": len(passes),
            "readback_s": sum(p.readback_s for p in passes),
            "predict_s": sum(p.predict_s for p in passes),
            "wait_s": sum(p.wait_s for p in passes),
            "one_row_passes": len(one_row),
            "one_row_readback_s": sum(p.readback_s for p in one_row),
            "one_row_wait_s": sum(p.wait_s for p in one_row),
            "one_row_expert_s": sum(p.expert_s for p in one_row),
            "overlapped": sum(p.overlapped for p in passes),
            "barrier_drive_counts": self.barrier_counts(),
            "expert_sources": sources,
        }

    def dump_jsonl(self, path) -> None:
        """One JSON object per pass (with its barrier read), for offline study."""
        with open(path, "w") as f:
            for p in self.passes():
                record = asdict(p)
                record["last"] = asdict(p.last) if p.last else None
                f.write(json.dumps(record) + "\n")
