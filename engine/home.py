"""The user's data dir: where the app keeps reviews, runs and models (app/paths.py), and where the engine keeps
what runs learn about a store (its routing profile, engine/moe/warm.py) rather than in the store, which may be
read-only media or shared by several processes.

`NIGHTSHIFT_HOME` overrides it; otherwise the platform's convention (XDG on Linux, Application Support on macOS).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def data_dir() -> Path:
    """The user's nightshift data directory (not created here)."""
    if home := os.environ.get("NIGHTSHIFT_HOME"):
        return Path(home).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "nightshift"
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "nightshift"
