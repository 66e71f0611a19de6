"""Per-drive read throughput: each device's total next to nightshift's own reads of it, and a history plot.

The two figures are labelled apart: `device` counts every process's reads of the device (the OS's
counters), `nightshift` only the engine's reads of a streamed model's experts there (its counters).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from nightshift.app.tui.feed import DriveRow
from nightshift.app.tui.widgets.plot import History, RatePlot
from nightshift.app.tui.widgets.text import Fit, Line

DRIVE_STEP_S = 0.5  # the app appends a drive point with each read of the queue


def drive_figures(row: DriveRow, ours: float | None) -> tuple[str, ...]:
    """The row's renderings, longest first: four lines on a tall screen, down to one short line."""
    mine = "—" if ours is None else f"{ours:.1f}"
    share = f"{row.share:.0%} of {row.ceiling_mb_per_s:.0f} MB/s probed" if row.share is not None else "not probed"
    short_share = f"{row.share:.0%}" if row.share is not None else ""
    name = row.name[:8]
    return (
        f"{name:<8} {row.mb_per_s:7.1f} MB/s device, all processes\n"
        f"{'':<8} {mine:>7} MB/s nightshift (engine)\n{'':<8} {share}\n{'':<8} {row.origin}",
        f"{name:<8} {row.mb_per_s:7.1f} MB/s device · {mine} nightshift · {short_share or 'not probed'}",
        f"{name:<8} {row.mb_per_s:6.1f} device · {mine} ours {short_share}".rstrip(),
        f"{name[:5]:<5} {row.mb_per_s:.0f} dev {'—' if ours is None else f'{ours:.0f}'} ours",
    )


class DriveLine(Horizontal):
    DEFAULT_CSS = "DriveLine > Fit { width: 52; } DriveLine > RatePlot { width: 1fr; }"

    def __init__(self, name: str, history: History):
        super().__init__()
        self.drive = name
        self.figures = Fit(name)
        self.plot = RatePlot(history, "MB/s", DRIVE_STEP_S, floor=50.0)

    def compose(self) -> ComposeResult:
        yield self.figures
        yield self.plot

    def show(self, row: DriveRow, ours: float | None) -> None:
        self.figures.set(*drive_figures(row, ours))
        self.plot.ceiling = row.ceiling_mb_per_s
        self.plot.redraw()


class DrivePanel(Vertical):
    """Rows appear as the first rates arrive, and go when their drive does (drives.toml changed)."""

    def __init__(self, histories: dict[str, History], **kwargs):
        super().__init__(**kwargs)
        self.histories = histories
        self.lines: dict[str, DriveLine] = {}
        self.note = Line(classes="note")

    def compose(self) -> ComposeResult:
        yield self.note

    def show(self, rows: list[DriveRow], note: str, ours: dict[str, float]) -> None:
        """`ours`: nightshift's MB/s per engine drive name, from the running run's counters."""
        self.note.display = not rows
        self.note.set(note or "waiting for the first drive samples")
        for gone in set(self.lines) - {row.name for row in rows}:
            self.lines.pop(gone).remove()
        for row in rows:
            if row.name not in self.lines:
                self.lines[row.name] = DriveLine(row.name, self.histories.setdefault(row.name, History()))
                self.mount(self.lines[row.name])
            mine = [ours[name] for name in row.engine_drives if name in ours]
            self.lines[row.name].show(row, sum(mine) if mine else None)
