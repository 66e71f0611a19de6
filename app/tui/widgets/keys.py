"""The key bar at the bottom of every screen: this screen's keys, the screen keys, then help and quit.

Textual's Footer cuts keys off the right end when the line is short, so help and quit were the
first to go at 80 columns. This bar fits the line by shortening instead: long labels, short ones,
1-4 grouped, and `? help` and `q quit` are always there. Each key is a link, so clicks work too.
Only keys that do something now are offered: a key whose action the screen or app turns off
(`check_action`, e.g. `s` while a scheduler runs) is left out, and pressing it does nothing.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.content import Content
from textual.dom import DOMNode
from textual.widget import Widget

SCREEN_KEYS = ("1", "2", "3", "4")
LAST = ("s", "question_mark", "q")  # on every screen, in this order, at the end


def short(binding: Binding) -> str:
    """A binding's one-word label: its description's first word, lower case."""
    return binding.description.split()[0].split("/")[0].lower() if binding.description else binding.key


def hints(own: list[Binding], app: list[Binding], width: int) -> list[tuple[Binding, str]]:
    """The (binding, label) pairs to show in `width` columns: the first rendering that fits.

    Help and quit are kept in every rendering; at the narrowest the screen keys become `1-4`.
    """
    screens = [b for b in app if b.key in SCREEN_KEYS]
    last = sorted((b for b in app if b.key in LAST), key=lambda b: LAST.index(b.key))
    shown = [b for b in own if b.show]
    renderings = [
        [(b, b.description) for b in [*shown, *screens, *last]],
        [(b, short(b)) for b in [*shown, *screens, *last]],
        [(b, short(b)) for b in shown] + [(screens[0], "1-4 screens")] + [(b, short(b)) for b in last],
        [(b, short(b)) for b in shown] + [(screens[0], "1-4")] + [(b, short(b)) for b in last if b.key != "s"],
    ]
    for pairs in renderings:
        if sum(len(b.key_display or b.key) + len(label) + 3 for b, label in pairs) - 2 <= width:
            return pairs
    return renderings[-1]


def acting(node: DOMNode, bindings: list[Binding]) -> list[Binding]:
    """The bindings whose action `node` has not turned off (its `check_action`)."""
    return [b for b in bindings if node.check_action(b.action.split("(")[0], ()) is not False]


class KeyBar(Widget):
    """One line of key hints for the screen it is on (its bindings, then the app's) that act now."""

    DEFAULT_CSS = "KeyBar { height: 1; dock: bottom; background: $panel; }"

    def __init__(self) -> None:
        super().__init__()
        self.offered: tuple[str, ...] = ()

    def update_keys(self) -> None:
        """Redraw when the set of keys that act has changed (called with each refresh of the screen)."""
        offered = tuple(b.key for b in self._acting())
        if offered != self.offered:
            self.offered = offered
            self.refresh()

    def _acting(self) -> list[Binding]:
        return acting(self.screen, list(self.screen.BINDINGS)) + acting(self.app, list(self.app.BINDINGS))

    def render(self) -> Content:
        app_bindings = list(self.app.BINDINGS)
        own = [b for b in self._acting() if b not in app_bindings]
        parts = []
        for binding, label in hints(own, [b for b in self._acting() if b in app_bindings], self.size.width):
            key = binding.key_display or binding.key
            action = binding.action if binding in app_bindings else f"screen.{binding.action}"
            if binding.key in SCREEN_KEYS and label.startswith("1-4"):
                parts.append(Content.from_markup(f"[b $accent]1-4[/] {label[4:]}".rstrip()))
            else:
                parts.append(Content.from_markup(f"[@click={action!r}][b $accent]$key[/] $label[/]",
                                                 key=key, label=label))  # fmt: skip
        return Content("  ").join(parts)
