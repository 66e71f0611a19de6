"""Reads that bypass the page cache, so every byte read is a byte the drive delivered.

Expert files are 4 KiB-aligned and padded, so whole-file reads (or halves) go straight
into page-aligned buffers: O_DIRECT on Linux, F_NOCACHE on macOS. Where neither is
available (a file system refusing O_DIRECT, say tmpfs) the file is read normally and
its cached pages dropped with posix_fadvise(DONTNEED); `DirectFile.mode` says which.
"""

from __future__ import annotations

import errno
import mmap
import os
import sys
from dataclasses import dataclass

from nightshift.engine.errors import NightshiftError

# Direct I/O needs offsets, sizes and buffer addresses aligned to the device's logical
# block; 4 KiB covers every SSD and loop device we meet, and mmap gives page alignment.
ALIGNMENT = 4096

O_DIRECT_MODE = "O_DIRECT"
F_NOCACHE_MODE = "F_NOCACHE"
FADVISE_MODE = "fadvise DONTNEED (page cache not bypassed)"


class DirectReadError(NightshiftError):
    """A read that must bypass the page cache could not be set up or came back short."""


def aligned_buffer(size: int) -> mmap.mmap:
    """Anonymous, page-aligned memory of at least `size` bytes, rounded up to ALIGNMENT."""
    return mmap.mmap(-1, max(ALIGNMENT, round_up(size)))


def round_up(size: int) -> int:
    return -(-size // ALIGNMENT) * ALIGNMENT


@dataclass
class DirectFile:
    """An open file read around the page cache; `mode` names how (one of the *_MODE strings)."""

    path: str
    fd: int
    mode: str
    size: int

    def read_into(self, buffer: mmap.mmap | memoryview, offset: int, length: int | None = None) -> int:
        """Read `length` bytes (default: the buffer's length) at `offset` into `buffer`; returns bytes read.

        Offset and length must be multiples of ALIGNMENT; the last read of a file may come back short.
        """
        view = memoryview(buffer)
        if length is not None:
            view = view[:length]
        if offset % ALIGNMENT or len(view) % ALIGNMENT:
            raise DirectReadError(
                f"{self.path}: direct reads need {ALIGNMENT}-byte aligned offset and length, "
                f"got offset {offset} length {len(view)}"
            )
        try:
            done = os.preadv(self.fd, [view], offset)
        except OSError as exc:
            raise DirectReadError(f"{self.path}: read of {len(view)} bytes at {offset} failed: {exc}") from exc
        if self.mode == FADVISE_MODE:
            os.posix_fadvise(self.fd, offset, done, os.POSIX_FADV_DONTNEED)
        return done

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def open_direct(path: str | os.PathLike) -> DirectFile:
    """Open `path` for reads that bypass the page cache, by the best means this OS and file system allow."""
    path = os.fspath(path)
    if sys.platform.startswith("linux") and hasattr(os, "O_DIRECT"):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            return DirectFile(path, fd, O_DIRECT_MODE, os.fstat(fd).st_size)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: this file system refuses O_DIRECT; fall back below
                raise DirectReadError(f"cannot open {path} for reading: {exc.strerror}") from exc
    fd = _open_plain(path)
    if sys.platform == "darwin":
        import fcntl

        try:
            fcntl.fcntl(fd, fcntl.F_NOCACHE, 1)
            return DirectFile(path, fd, F_NOCACHE_MODE, os.fstat(fd).st_size)
        except OSError:
            pass
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return DirectFile(path, fd, FADVISE_MODE, os.fstat(fd).st_size)
    os.close(fd)
    raise DirectReadError(f"{path}: this system offers no way to read around the page cache")


def _open_plain(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise DirectReadError(f"cannot open {path} for reading: {exc.strerror}") from exc
