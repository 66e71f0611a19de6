"""A history plot drawn with block characters: newest value at the right, scaled to the largest shown."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

BLOCKS = " ▁▂▃▄▅▆▇█"


class History(deque):
    """A ring buffer of the latest `size` figures; what a `RatePlot` draws."""

    def __init__(self, size: int = 600):
        super().__init__(maxlen=size)
        self.added = 0  # figures appended so far, so a plot can tell it has something new to draw

    def append(self, value: float) -> None:
        super().append(value)
        self.added += 1


def columns(values: Iterable[float], width: int, height: int) -> list[str]:
    """Rows (top first) of a bar plot of the last `width` values, each bar in eighths of a cell."""
    shown = list(values)[-width:] if width > 0 else []
    shown = [0.0] * (width - len(shown)) + shown
    top = max(shown, default=0.0)
    levels = [round(v / top * height * 8) if top > 0 else 0 for v in shown]
    return [
        "".join(BLOCKS[min(8, max(0, level - (height - 1 - row) * 8))] for level in levels) for row in range(height)
    ]


class RatePlot(Widget):
    """Plots a `History`; `redraw()` after appending to it redraws only when it grew."""

    DEFAULT_CSS = "RatePlot { height: 1; }"
    unit = reactive("")

    def __init__(self, history: History, unit: str = "", **kwargs):
        super().__init__(**kwargs)
        self.history = history
        self.unit = unit
        self.drawn = -1

    def redraw(self) -> None:
        if self.history.added != self.drawn:
            self.drawn = self.history.added
            self.refresh()

    def render(self) -> Text:
        shown = list(self.history)[-self.size.width :] if self.size.width else []
        label = f" max {max(shown, default=0.0):.1f} {self.unit}" if self.unit else ""
        width = max(0, self.size.width - len(label))
        rows = columns(shown, width, max(1, self.size.height))
        text = Text("\n".join(rows), style="green")
        text.append(label, style="dim")
        return text
