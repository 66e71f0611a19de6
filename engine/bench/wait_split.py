"""Where a streamed decode's waits for reads went: what the drive a layer waited on last was reading meanwhile.

A decode pass waits from the moment its reads are placed (`PassTrace.asked`) until the last one lands
(`wait_s`); the drive of that last read (the barrier) is the drive the layer waited on. Every read a drive
carried out is in the trace (`Trace.drive_reads`), so the barrier drive's time inside each wait is split by
whom it read for, in seconds of that drive at its bandwidth (a read's bytes inside the wait, at the read's
own average rate, over the drive's bandwidth):

    demand   the pass's own demand reads
    used     read-aheads of the pass's layer that it used (joined)
    unused   read-aheads of the pass's layer that it did not use (guessed wrong; aborted ones until they stop)
    other    reads of other layers: the next layer's read-aheads started in this pass's tail, a warm start
    idle     the rest of the wait: the drive read none of these (latency, a read queued behind a thread)

Summed over the decode's passes and divided by its tokens: seconds a token. `unused` is the stall a demand
read takes behind a wrong read-ahead on its drive; it is what `prefetch_abort` removes.

Also the placed layer floor: the layer floor (engine/bench/decode.py) with each pass's reads at the bandwidth
of the drives they were placed on (the busiest drive's bytes over one drive's bandwidth) instead of all the
drives' at once: where each expert has one replica, a layer's misses on one drive cannot be shared out.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from nightshift.engine.instruments.trace import CACHE, DEMAND, PREFETCH, DriveRead, PassTrace

CLASSES = ("demand", "used", "unused", "other", "idle")


@dataclass(frozen=True)
class WaitSplit:
    """Seconds a token: the decode's waits for reads, split by what the barrier drive read (module docstring)."""

    wait: float
    demand: float
    used: float
    unused: float
    other: float
    idle: float
    placed_layer_floor: float

    def as_ms(self) -> dict[str, float]:
        """wait_ms, wait_demand_ms ... wait_idle_ms and placed_layer_floor_ms, a token."""
        split = {f"wait_{name}_ms": round(1000 * getattr(self, name), 1) for name in CLASSES}
        return {
            "wait_ms": round(1000 * self.wait, 1),
            **split,
            "placed_layer_floor_ms": round(1000 * self.placed_layer_floor, 1),
        }


def overlap(read: DriveRead, begin: float, end: float) -> float:
    """Seconds of `read` inside [begin, end]."""
    return max(0.0, min(read.end, end) - max(read.start, begin))


def used_read_aheads(passes: list[PassTrace], reads: list[DriveRead]) -> set[DriveRead]:
    """The read-aheads a pass of their layer joined: the first pass of that layer whose wait began after the
    read did took the expert from a prefetch read."""
    by_layer: dict[int, list[PassTrace]] = defaultdict(list)
    for p in sorted(passes, key=lambda p: p.asked):
        by_layer[p.layer].append(p)
    used = set()
    for read in reads:
        if read.source != PREFETCH:
            continue
        later = next((p for p in by_layer.get(read.layer, []) if p.asked >= read.start), None)
        if later is not None and any(r.expert == read.expert and r.source == PREFETCH for r in later.reads):
            used.add(read)
    return used


def classify(read: DriveRead, layer: int, used: set[DriveRead]) -> str:
    """Whom `read` was for, seen from a pass of `layer` waiting behind it."""
    if read.layer != layer:
        return "other"
    if read.source == DEMAND:
        return "demand"
    return "used" if read in used else "unused"


def wait_split(
    passes: list[PassTrace], reads: list[DriveRead], drive_bandwidth: float, compute_per_pass: float, tokens: int
) -> WaitSplit:
    """The split of the decode `passes`' waits (module docstring), `drive_bandwidth` bytes/s of one drive,
    `compute_per_pass` seconds (the compute floor spread over the passes, as the layer floor does)."""
    used = used_read_aheads(passes, reads)
    on_drive: dict[str, list[DriveRead]] = defaultdict(list)
    for read in reads:
        on_drive[read.drive].append(read)
    totals = dict.fromkeys(CLASSES, 0.0)
    placed = 0.0
    for p in passes:
        per_drive: dict[str, int] = defaultdict(int)
        for r in p.reads:
            if r.source != CACHE:
                drives = r.drive.split("+")  # a read cut in parts: its bytes shared out over its drives
                for drive in drives:
                    per_drive[drive] += r.nbytes // len(drives)
        placed += max(max(per_drive.values(), default=0) / drive_bandwidth, compute_per_pass)
        last = p.last
        if last is None or p.wait_s <= 0:
            continue
        begin, end = p.asked, p.asked + p.wait_s
        barrier = last.drive.split("+")
        busy = dict.fromkeys(CLASSES, 0.0)
        for drive in barrier:
            for read in on_drive[drive]:
                inside = overlap(read, begin, end)
                if inside > 0:
                    rate = read.nbytes / max(read.end - read.start, 1e-9)
                    busy[classify(read, p.layer, used)] += inside * rate / drive_bandwidth / len(barrier)
        read_s = sum(busy.values())
        scale = min(1.0, p.wait_s / read_s) if read_s else 1.0  # a drive reads no faster than its bandwidth
        for name in ("demand", "used", "unused", "other"):
            totals[name] += busy[name] * scale
        totals["idle"] += max(0.0, p.wait_s - read_s * scale)
    wait = sum(p.wait_s for p in passes)
    return WaitSplit(wait / tokens, *(totals[name] / tokens for name in CLASSES), placed / tokens)
