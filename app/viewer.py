"""Opening a report's PDF: `$NIGHTSHIFT_PDF_VIEWER`, else the desktop's opener (`open` on macOS, `xdg-open`).

One place for the dashboard and `nightshift reports open`, and both say when nothing opened: no viewer,
no display for the desktop's opener, or an opener that gave up (xdg-open exits 3 or 4 when no
application takes PDFs) within the first seconds.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

VIEWER_VARIABLE = "NIGHTSHIFT_PDF_VIEWER"
GAVE_UP_WITHIN_S = 3.0  # an opener that fails says so at once; one still running (or done with 0) opened it


def viewer_command() -> list[str] | None:
    """How to open a PDF: $NIGHTSHIFT_PDF_VIEWER, else `open` (macOS) or `xdg-open`; None when there is none."""
    if os.environ.get(VIEWER_VARIABLE):
        return shlex.split(os.environ[VIEWER_VARIABLE])
    opener = "open" if sys.platform == "darwin" else "xdg-open"
    return [opener] if shutil.which(opener) else None


def open_pdf(path: Path) -> str | None:
    """Open `path` in a viewer; None when it opened, else why nothing did (one line, saying what to do)."""
    command = viewer_command()
    if command is None:
        return f"no PDF viewer found: set {VIEWER_VARIABLE} (e.g. to evince or zathura) or install xdg-utils"
    chosen = bool(os.environ.get(VIEWER_VARIABLE))
    if not chosen and sys.platform != "darwin" and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return (
            f"no display here (DISPLAY and WAYLAND_DISPLAY unset) for {command[0]}; set {VIEWER_VARIABLE} to a viewer"
        )
    try:
        viewer = subprocess.Popen([*command, str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)  # fmt: skip
    except OSError as exc:
        return f"cannot run {command[0]}: {exc.strerror or exc}"
    try:
        code = viewer.wait(timeout=GAVE_UP_WITHIN_S)
    except subprocess.TimeoutExpired:
        return None  # still showing it
    return (
        None if code == 0 else f"{command[0]} could not open it (exit status {code}); set {VIEWER_VARIABLE} to a viewer"
    )
