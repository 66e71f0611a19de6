"""What several processes of a test run share: a lock on a folder, and test data built once per test session
however many pytest-xdist workers ask for it (pytest-xdist's "making session-scoped fixtures execute only once":
the first worker builds it under a lock, in a folder beside the workers' own temporary folders; the others wait
for the lock and use what it built)."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

BUILT = ".built"  # written last in a folder `built_once` filled: a folder without it was left half-built


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on `folder` (created if missing) while the block runs: another process (an xdist
    worker, another test run) taking it waits. The lock goes with the process, so a killed holder frees it."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # and the lock with it


def session_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder this test session's processes share: on xdist workers the parent of their own base temporary
    folders (one new folder per session, pruned by pytest like its temporary folders); in one process its base
    temporary folder. New each session, so nothing an earlier session or older code built is reused."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """The session's folder `name`, filled by `build(folder)` the first time any process of the session asks.

    `build` writes in place (a store's manifest names its drives' paths, so nothing is built elsewhere and moved);
    one that failed part way leaves no mark of completion, and the next asker empties the folder and builds again.
    What is built is shared by every test of the session: tests only read it, and one that changes files copies
    them first."""
    folder = session_folder(tmp_path_factory) / "built" / name
    with locked(folder):
        if not (folder / BUILT).exists():
            for stale in folder.iterdir():
                if stale.is_dir() and not stale.is_symlink():
                    shutil.rmtree(stale)
                else:
                    stale.unlink()
            build(folder)
            (folder / BUILT).touch()
    return folder
