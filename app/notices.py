"""Notices a user needs once, not on every command: "not tuned for these drives" once per store, say.

Which were said is kept in the data dir (`notices.json`), so the next command, or the next day, stays quiet.
A file that cannot be read or written only means a notice may be said again.
"""

from __future__ import annotations

import json
import os

from nightshift.app.paths import notices_file, private_file


def first_time(notice: str, subject: str) -> bool:
    """True the first time `notice` is asked about for `subject` (a store's path), and records that it was."""
    path = notices_file()
    try:
        said = json.loads(path.read_text())
    except (OSError, ValueError):
        said = {}
    if not isinstance(said, dict) or not isinstance(said.get(notice, []), list):
        said = {}  # not what this module writes: started afresh
    subjects = said.setdefault(notice, [])
    if subject in subjects:
        return False
    subjects.append(subject)
    try:
        temporary = private_file(path.with_suffix(".part"))
        temporary.write_text(json.dumps(said, indent=1))
        os.replace(temporary, path)
    except OSError:
        pass  # said again next time: better than not at all
    return True
