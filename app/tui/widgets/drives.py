"""Per-drive read throughput: one row per drive with MB/s, share of its measured ceiling and a history plot."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from nightshift.app.tui.feed import DriveRow
from nightshift.app.tui.widgets.plot import History, RatePlot
from nightshift.app.tui.widgets.text import Line


class DriveLine(Horizontal):
    DEFAULT_CSS = "DriveLine { height: 1; } DriveLine > Line { width: 35; } DriveLine > RatePlot { width: 1fr; }"

    def __init__(self, name: str, history: History):
        super().__init__()
        self.drive = name
        self.figures = Line(name)
        self.plot = RatePlot(history, "MB/s")

    def compose(self) -> ComposeResult:
        yield self.figures
        yield self.plot

    def show(self, row: DriveRow) -> None:
        share = f"{row.share:4.0%} of {row.ceiling_mb_per_s:.0f}" if row.share is not None else "not probed"
        self.figures.set(f"{row.name[:8]:<8} {row.mb_per_s:7.1f} MB/s {share:>12}")
        self.plot.redraw()


class DrivePanel(Vertical):
    """Rows appear as the first rates arrive (the drives are those in drives.toml)."""

    def __init__(self, histories: dict[str, History], **kwargs):
        super().__init__(**kwargs)
        self.histories = histories
        self.lines: dict[str, DriveLine] = {}
        self.note = Line(classes="note")

    def compose(self) -> ComposeResult:
        yield self.note

    def show(self, rows: list[DriveRow], note: str) -> None:
        self.note.display = not rows
        self.note.set(note or "waiting for the first drive samples")
        for row in rows:
            if row.name not in self.lines:
                self.lines[row.name] = DriveLine(row.name, self.histories.setdefault(row.name, History()))
                self.mount(self.lines[row.name])
            self.lines[row.name].show(row)
