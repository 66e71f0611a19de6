"""drives.toml: what the rig and the planner write reads back; mistakes name the file and entry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nightshift.engine.io.drives import Drive, DrivesFileError, format_drives, load_drives, parse_drives


def test_round_trip_with_awkward_paths(tmp_path):
    drives = [Drive("ssd0", Path('/mnt/with "quotes"/and\\slash')), Drive("ssd1", tmp_path, budget_bytes=int(2.5e9))]
    path = tmp_path / "drives.toml"
    path.write_text(format_drives(drives))
    assert load_drives(path) == drives


@pytest.mark.parametrize(
    "text, message",
    [
        ("[[drive]\n", "not valid TOML"),
        ("", "no [[drive]] entries"),
        ('[[drive]]\nroot = "/x"\n', "drive #1 needs a name"),
        ('[[drive]]\nname = "a"\n', "(a) needs a root"),
        ('[[drive]]\nname = "a"\nroot = "/x"\nbudget_gb = -1\n', "budget_gb must be a positive number"),
        ('[[drive]]\nname = "a"\nroot = "/x"\n[[drive]]\nname = "a"\nroot = "/y"\n', "must be unique"),
    ],
)
def test_mistakes_are_named(text, message):
    with pytest.raises(DrivesFileError, match=re.escape(message)):
        parse_drives(text, "my-drives.toml")


def test_missing_file(tmp_path):
    with pytest.raises(DrivesFileError, match="no drives file"):
        load_drives(tmp_path / "drives.toml")
