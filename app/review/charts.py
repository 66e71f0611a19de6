"""Bar charts as inline SVG for the PDF: drawn here, so nothing is fetched and fonts stay the report's."""

from __future__ import annotations

from decimal import Decimal

from markupsafe import Markup, escape

WIDTH, ROW, LABEL, PAD = 480, 22, 110, 8
CHAR = 5.1  # the width of a figure's character at font-size 8 in DejaVu Sans (digits are 0.64 em)
CURRENT, PREVIOUS = "#2f5d8a", "#b8c7d9"


def bar_chart(bars: list[tuple[str, Decimal, Decimal | None]], current: str, previous: str | None) -> Markup:
    """Horizontal bars per label (current, and previous when given) around a zero line; negatives go left."""
    values = [abs(v) for _, now, before in bars for v in (now, before) if v is not None] or [Decimal(1)]
    scale_max = max(values) or Decimal(1)
    has_negative = any(v < 0 for _, now, before in bars for v in (now, before) if v is not None)
    has_positive = any(v > 0 for _, now, before in bars for v in (now, before) if v is not None)
    plot = WIDTH - LABEL - 2 * PAD
    zero = LABEL + PAD + (plot / 2 if has_negative and has_positive else (plot if has_negative else 0))
    span = plot / 2 if has_negative and has_positive else plot
    per_row = ROW * (2 if previous else 1) + 6
    height = len(bars) * per_row + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" class="chart">']  # fmt: skip
    for n, (label, now, before) in enumerate(bars):
        top = n * per_row + 4
        parts.append(
            f'<text x="{LABEL}" y="{top + ROW - 7}" text-anchor="end" font-size="9" font-family="DejaVu Sans" fill="#333">{escape(label)}</text>'
        )
        series = [(now, CURRENT)] + ([(before, PREVIOUS)] if previous and before is not None else [])
        for k, (value, colour) in enumerate(series):
            length = float(abs(value) / scale_max) * span
            x = zero - length if value < 0 else zero
            y = top + k * ROW
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{max(length, 0.5):.1f}" height="{ROW - 6}" fill="{colour}"/>'
            )
            text = f"{value:,}"  # as the table prints it: a Decimal keeps its places (19,751.61, not 19,752)
            room = len(text) * CHAR + 3  # the label's width, so it stays inside the chart
            anchor, tx = ("end", x - 3) if value < 0 else ("start", x + length + 3)
            if (value < 0 and tx - room < LABEL) or (value >= 0 and tx + room > WIDTH):
                inside = "#fff" if colour == CURRENT else "#222"
                anchor, tx, colour_text = ("start", x + 3, inside) if value < 0 else ("end", x + length - 3, inside)
            else:
                colour_text = "#222"
            parts.append(f'<text x="{tx:.1f}" y="{y + ROW - 10}" text-anchor="{anchor}" font-size="8" font-family="DejaVu Sans" '
                         f'fill="{colour_text}">{text}</text>')  # fmt: skip
    parts.append(f'<line x1="{zero:.1f}" y1="0" x2="{zero:.1f}" y2="{height - 26}" stroke="#555"/>')
    legend_y = height - 8
    parts.append(f'<rect x="{LABEL + PAD}" y="{legend_y - 9}" width="10" height="10" fill="{CURRENT}"/>'
                 f'<text x="{LABEL + PAD + 14}" y="{legend_y}" font-size="9" font-family="DejaVu Sans" fill="#333">{escape(current)}</text>')  # fmt: skip
    if previous:
        parts.append(f'<rect x="{LABEL + PAD + 170}" y="{legend_y - 9}" width="10" height="10" fill="{PREVIOUS}"/>'
                     f'<text x="{LABEL + PAD + 184}" y="{legend_y}" font-size="9" font-family="DejaVu Sans" fill="#333">{escape(previous)}</text>')  # fmt: skip
    parts.append("</svg>")
    return Markup("".join(parts))
