"""Where nightshift keeps the user's data: one directory, nothing hidden elsewhere.

`NIGHTSHIFT_HOME` overrides; otherwise the platform's convention (XDG on Linux,
Application Support on macOS).
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


def models_dir() -> Path:
    return data_dir() / "models"


def cache_dir() -> Path:
    """Downloads kept so a model can be rebuilt offline."""
    return data_dir() / "cache"
