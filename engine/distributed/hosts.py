"""hosts.json: mlx's hostfile (what `mlx.launch --hostfile` reads) with each host's drives added.

```json
{"hosts": [
  {"ssh": "mac-a.local", "ips": ["10.0.0.1"], "drives": {"a0": "/Volumes/A0", "a1": "/Volumes/A1"},
   "python": "/Users/me/nightshift/.venv/bin/python", "read_mbps": 5200},
  {"ssh": "mac-b.local", "ips": ["10.0.0.2"], "drives": "/Users/me/.local/share/nightshift/drives.toml"}
]}
```

Host i is rank i (mlx's ring order; rank 0 runs the last layers and reports the tokens). `drives`: drive
name -> root on that host, or the path of that host's drives.toml as seen from here. `read_mbps` (MB/s
the host's drives read together) weighs placement; without it the host's `drive_ceilings.json` (next to
its drives.toml, from `nightshift drives probe`) is used if readable here. `python`/`cwd`: how to start a
rank there (default: this interpreter, this directory). mlx.launch ignores the keys it does not know.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from nightshift.engine.errors import NightshiftError
from nightshift.engine.io.ceilings import CEILINGS_FILE, Ceilings, CeilingsFileError
from nightshift.engine.io.drives import Drive, load_drives

LOCAL = ("127.0.0.1", "localhost", "::1")


class PipelineError(NightshiftError):
    """A pipeline cannot be set up, or a rank stopped (the message names the host)."""


@dataclass(frozen=True)
class Host:
    """One host of the pipeline as hosts.json names it."""

    rank: int
    ssh: str
    ip: str
    drives: tuple[Drive, ...]
    read_mbps: float | None
    ceilings: str | None  # drive_ceilings.json on that host, if known
    python: str
    cwd: str

    @property
    def local(self) -> bool:
        return self.ssh in LOCAL

    @property
    def label(self) -> str:
        """How errors name the host."""
        return f"host {self.ssh} (rank {self.rank})"


def load_hosts(path: Path) -> list[Host]:
    """The hosts of hosts.json at `path`, checked: at least two, each with an IP and drives."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PipelineError(f"cannot read hosts file {path}: {exc}") from exc
    entries = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(entries, list) or len(entries) < 2:
        raise PipelineError(f'{path}: list at least two hosts under "hosts" (see docs/distributed.md)')
    hosts = []
    for rank, entry in enumerate(entries):
        where = f"{path}: host {rank}"
        if not isinstance(entry, dict) or not entry.get("ssh") or not entry.get("ips"):
            raise PipelineError(f'{where} needs "ssh" (a host name) and "ips" (the ring backend connects to IPs)')
        drives, ceilings = host_drives(entry.get("drives"), path.parent, where)
        mbps = entry.get("read_mbps")
        if mbps is not None and (not isinstance(mbps, int | float) or mbps <= 0):
            raise PipelineError(f"{where}: read_mbps must be a positive number (MB/s), not {mbps!r}")
        hosts.append(
            Host(
                rank,
                str(entry["ssh"]),
                str(entry["ips"][0]),
                drives,
                float(mbps) if mbps else None,
                ceilings,
                str(entry.get("python") or sys.executable),
                str(entry.get("cwd") or Path.cwd()),
            )
        )
    names = [d.name for h in hosts for d in h.drives]
    if len(set(names)) != len(names):
        raise PipelineError(f"{path}: two hosts name the same drive; every drive name must be unique across hosts")
    return hosts


def host_drives(value, base: Path, where: str) -> tuple[tuple[Drive, ...], str | None]:
    """A host's drives from a {name: root} table or a drives.toml path; and its ceilings file if one is there."""
    if isinstance(value, str):
        toml = (base / value).expanduser()
        drives = tuple(load_drives(toml))
        ceilings = toml.parent / CEILINGS_FILE
        return drives, str(ceilings) if ceilings.is_file() else None
    if isinstance(value, dict) and value and all(isinstance(v, str) for v in value.values()):
        return tuple(Drive(name, Path(root)) for name, root in value.items()), None
    raise PipelineError(f'{where}: "drives" must be a table of drive name -> root, or the path of a drives.toml')


def read_rate(host: Host) -> float | None:
    """Bytes/s the host's drives read together: its read_mbps, else its probe's best cells summed, else None."""
    if host.read_mbps:
        return host.read_mbps * 1e6
    if host.ceilings is None:
        return None
    try:
        ceilings = Ceilings.load(Path(host.ceilings))
    except CeilingsFileError:
        return None
    names = {d.name for d in host.drives}
    rates = [d.best().bytes_per_s for d in ceilings.drives if d.name in names and d.cells]
    return sum(rates) if len(rates) == len(names) else None


def ring_hostfile(hosts: list[Host], port: int) -> str:
    """mlx's ring hostfile (MLX_HOSTFILE): per rank, the address it listens on (one port per rank, as mlx.launch)."""
    return json.dumps([[f"{h.ip}:{port + h.rank}"] for h in hosts])
