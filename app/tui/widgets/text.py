"""Widgets that redraw only when what they show changed: most refreshes change nothing, and redraws cost CPU."""

from __future__ import annotations

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


class Table(DataTable):
    """A row-cursor table refilled from (key, cells) rows; the cursor stays on its key."""

    def __init__(self, *columns: str, **kwargs):
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.add_columns(*columns)
        self.shown: list[tuple[str, tuple]] = []

    def fill(self, rows: list[tuple[str, tuple]]) -> None:
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
