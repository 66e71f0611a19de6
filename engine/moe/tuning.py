"""A store's tuned streaming settings: what `nightshift model tune` chose on this machine's drives, kept next to
the store's manifest and applied wherever the store is opened for streaming, unless a flag says otherwise.

Settings that win on one model lose on another (prefetch: +10.8 % on the bench model, -6 to -8 % on small2
with the same defaults; docs/results.md, issue [17]), so they are chosen per store, by measurement, and each
choice keeps the counters that prove it ran and the gain it measured. `tuning.json` is written atomically
(temp file + rename) and is not part of manifest.json: tuning again never touches what the import wrote. It
holds one record per set of drives tuned on (`model tune --use-drives`): a run reading from some drives takes
the record for exactly those, else the one for all the store's drives.

Light on purpose (no MLX): `generate` and the bench commands read it before the engine loads.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

from nightshift.engine.errors import NightshiftError
from nightshift.engine.moe.settings import StreamSettings

TUNING_FILE = "tuning.json"
FORMAT = 1
# The settings a calibration may choose; never what the user chooses for other reasons (cache size, checksums,
# drives in use, tracing).
TUNED = ("prefetch", "prefetch_off", "prefetch_limit", "demand_threads", "prefetch_threads", "split_reads",
         "balance_reads", "cache_policy")  # fmt: skip


class TuningError(NightshiftError):
    """A store's tuning.json cannot be read; tuning the store again rewrites it."""


def tuning_path(store: Path) -> Path:
    return Path(store) / TUNING_FILE


def read_tuning(store: Path) -> list[dict]:
    """The store's tuning records (one per set of drives it was tuned on); empty when never tuned."""
    path = tuning_path(store)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise TuningError(f"{path} cannot be read ({exc}); run `nightshift model tune` again or remove it") from exc
    records = data.get("tunings") if isinstance(data, dict) and data.get("format") == FORMAT else None
    if not isinstance(records, list) or not all(isinstance(r.get("settings"), dict) for r in records):
        raise TuningError(f"{path} is not a tuning file of format {FORMAT}; run `nightshift model tune` again")
    return records


def tuning_for(store: Path, use_drives: tuple[str, ...] = ()) -> dict | None:
    """The record for reading from `use_drives` (none: all the store's drives): one tuned on exactly those
    drives, else the one tuned on all of them, else None."""
    records = read_tuning(store)
    exact = [r for r in records if use_drives and sorted(r["drives_in_use"]) == sorted(use_drives)]
    every = [r for r in records if r["all_drives"]]
    return (exact or every or [None])[0]


def write_tuning(store: Path, record: dict) -> Path:
    """Keep `record` as the store's tuning for its drives in use (replacing an earlier one for the same drives),
    written atomically: a reader sees the old file or the new, never half of one."""
    path = tuning_path(store)
    same = sorted(record["drives_in_use"])
    kept = [r for r in read_tuning(store) if sorted(r["drives_in_use"]) != same]
    fd, tmp = tempfile.mkstemp(prefix=".tuning-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "tunings": [*kept, record]}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def tuned_values(settings: StreamSettings) -> dict:
    """The tunable fields of `settings` as JSON-ready values (prefetch_off as a sorted list)."""
    data = settings.as_dict()
    return {name: data[name] for name in TUNED}


def apply_tuning(store: Path, settings: StreamSettings, given: frozenset[str] = frozenset()) -> StreamSettings:
    """`settings` with the store's tuned values for its drives in use, except the fields in `given` (the
    user's flags)."""
    record = tuning_for(store, settings.use_drives)
    if record is None:
        return settings
    chosen = {k: v for k, v in record["settings"].items() if k in TUNED and k not in given}
    if "prefetch_off" in chosen:
        chosen["prefetch_off"] = frozenset(chosen["prefetch_off"])
    return replace(settings, **chosen)


def describe_tuning(store: Path, use_drives: tuple[str, ...] = ()) -> str:
    """One line for `generate` and the benchmarks: the tuned settings in use, on which drives, their measured
    gain and when; or how to tune."""
    record = tuning_for(store, use_drives)
    if record is None:
        return f"not tuned for these drives: `nightshift model tune {Path(store).name}` calibrates it (a few minutes)"
    default = tuned_values(StreamSettings())
    changed = [f"{k}={v}" for k, v in sorted(record["settings"].items()) if default.get(k) != v]
    drives = "all its drives" if record["all_drives"] else ",".join(record["drives_in_use"])
    if not changed:
        return f"tuned settings from {record['tuned_at']} on {drives}: the defaults won"
    return (
        f"tuned settings from {record['tuned_at']} on {drives} ({', '.join(changed)}; "
        f"{record['gain']:+.1%} measured against the defaults)"
    )
