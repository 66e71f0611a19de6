"""The service's own settings in the data dir's service.toml (optional; every key has a default).

    [service]
    batch_window = 60   # seconds: runs falling due this soon after the worker takes one up join its batch
    batch_width = 4     # runs that generate together at most; 1 turns batching off

    [notify]            # a word when a run's report is ready or the run failed (app/daemon/notify.py)
    desktop = true      # a desktop notification where one can be shown (notify-send, osascript)
    command = "/home/me/bin/on-report --quiet"   # run with the report's path and the state (done, failed)

Width counts runs, not sequences: each run brings all its answers (a split narrative's summary and one
per finding, up to its `[model] batch_width`), so a batch decodes the union of its runs' answers.
"""

from __future__ import annotations

import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from nightshift.app.daemon.notify import NotifySettings
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
    notify: NotifySettings = field(default_factory=NotifySettings)


def load_settings(path: Path | None = None) -> ServiceSettings:
    """The settings in `path` (the data dir's service.toml); the defaults when there is no such file."""
    path = path or service_settings()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return ServiceSettings()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{path}: not readable as TOML: {exc}; fix it or remove it (the defaults apply)") from None
    known = {"service": ("batch_window", "batch_width"), "notify": ("desktop", "command")}
    unknown = [key for key in data if key not in known] + [
        f"{table}.{key}" for table, keys in known.items() for key in data.get(table, {}) if key not in keys
    ]
    if unknown:
        raise SettingsError(f"{path}: unknown key(s) {', '.join(unknown)}; known: [service] batch_window, "
                            "batch_width; [notify] desktop, command")  # fmt: skip
    section = data.get("service", {})
    window = section.get("batch_window", ServiceSettings.batch_window)
    width = section.get("batch_width", ServiceSettings.batch_width)
    if isinstance(window, bool) or not isinstance(window, int | float) or not 0 <= window <= WINDOW_MAX_S:
        raise SettingsError(f"{path}: [service] batch_window = {window!r}: give seconds from 0 to {WINDOW_MAX_S}")
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= WIDTH_MAX:
        raise SettingsError(f"{path}: [service] batch_width = {width!r}: give a whole number of runs from 1 to "
                            f"{WIDTH_MAX} (1: no batching)")  # fmt: skip
    return ServiceSettings(float(window), width, _notify(path, data.get("notify", {})))


def _notify(path: Path, section: dict) -> NotifySettings:
    """`[notify]`: desktop on or off, and the hook's command line (split as a shell would, run without one)."""
    desktop = section.get("desktop", NotifySettings.desktop)
    command = section.get("command", "")
    if not isinstance(desktop, bool):
        raise SettingsError(f"{path}: [notify] desktop = {desktop!r}: give true or false")
    if not isinstance(command, str):
        raise SettingsError(f'{path}: [notify] command = {command!r}: give a command line as a string, e.g. '
                            '"/home/me/bin/on-report" (it gets the report\'s path and the state)')  # fmt: skip
    try:
        argv = tuple(shlex.split(command))
    except ValueError as exc:
        raise SettingsError(f"{path}: [notify] command = {command!r}: {exc}; check its quotes") from None
    return NotifySettings(desktop, argv)
