"""One placed expert read carried out: direct I/O into a pooled buffer, other replicas on failure.

A read placed in parts (split or balanced) reads them at once, the first on the calling thread. A failed
read (I/O error, short file, bad checksum) falls back to the next replica, read whole; with none left the
error names every drive and file. Checksums are checked as `verify_checksums` says: never, every read, or
the first read of each file (or set of parts).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nightshift.engine.instruments.trace import ExpertRead
from nightshift.engine.io.counters import DriveReadCounters
from nightshift.engine.io.direct import DirectReadError, open_direct
from nightshift.engine.moe.buffers import BufferPool
from nightshift.engine.moe.reads import ExpertReadError, LoadedExpert, ReadCounts, Ticket, decode
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.tickets import Placer
from nightshift.engine.store.manifest import MoeLayer, sha256_bytes


class ExpertFiles:
    """Reads placed expert files for one reader: its buffers, its thread for the parts, its counts (under its lock)."""

    def __init__(
        self,
        placer: Placer,
        counters: DriveReadCounters,
        clock: Callable[[], float],
        counts: ReadCounts,
        lock: threading.Lock,
        threads: int,
    ):
        """`threads`: the reader's threads, each of which may read one expert at a time."""
        self.manifest = placer.manifest
        self.settings: StreamSettings = placer.settings
        self.placer = placer
        self.dispatcher = placer.dispatcher
        self.counters = counters
        self.clock = clock
        self.counts = counts
        self._lock = lock
        parts = self.settings.split_reads or self.settings.balance_reads
        self._halves = ThreadPoolExecutor(threads, thread_name_prefix="ns-half") if parts else None
        self.buffers = BufferPool(threads, max(layer.file_bytes for layer in self.manifest.layers))
        self._verified: set[tuple[Path, ...]] = set()  # files (or split pairs) found intact ("first" mode)

    def load(self, spec: MoeLayer, expert: int, source: str, tickets: list[Ticket]) -> LoadedExpert:
        """The expert read as placed by `tickets` (or from another replica), its tensors copied out of the buffer."""
        with self.buffers.take() as buffer:
            read = self._read(buffer, spec, expert, source, tickets)
            return LoadedExpert(decode(buffer, spec), read, spec.file_bytes)

    def close(self) -> None:
        if self._halves is not None:
            self._halves.shutdown(wait=True, cancel_futures=True)

    def _read(self, buffer, spec: MoeLayer, expert: int, source: str, tickets: list[Ticket]) -> ExpertRead:
        """Fill `buffer` with the expert's file as placed (whole, or halves), then from other replicas on failure."""
        problems: list[str] = []
        if len(tickets) > 1:
            read = self._read_split(buffer, spec, expert, source, tickets, problems)
            if read is not None:
                return read
        remaining = dict(self.placer.replicas(spec.layer, expert))
        ticket = tickets[0] if len(tickets) == 1 else None
        while ticket is not None or remaining:
            if ticket is None:
                drive = self.dispatcher.choose(list(remaining), spec.file_bytes)
                ticket = Ticket(drive, remaining[drive], spec.file_bytes)
            remaining.pop(ticket.drive, None)
            start = self.clock()
            ok = self._read_part(buffer, ticket, problems)
            if ok and self._intact(buffer, spec, expert, (ticket.path,), ticket.drive, problems):
                return ExpertRead(expert, source, ticket.drive, start, self.clock(), spec.file_bytes)
            ticket = None
        names = "; ".join(problems)
        raise ExpertReadError(
            f"expert {expert} of layer {spec.layer}: no replica could be read ({names}); "
            "check the drive, then run `nightshift model verify` and re-import if no replica is intact"
        )

    def _read_split(
        self, buffer, spec: MoeLayer, expert: int, source: str, parts: list[Ticket], problems: list[str]
    ) -> ExpertRead | None:
        """Read the parts at once (the first on this thread); None when one failed or the whole is not intact."""
        start = self.clock()
        first, *rest = parts
        others = [self._halves.submit(self._read_part, buffer, part, problems) for part in rest]
        ok = self._read_part(buffer, first, problems)
        ok = all([other.result() for other in others]) and ok
        drives = "+".join(part.drive for part in parts)
        if not ok or not self._intact(buffer, spec, expert, tuple(part.path for part in parts), drives, problems):
            return None
        if self.settings.split_reads:  # balanced reads are counted where they are cut
            with self._lock:
                self.counts.split_reads += 1
        return ExpertRead(expert, source, drives, start, self.clock(), spec.file_bytes, split=True)

    def _read_part(self, buffer, ticket: Ticket, problems: list[str]) -> bool:
        """Read the ticket's bytes at its offset of its file into the same place of `buffer`; False (noted) on failure."""
        path, drive, length, offset = ticket.path, ticket.drive, ticket.nbytes, ticket.offset
        done = 0
        self.counters.started(drive)
        try:
            with open_direct(path) as f:
                done = f.read_into(memoryview(buffer)[offset : offset + length], offset)
            if done != length:
                raise DirectReadError(f"{path}: {done} bytes at {offset}, expected {length} (file truncated?)")
            return True
        except (DirectReadError, OSError) as exc:
            done = 0
            with self._lock:
                self.counts.fallbacks += 1
            problems.append(f"drive {drive}: {exc}")
            return False
        finally:
            self.counters.finished(drive, done)
            self.dispatcher.finished(drive, length, ok=done == length)

    def _intact(
        self, buffer, spec: MoeLayer, expert: int, paths: tuple[Path, ...], drive: str, problems: list[str]
    ) -> bool:
        """The bytes read from `paths` (one file, or the two halves' files) match the manifest, if checked."""
        mode = self.settings.verify_checksums
        if mode == "off" or (mode == "first" and paths in self._verified):
            return True
        expected = self.manifest.experts[spec.layer][expert]["sha256"]
        if sha256_bytes(memoryview(buffer)[: spec.file_bytes]) == expected:
            self._verified.add(paths)
            return True
        problems.append(f"drive {drive}: {' + '.join(map(str, paths))}: checksum mismatch")
        with self._lock:
            self.counts.fallbacks += 1
        return False
