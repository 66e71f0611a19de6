"""Measured read ceilings per drive (`drive_ceilings.json` next to drives.toml).

`nightshift drives probe` writes them; the streaming dispatcher starts its per-drive
bandwidth and latency estimates from them. Each cell is one (read size, queue depth).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nightshift.engine.errors import NightshiftError

CEILINGS_FILE = "drive_ceilings.json"


class CeilingsFileError(NightshiftError):
    """The ceilings file is missing or unreadable."""


@dataclass(frozen=True)
class ProbeCell:
    """Direct reads of `read_bytes` with `queue_depth` in flight, for `seconds`."""

    read_bytes: int
    queue_depth: int
    reads: int
    seconds: float
    bytes_per_s: float
    mean_latency_s: float
    p99_latency_s: float


@dataclass
class DriveCeiling:
    """One drive's probe: where it is, how its reads bypassed the cache, and every cell measured."""

    name: str
    root: str
    device: str
    mode: str
    cells: list[ProbeCell] = field(default_factory=list)

    def best(self) -> ProbeCell:
        return max(self.cells, key=lambda c: c.bytes_per_s)

    def cell(self, read_bytes: int, queue_depth: int) -> ProbeCell | None:
        return next((c for c in self.cells if (c.read_bytes, c.queue_depth) == (read_bytes, queue_depth)), None)


@dataclass
class Ceilings:
    measured_at: str
    note: str  # how it was measured, e.g. "inside the rig's cgroup"
    drives: list[DriveCeiling]

    def save(self, path: Path) -> None:
        """Write atomically (temp + rename), so a reader never sees half a file."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Ceilings:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            drives = [DriveCeiling(**{**d, "cells": [ProbeCell(**c) for c in d["cells"]]}) for d in data["drives"]]
            return cls(data["measured_at"], data["note"], drives)
        except FileNotFoundError:
            raise CeilingsFileError(f"no drive ceilings at {path}; run `nightshift drives probe`") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise CeilingsFileError(
                f"{path} is not a drive ceilings file ({exc}); run `nightshift drives probe` again"
            ) from exc
