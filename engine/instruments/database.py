"""One owner of each SQLite file per process: a connection kept while the process uses the file, never a
descriptor of the file opened beside it.

SQLite's locks between processes are POSIX advisory locks, and POSIX drops every lock a process holds on a
file as soon as the process closes *any* descriptor of that file. A process that opens and closes a database
file itself (to set its mode, say) while its own connections are open silently loses their locks; another
process then takes itself for the last connection and deletes the -wal and -shm files under them, and the
database is damaged ("database disk image is malformed", "disk I/O error"). So nightshift opens its SQLite
files only here: `open_database(path)` is the process's one connection to a file, shared by its threads under a
lock and closed when no one in the process holds it any more. A file that does not exist yet is created
owner-only first: nothing can hold a lock on a file that did not exist, and its -wal and -shm files take
its mode.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

Setup = Callable[[sqlite3.Connection], None]


class Database:
    """A SQLite file's one connection in this process (autocommit: reads see every commit at once)."""

    def __init__(self, path: Path, timeout: float):
        self.path = path
        self.lock = threading.RLock()
        self.connection = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
        self.connection.row_factory = sqlite3.Row

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """The connection, for statements that only read (each is its own snapshot)."""
        with self.lock:
            yield self.connection

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: everything in it is stored, or nothing (also when the process dies).

        Whatever fails, the connection is left outside any transaction, ready for the next one.
        """
        with self.lock:
            self.connection.execute("BEGIN IMMEDIATE")
            try:
                yield self.connection
                self.connection.execute("COMMIT")
            except BaseException:
                if self.connection.in_transaction:  # SQLite may have rolled back already (disk full, I/O error)
                    with suppress(sqlite3.Error):
                        self.connection.execute("ROLLBACK")
                raise

    def damage(self) -> str | None:
        """What `PRAGMA quick_check` finds wrong with the file; None when it is sound."""
        with self.read() as db:
            found = [row[0] for row in db.execute("PRAGMA quick_check").fetchall()]
        return None if found == ["ok"] else "; ".join(found)

    def close(self) -> None:
        """Close the connection now (the process's next `open_database` call for the file opens a new one)."""
        with _owners_lock:
            _owners.pop(_key(self.path), None)
        with self.lock:
            self.connection.close()


_owners: weakref.WeakValueDictionary[tuple[int, str], Database] = weakref.WeakValueDictionary()
_owners_lock = threading.Lock()


def _key(path: Path) -> tuple[int, str]:
    """Per process (a forked child never shares its parent's connection) and per file, however it is named."""
    return os.getpid(), os.path.realpath(path)


def open_database(path: Path, setup: Setup | None = None, timeout: float = 30.0) -> Database:
    """This process's connection to the SQLite file at `path`, opened (the file created 0600 if missing, then
    `setup` run on it) the first time it is asked for. `timeout`: how long a statement waits for another
    process's write. sqlite3.Error or OSError when the file cannot be opened or set up."""
    with _owners_lock:
        owner = _owners.get(_key(path))
        if owner is None:
            create_database_file(path)
            owner = Database(path, timeout)
            try:
                if setup is not None:
                    setup(owner.connection)
            except BaseException:
                owner.connection.close()
                raise
            _owners[_key(path)] = owner
        return owner


def create_database_file(path: Path) -> Path:
    """Create `path` empty and owner-only if it does not exist (an empty file is an empty SQLite database), before
    any connection to it: for a file another library connects to (APScheduler's job store). Returns `path`."""
    with suppress(FileExistsError):  # made already (by another process, or ours): then never opened here
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return path


def database_damaged(error: BaseException) -> bool:
    """Whether `error` is SQLite saying the file is damaged or not a database at all (not full, locked, ...)."""
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def set_aside_database(path: Path, suffix: str) -> Path:
    """Move a (damaged) database and its -wal and -shm files to `path` + `suffix`, kept together so SQLite still
    reads them as one; this process must hold no connection to it. Returns the new path."""
    kept = path.with_name(path.name + suffix)
    for ending in ("-wal", "-shm", ""):  # the main file last: a reader never sees it without its log
        with suppress(FileNotFoundError):
            os.rename(f"{path}{ending}", f"{kept}{ending}")
    return kept
