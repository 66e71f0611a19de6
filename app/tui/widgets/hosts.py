"""Every host's drives when the service generates over several hosts (`nightshift serve --hosts`).

Drives on other hosts have no device counters here, so each line shows what the hosts themselves report:
per drive, the MB/s the engine read there over the last interval between the run's progress records (each
rank sends its drives' bytes with its beats) and the MB read in the running run. Shown only with --hosts.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from nightshift.app.tui.widgets.text import Fit, Line


def host_figures(host: dict, drive_bytes: dict[str, int], rates: dict[str, float]) -> tuple[str, ...]:
    """One host's line, longest first: every drive's rate and bytes read, down to its rates only."""

    def rate(drive: str) -> str:
        return f"{rates[drive]:.1f}" if drive in rates else "—"

    drives = host["drives"]
    label = host["host"]
    short = label.removeprefix("host ").split(" (rank ")[0][:16]
    total = sum(rates.get(d, 0.0) for d in drives)
    return (
        f"{label}: {total:.1f} MB/s · "
        + " · ".join(f"{d} {rate(d)} MB/s, {drive_bytes.get(d, 0) / 1e6:.0f} MB read" for d in drives),
        f"{label}: " + " · ".join(f"{d} {rate(d)} MB/s" for d in drives),
        f"{short}: " + " ".join(f"{d[:6]} {rate(d)}" for d in drives),
    )


class HostsPanel(Vertical):
    """One line per host, in rank order; hidden when the service runs on this machine alone."""

    DEFAULT_CSS = """
    HostsPanel { height: auto; max-height: 6; border: round $primary; border-title-align: left; padding: 0 1; }
    .-tall HostsPanel { max-height: 12; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.display = False  # until the service says it generates over hosts
        self.note = Line(classes="note")
        self.lines: list[Fit] = []

    def compose(self) -> ComposeResult:
        yield self.note

    def show(self, hosts: list[dict], drive_bytes: dict[str, int], rates: dict[str, float]) -> None:
        """`drive_bytes`: the running run's bytes per drive (every host's); `rates`: its MB/s per drive now."""
        self.display = bool(hosts)
        self.note.display = not drive_bytes
        self.note.set("no run is reading: each host's drives show here while a narrative is written")
        while len(self.lines) > len(hosts):
            self.lines.pop().remove()
        while len(self.lines) < len(hosts):
            self.lines.append(Fit())
            self.mount(self.lines[-1])
        for line, host in zip(self.lines, hosts, strict=True):
            line.set(*host_figures(host, drive_bytes, rates))
