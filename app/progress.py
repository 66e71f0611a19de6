"""Status lines for long steps: never more than PROGRESS_EVERY_S without one.

A step inside the engine or a library (reading a GGUF's vocabulary, one calibration pass of
MoEfication) can take many seconds with nothing to say; `Heartbeat` then repeats the latest
status with the seconds since it began, so a user always sees that work goes on and where.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

PROGRESS_EVERY_S = 2.0

Say = Callable[[str], None]


class Heartbeat:
    """Wraps `say`: `say` shows a line now and makes it the status; `note` changes the status quietly
    (for frequent updates, e.g. bytes done); the status is shown again whenever PROGRESS_EVERY_S pass
    without a line, with the seconds since the last `say`."""

    def __init__(self, say: Say):
        self._say = say
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._status = ""
        self._said = self._shown = time.monotonic()

    def say(self, message: str) -> None:
        with self._lock:
            self._say(message)
            self._status, self._said = message, time.monotonic()
            self._shown = self._said

    def note(self, status: str) -> None:
        with self._lock:
            self._status = status

    def _beat(self) -> None:
        while not self._stop.wait(PROGRESS_EVERY_S / 10):
            with self._lock:
                now = time.monotonic()
                if self._status and now - self._shown >= PROGRESS_EVERY_S:
                    self._say(f"{self._status} ({now - self._said:.0f} s)")
                    self._shown = now

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
