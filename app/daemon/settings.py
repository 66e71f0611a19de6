"""The service's own settings: `[service]` in the data dir's service.toml (optional; every key has a default).

    [service]
    batch_window = 60   # seconds: runs falling due this soon after the worker takes one up join its batch
    batch_width = 4     # runs that generate together at most; 1 turns batching off

Width counts runs, not sequences: each run brings all its answers (a split narrative's summary and one
per finding, up to its `[model] batch_width`), so a batch decodes the union of its runs' answers.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from nightshift.app.paths import service_settings
from nightshift.engine.errors import NightshiftError

WINDOW_MAX_S = 3600  # an hour: a run is never held back longer waiting for company
WIDTH_MAX = 64


class SettingsError(NightshiftError):
    """service.toml cannot be used as written."""


@dataclass(frozen=True)
class ServiceSettings:
    batch_window: float = 60.0
    batch_width: int = 4


def load_settings(path: Path | None = None) -> ServiceSettings:
    """The settings in `path` (the data dir's service.toml); the defaults when there is no such file."""
    path = path or service_settings()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return ServiceSettings()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{path}: not readable as TOML: {exc}; fix it or remove it (the defaults apply)") from None
    unknown = [key for key in data if key != "service"] + [
        f"service.{key}" for key in data.get("service", {}) if key not in ("batch_window", "batch_width")
    ]
    if unknown:
        raise SettingsError(f"{path}: unknown key(s) {', '.join(unknown)}; known: [service] batch_window, batch_width")
    section = data.get("service", {})
    window = section.get("batch_window", ServiceSettings.batch_window)
    width = section.get("batch_width", ServiceSettings.batch_width)
    if isinstance(window, bool) or not isinstance(window, int | float) or not 0 <= window <= WINDOW_MAX_S:
        raise SettingsError(f"{path}: [service] batch_window = {window!r}: give seconds from 0 to {WINDOW_MAX_S}")
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= WIDTH_MAX:
        raise SettingsError(f"{path}: [service] batch_width = {width!r}: give a whole number of runs from 1 to "
                            f"{WIDTH_MAX} (1: no batching)")  # fmt: skip
    return ServiceSettings(float(window), width)
