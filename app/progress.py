"""Status lines for long steps: never more than PROGRESS_EVERY_S without one.

A step inside the engine or a library (reading a GGUF's vocabulary, one calibration pass of
MoEfication) can take many seconds with nothing to say; `Heartbeat` then repeats the latest
status with the seconds since it began, so a user always sees that work goes on and where.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

PROGRESS_EVERY_S = 2.0

Say = Callable[[str], None]


def live(say: Say) -> Heartbeat:
    """A heartbeat for a command's progress on stderr: redrawn in place on a terminal; off one (a log,
    CI), where nothing redraws, the latest status as a line whenever PROGRESS_EVERY_S pass without one."""
    return Heartbeat(say, in_place=sys.stderr if sys.stderr.isatty() else None)


class Heartbeat:
    """Wraps `say`: `say` shows a line now and makes it the status; `note` changes the status quietly
    (for frequent updates, e.g. bytes done); the status is shown again whenever PROGRESS_EVERY_S pass
    without a line, with the seconds since the last `say`, and a noted status not yet shown is shown
    before the next `say` and at the end, so the last state of a step is always seen.

    With `in_place` (a terminal's stream), the status is instead redrawn on one line there every
    second and on every `note`, and a `say` starts a fresh line below it.
    """

    def __init__(self, say: Say, in_place: TextIO | None = None):
        self._say = say
        self._in_place = in_place
        self._drawn = False  # a status line is showing in place, not yet ended by a newline
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._status = ""
        self._timed = True
        self._unshown = False  # a note changed the status since it was last shown
        self._said = self._shown = time.monotonic()

    def say(self, message: str) -> None:
        with self._lock:
            if self._unshown:
                self._draw(time.monotonic())  # where the step ended (e.g. 100 %) before the next line
            self._end_line()
            self._say(message)
            self._status, self._timed, self._unshown, self._said = message, True, False, time.monotonic()
            self._shown = self._said

    def note(self, status: str, timed: bool = True) -> None:
        """Change the status; `timed=False` when it carries its own time (no seconds are added)."""
        with self._lock:
            self._status, self._timed, self._unshown = status, timed, True
            if self._in_place is not None:
                self._draw(time.monotonic())

    def _beat(self) -> None:
        every = 1.0 if self._in_place is not None else PROGRESS_EVERY_S
        while not self._stop.wait(PROGRESS_EVERY_S / 10):
            with self._lock:
                now = time.monotonic()
                if self._status and now - self._shown >= every:
                    self._draw(now)

    def _draw(self, now: float) -> None:
        line = f"{self._status} ({now - self._said:.0f} s)" if self._timed else self._status
        if self._in_place is None:
            self._say(line)
        else:
            print(f"\r  {line}\x1b[K", end="", file=self._in_place, flush=True)
            self._drawn = True
        self._shown, self._unshown = now, False

    def _end_line(self) -> None:
        if self._drawn:
            print(file=self._in_place, flush=True)
            self._drawn = False

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        with self._lock:
            if self._unshown and error is None:
                self._draw(time.monotonic())  # the last state of the work (e.g. 100 %), not a stale one
            self._end_line()
