"""One placed expert read carried out: direct I/O into a pooled buffer, other replicas on failure.

A read placed in parts (split or balanced) reads them at once, the first on the calling thread. A failed
read (I/O error, short file, bad checksum) falls back to the next replica, read whole; with none left the
error names every drive and file. Checksums are checked as `verify_checksums` says: never, every read, or
the first read of each file (or set of parts). A read given an `abort` (a read-ahead, with `prefetch_abort`) is
read in chunks of ABORT_CHUNK and stops at the first chunk after the abort is set: its layer asked without it,
and the drive goes to that layer's demands; with `load_left` each chunk stops counting on its drive as it lands.
Every read a drive carries out is handed to `log` (the trace's drive reads), aborted ones with the bytes they read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from nightshift.engine.instruments.trace import DriveRead, ExpertRead
from nightshift.engine.io.counters import DriveReadCounters
from nightshift.engine.io.direct import DirectReadError, open_direct
from nightshift.engine.moe.buffers import BufferPool
from nightshift.engine.moe.reads import (
    Abort,
    ExpertReadError,
    LoadedExpert,
    ReadAborted,
    ReadCounts,
    Ticket,
    decode,
)
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.tickets import Placer
from nightshift.engine.store.manifest import MoeLayer, sha256_bytes

# An abortable read's chunk: a 1.66 MB expert at 12 MB/s stops within 44 ms of its abort instead of running
# its 138 ms out; at 4 chunks an expert, the reads between them cost nothing measurable behind a throttle.
ABORT_CHUNK = 512 << 10


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
        log: Callable[[DriveRead], None] | None = None,
    ):
        """`threads`: the reader's threads, each of which may read one expert at a time; `log`: told of every
        read a drive carried out."""
        self.manifest = placer.manifest
        self.settings: StreamSettings = placer.settings
        self.placer = placer
        self.dispatcher = placer.dispatcher
        self.counters = counters
        self.clock = clock
        self.counts = counts
        self._lock = lock
        self._log = log
        parts = self.settings.split_reads or self.settings.balance_reads
        self._halves = ThreadPoolExecutor(threads, thread_name_prefix="ns-half") if parts else None
        self.buffers = BufferPool(threads, max(layer.file_bytes for layer in self.manifest.layers))
        self._verified: set[tuple[Path, ...]] = set()  # files (or split pairs) found intact ("first" mode)

    def load(
        self, spec: MoeLayer, expert: int, source: str, tickets: list[Ticket], abort: Abort | None = None
    ) -> LoadedExpert:
        """The expert read as placed by `tickets` (or from another replica), its tensors copied out of the buffer;
        with `abort`, read in chunks and given up (ReadAborted) once it is set."""
        with self.buffers.take() as buffer:
            read = self._read(buffer, _Read(spec, expert, source, abort), tickets)
            return LoadedExpert(decode(buffer, spec), read, spec.file_bytes)

    def close(self) -> None:
        if self._halves is not None:
            self._halves.shutdown(wait=True, cancel_futures=True)

    def _read(self, buffer, what: _Read, tickets: list[Ticket]) -> ExpertRead:
        """Fill `buffer` with the expert's file as placed (whole, or halves), then from other replicas on failure."""
        spec, expert, source = what.spec, what.expert, what.source
        problems: list[str] = []
        if len(tickets) > 1:
            read = self._read_split(buffer, what, tickets, problems)
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
            ok = self._read_part(buffer, what, ticket, problems)
            if ok and self._intact(buffer, spec, expert, (ticket.path,), ticket.drive, problems):
                return ExpertRead(expert, source, ticket.drive, start, self.clock(), spec.file_bytes)
            ticket = None
        names = "; ".join(problems)
        raise ExpertReadError(
            f"expert {expert} of layer {spec.layer}: no replica could be read ({names}); "
            "check the drive, then run `nightshift model verify` and re-import if no replica is intact"
        )

    def _read_split(self, buffer, what: _Read, parts: list[Ticket], problems: list[str]) -> ExpertRead | None:
        """Read the parts at once (the first on this thread); None when one failed or the whole is not intact.
        Every part has ended before this returns or raises: the buffer goes back to the pool after."""
        spec, expert, source = what.spec, what.expert, what.source
        start = self.clock()
        first, *rest = parts
        others = [self._halves.submit(self._read_part, buffer, what, part, problems) for part in rest]
        try:
            ok = self._read_part(buffer, what, first, problems)
        finally:
            wait(others)
        ok = all([other.result() for other in others]) and ok
        drives = "+".join(part.drive for part in parts)
        if not ok or not self._intact(buffer, spec, expert, tuple(part.path for part in parts), drives, problems):
            return None
        if self.settings.split_reads:  # balanced reads are counted where they are cut
            with self._lock:
                self.counts.split_reads += 1
        return ExpertRead(expert, source, drives, start, self.clock(), spec.file_bytes, split=True)

    def _read_part(self, buffer, what: _Read, ticket: Ticket, problems: list[str]) -> bool:
        """Read the ticket's bytes at its offset of its file into the same place of `buffer`; False (noted) on
        failure; ReadAborted once `what.abort` is set (checked between chunks)."""
        path, drive, length, offset = ticket.path, ticket.drive, ticket.nbytes, ticket.offset
        done = 0
        start = self.clock()
        self.counters.started(drive)
        chunk = ABORT_CHUNK if what.abort is not None else length
        booking = what.abort.book(drive, length, chunk) if what.abort is not None else None
        try:
            with open_direct(path) as f:
                view = memoryview(buffer)[offset : offset + length]
                while done < length and not what.aborted():
                    want = min(chunk, length - done)
                    got = f.read_into(view[done : done + want], offset + done)
                    done += got
                    if booking is not None:
                        self.dispatcher.settle(booking, got)
                    if got < want:
                        break  # the file ends early
            if done < length and what.aborted():
                with self._lock:
                    self.counts.aborted_prefetch += 1
                    self.counts.aborted_prefetch_bytes += length - done
                raise ReadAborted(f"{path}: read-ahead stopped after {done} of {length} bytes")
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
            self.dispatcher.finished(drive, length, ok=done == length, booking=booking)
            if self._log is not None:
                self._log(DriveRead(what.spec.layer, what.expert, what.source, drive, start, self.clock(), done))

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


@dataclass(frozen=True)
class _Read:
    """What one load reads: which expert, for whom, and the stop that aborts it (None: read it whole at once)."""

    spec: MoeLayer
    expert: int
    source: str
    abort: Abort | None

    def aborted(self) -> bool:
        return self.abort is not None and self.abort.is_set()
