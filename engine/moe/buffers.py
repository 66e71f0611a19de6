"""A fixed pool of page-aligned read buffers, reused for every expert read.

Direct I/O needs aligned memory; allocating it per read would cost an mmap and a
page-fault storm each time, so a few buffers (one per reader thread) live for the
engine's lifetime and bound the memory reads can hold.
"""

from __future__ import annotations

import mmap
import queue
from collections.abc import Iterator
from contextlib import contextmanager

from nightshift.engine.io.direct import aligned_buffer


class BufferPool:
    """`count` buffers of `size` bytes; `take()` blocks while all are lent out."""

    def __init__(self, count: int, size: int):
        self.size = size
        self.count = count
        self._free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
        for _ in range(count):
            self._free.put(aligned_buffer(size))

    @contextmanager
    def take(self) -> Iterator[mmap.mmap]:
        buffer = self._free.get()
        try:
            yield buffer
        finally:
            self._free.put(buffer)

    @property
    def bytes(self) -> int:
        return self.count * self.size
