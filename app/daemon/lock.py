"""Single-instance lock: one scheduler service per data dir, and one review generating at a time.

Advisory `flock` locks on files in the data dir; the kernel drops them when a
process dies, so a killed service never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from nightshift.app.paths import engine_lock_file, private_file, service_lock
from nightshift.engine.errors import NightshiftError


class ServiceRunningError(NightshiftError):
    """A second `nightshift serve` was started on the same data dir."""


class InstanceLock:
    """Held while `nightshift serve` runs; the file holds the holder's pid for the error message."""

    def __init__(self, path: Path | None = None):
        self.path = path or service_lock()
        self._handle = None

    def acquire(self) -> None:
        handle = private_file(self.path).open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise ServiceRunningError(
                f"nightshift serve is already running for {self.path.parent} (pid {holder}); "
                "use that one (`nightshift jobs`), or stop it before starting another"
            ) from None
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


@contextmanager
def engine_lock(waiting: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Held while a review generates, across processes: one engine at a time. `waiting` is told if it blocks."""
    with private_file(engine_lock_file()).open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
