"""Drives as nightshift sees them: directories on mounts, listed in `drives.toml`.

```toml
[[drive]]
name = "ssd0"                 # unique, short; shown on the dashboard
root = "/Volumes/ssd0/nightshift"   # a directory on the drive's file system
budget_gb = 500               # optional: most nightshift may store there
```
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from nightshift.engine.errors import NightshiftError


class DrivesFileError(NightshiftError):
    """`drives.toml` is missing, malformed or names a drive that cannot be used."""


@dataclass(frozen=True)
class Drive:
    """One drive: a root directory nightshift writes expert files under."""

    name: str
    root: Path
    budget_bytes: int | None = None


def parse_drives(text: str, source: str = "drives.toml") -> list[Drive]:
    """Drives from the text of a drives file; errors name the file and the entry."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DrivesFileError(f"{source}: not valid TOML ({exc})") from exc
    entries = data.get("drive")
    if not isinstance(entries, list) or not entries:
        raise DrivesFileError(f"{source}: no [[drive]] entries; add one per drive with a name and a root")
    drives: list[Drive] = []
    for number, entry in enumerate(entries, 1):
        where = f"{source}: drive #{number}"
        if not isinstance(entry.get("name"), str) or not entry["name"]:
            raise DrivesFileError(f"{where} needs a name")
        if not isinstance(entry.get("root"), str) or not entry["root"]:
            raise DrivesFileError(f"{where} ({entry['name']}) needs a root directory")
        budget = entry.get("budget_gb")
        if budget is not None and (not isinstance(budget, (int, float)) or budget <= 0):
            raise DrivesFileError(f"{where} ({entry['name']}): budget_gb must be a positive number")
        drives.append(
            Drive(entry["name"], Path(entry["root"]).expanduser(), int(budget * 1e9) if budget is not None else None)
        )
    names = [d.name for d in drives]
    if len(set(names)) != len(names):
        raise DrivesFileError(f"{source}: drive names must be unique, got {names}")
    return drives


def load_drives(path: Path) -> list[Drive]:
    """Drives listed in the file at `path`."""
    path = Path(path)
    if not path.is_file():
        raise DrivesFileError(f"no drives file at {path}; write one (see `nightshift rig up` for a test rig)")
    return parse_drives(path.read_text(), str(path))


def format_drives(drives: list[Drive]) -> str:
    """The text of a drives file listing `drives` (what the rig and the planner write)."""
    lines = ["# nightshift drives: one [[drive]] per directory on a mount", ""]
    for drive in drives:
        # JSON string escapes are valid TOML basic-string escapes.
        lines += ["[[drive]]", f"name = {json.dumps(drive.name)}", f"root = {json.dumps(str(drive.root))}"]
        if drive.budget_bytes is not None:
            lines.append(f"budget_gb = {drive.budget_bytes / 1e9:g}")
        lines.append("")
    return "\n".join(lines)
