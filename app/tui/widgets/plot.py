"""A history plot drawn with block characters: newest value at the right, on a fixed, labelled scale.

The scale is the drive's probed ceiling when known, else a round number (1, 2 or 5 times a power of
ten) above the largest value still kept: a blip does not fill the plot after a busy minute, and the
plot does not rescale itself with every refresh. Two rows or more get a scale column on the left;
three or more a time axis under the bars.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from rich.text import Text
from textual.widget import Widget

from nightshift.app.tui.format import seconds

BLOCKS = " ▁▂▃▄▅▆▇█"
LABEL = 7  # width of the scale column


class History(deque):
    """A ring buffer of the latest `size` figures; what a `RatePlot` draws."""

    def __init__(self, size: int = 600):
        super().__init__(maxlen=size)
        self.added = 0  # figures appended so far, so a plot can tell it has something new to draw

    def append(self, value: float) -> None:
        super().append(value)
        self.added += 1

    def clear(self) -> None:
        super().clear()
        self.added += 1  # a plot redraws empty


def round_up(value: float, floor: float) -> float:
    """The smallest of 1, 2, 5 x 10^n at or above `value` (at least `floor`)."""
    value = max(value, floor)
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value * (1 - 1e-9))


def columns(values: Iterable[float], width: int, height: int, top: float | None = None) -> list[str]:
    """Rows (top first) of a bar plot of the last `width` values, each bar in eighths of a cell, `top` full
    (default: the largest value shown)."""
    shown = list(values)[-width:] if width > 0 else []
    shown = [0.0] * (width - len(shown)) + shown
    top = max(shown, default=0.0) if top is None else top
    # Any read at all shows as the lowest block: a small figure stays small, but never looks like none.
    levels = [min(height * 8, max(v > 0, round(v / top * height * 8))) if top > 0 else 0 for v in shown]
    return [
        "".join(BLOCKS[min(8, max(0, level - (height - 1 - row) * 8))] for level in levels) for row in range(height)
    ]


def figure(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.3g}"


class RatePlot(Widget):
    """Plots a `History` sampled every `step_s` seconds; `redraw()` after appending redraws only when it grew."""

    DEFAULT_CSS = "RatePlot { height: 1; }"

    def __init__(self, history: History, unit: str, step_s: float, floor: float, **kwargs):
        super().__init__(**kwargs)
        self.history = history
        self.unit = unit
        self.step_s = step_s
        self.floor = floor  # the least full scale: small figures stay small
        self.ceiling: float | None = None  # a fixed full scale (a drive's probed ceiling), if known
        self.drawn = -1

    def redraw(self) -> None:
        if self.history.added != self.drawn:
            self.drawn = self.history.added
            self.refresh()

    def scale(self) -> float:
        return self.ceiling or round_up(max(self.history, default=0.0), self.floor)

    def render(self) -> Text:
        width, height = self.size.width, max(1, self.size.height)
        top = self.scale()
        if height == 1:  # one row: the bars, then the scale
            label = f" /{figure(top)} {self.unit}"
            return Text(columns(self.history, max(0, width - len(label)), 1, top)[0], style="green").append(
                label, style="dim"
            )
        bars = height - 1 if height >= 3 else height
        plot_width = max(0, width - LABEL)
        text = Text()
        for row, line in enumerate(columns(self.history, plot_width, bars, top)):
            label = figure(top) if row == 0 else self.unit if row == 1 and bars > 2 else "0" if row == bars - 1 else ""
            text.append(f"{label:>{LABEL - 1}.{LABEL - 1}}┤", style="dim").append(line, style="green")
            text.append("\n" if row < bars - 1 or height >= 3 else "")
        if height >= 3:
            span = f"-{seconds(plot_width * self.step_s)}"
            text.append(" " * LABEL + span + "now".rjust(max(0, plot_width - len(span))), style="dim")
        return text
