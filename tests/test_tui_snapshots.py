"""Snapshot tests: every dashboard screen at 60x20, 80x24 and 160x50 in every state of a run's life.

The states are frozen snapshots (what the feed would collect): idle with nothing done yet, a
run reading its prompt, writing, cancelling, just finished, failed, and no service. Each state's
four screens at the three sizes are rendered as plain text into one file per state
(tests/__snapshots__/test_tui_snapshots/<state>.txt), compared line by line; after an intended
layout change: `pytest tests/test_tui_snapshots.py --snapshot-update`, then read the files.
Every rendering must show the keys for help and quit.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.helpers.clock import ZONE
from tests.helpers.dashboard import STATES, frozen_app, settled
from tests.helpers.shared import locked

SNAPSHOTS = Path(__file__).parent / "__snapshots__" / "test_tui_snapshots"
SIZES = [(60, 20), (80, 24), (160, 50)]
SCREENS = {"live": "1", "queue": "2", "reports": "3", "runs": "4"}


async def render_state(state: str, size: tuple[int, int]) -> dict[str, str]:
    """Every screen of `state` at `size`, headed `=== screen WxH ===`."""
    app = frozen_app(state)
    shown = {}
    async with app.run_test(size=size) as pilot:
        for screen, key in SCREENS.items():
            await pilot.press(key)
            shown[f"=== {screen} {size[0]}x{size[1]} ==="] = await settled(pilot)
    return shown


def sections(path: Path) -> dict[str, str]:
    """A snapshot file's renderings by heading."""
    parts: dict[str, list[str]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith("=== "):
            parts[line] = []
        else:
            parts[next(reversed(parts))].append(line)
    return {heading: "\n".join(lines).rstrip("\n") for heading, lines in parts.items()}


def stored_with(path: Path, shown: dict[str, str]) -> dict[str, str]:
    """`path`'s renderings with `shown` written in. A state's sizes are separate tests, possibly on two xdist
    workers at once: its file is read and rewritten under a lock on its folder, and replaced whole."""
    with locked(path.parent):
        stored = {**sections(path), **shown}
        order = [f"=== {screen} {w}x{h} ===" for w, h in SIZES for screen in SCREENS]
        partial = path.with_name(path.name + ".partial")
        partial.write_text("".join(f"{h}\n{stored[h]}\n\n" for h in sorted(stored, key=order.index)))
        partial.replace(path)
    return stored


def keys_shown(text: str) -> bool:
    """The last line (the key bar) offers help and quit."""
    bar = text.splitlines()[-1]
    return "? help" in bar.lower() and "q quit" in bar.lower()


QUICK = ("writing", (80, 24))  # the one rendering in the quick run; the rest are slow (~3 s each)


@pytest.mark.parametrize(("state", "size"), [
    pytest.param(state, size, id=f"{state}-{size[0]}x{size[1]}", marks=() if (state, size) == QUICK else pytest.mark.slow)
    for state in STATES for size in SIZES
])  # fmt: skip
def test_every_screen_in_every_state_and_size(state, size, user_zone, request):
    shown = asyncio.run(render_state(state, size))
    missing = [heading for heading, text in shown.items() if not keys_shown(text)]
    assert not missing, f"no help or quit key on: {missing}"
    path = SNAPSHOTS / f"{state}.txt"
    stored = sections(path)
    if request.config.getoption("--snapshot-update", default=False) or not all(h in stored for h in shown):
        stored = stored_with(path, shown)
    for heading, text in shown.items():
        assert text.splitlines() == stored[heading].splitlines(), f"{state}: {heading} differs from {path}"


def test_dialogs_show_every_key_and_ask_before_cancelling(user_zone):
    async def drive() -> tuple[str, str]:
        app = frozen_app("writing")
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("2", "question_mark")
            help_text = await settled(pilot)
            await pilot.press("escape", "c")
            return help_text, await settled(pilot)

    help_text, confirm = asyncio.run(drive())
    for key in ("Live", "Queue", "Reports", "Runs", "Run now", "Pause/resume", "Cancel job", "Open PDF",
                "Mark for compare", "Filter", "Open last report", "Help", "Quit"):  # fmt: skip
        assert key in help_text, key
    assert "Cancel run 7 (month-end)?" in confirm and "Yes (y)" in confirm


def test_os_environment_is_left_as_found():
    assert os.environ.get("TZ") != ZONE
