"""Widgets that redraw only when what they show changed: most refreshes change nothing, and redraws cost CPU."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import DataTable, Static


class Line(Static):
    """Plain text (never markup: model output and paths may hold brackets)."""

    def __init__(self, text: str = "", **kwargs):
        super().__init__(text, markup=False, **kwargs)
        self.text = text

    def set(self, text: str) -> None:
        if text != self.text:
            self.text = text
            self.update(text)


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def fit_rows(
    rows: list[tuple[str, tuple]], headers: tuple[str, ...], squeeze: int, width: int
) -> list[tuple[str, tuple]]:
    """`rows` with column `squeeze` shortened to fit `width` columns (each column has 2 of padding)."""
    if not rows or not width:
        return rows
    widths = [max(len(h), *(len(str(cells[i])) for _, cells in rows)) for i, h in enumerate(headers)]
    room = width - sum(w for i, w in enumerate(widths) if i != squeeze) - 2 * len(widths) - 1
    if widths[squeeze] <= room:
        return rows
    room = max(room, len(headers[squeeze]))
    return [(key, tuple(shorten(str(c), room) if i == squeeze else c for i, c in enumerate(cells)))
            for key, cells in rows]  # fmt: skip


class Table(DataTable):
    """A row-cursor table refilled from (key, cells) rows; the cursor stays on its key; j and k move it.

    When the rows are wider than the table, the `squeeze` column's cells are shortened (ending in …) so
    that every column stays readable instead of the table scrolling sideways.
    """

    BINDINGS = [Binding("j", "cursor_down", "Down", show=False), Binding("k", "cursor_up", "Up", show=False)]

    def __init__(self, *columns: str, squeeze: int | None = None, **kwargs):
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.add_columns(*columns)
        self.headers = columns
        self.squeeze = squeeze
        self.shown: list[tuple[str, tuple]] = []

    def fill(self, rows: list[tuple[str, tuple]], width: int = 0) -> None:
        """Show `rows`, fitted to `width` columns when given."""
        if self.squeeze is not None:
            rows = fit_rows(rows, self.headers, self.squeeze, width)
        if rows == self.shown:
            return
        selected = self.selected()
        self.shown = rows
        self.clear()
        for key, cells in rows:
            self.add_row(*cells, key=key)
        keys = [key for key, _ in rows]
        if selected in keys:
            self.move_cursor(row=keys.index(selected), animate=False)

    def selected(self) -> str | None:
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value


class Fit(Widget):
    """The first of several renderings, longest first, that fits the widget's width and height.

    Narrow terminals get shorter wording of the same figures instead of cut-off text.
    """

    DEFAULT_CSS = "Fit { height: auto; }"

    def __init__(self, *variants: str, **kwargs):
        super().__init__(**kwargs)
        self.variants: tuple[str, ...] = variants

    def set(self, *variants: str) -> None:
        if variants != self.variants:
            self.variants = variants
            self.refresh(layout=True)

    @property
    def text(self) -> str:
        """What is drawn now."""
        return self.fitting(self.size.width or 10_000, self.size.height or 10_000)

    def fitting(self, width: int, height: int) -> str:
        for variant in self.variants:
            lines = variant.splitlines() or [""]
            if len(lines) <= height and max(map(len, lines)) <= width:
                return variant
        return self.variants[-1] if self.variants else ""

    def get_content_height(self, container, viewport, width: int) -> int:
        """Lines of the fitting rendering; the last resort wraps rather than lose its end."""
        lines = self.fitting(width, viewport.height).splitlines() or [""]
        return sum(max(1, -(-len(line) // max(1, width))) for line in lines)

    def render(self) -> Text:
        return Text(self.text, overflow="fold")
