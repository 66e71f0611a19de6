"""Every path nightshift uses, in one place: the user's data dir and what ships inside the package.

`NIGHTSHIFT_HOME` overrides the data dir; otherwise the platform's convention (XDG on Linux, Application Support
on macOS), decided in engine/home.py since the engine keeps a store's routing profile there. Bundled folders
(templates, schedules) are found through the import system, so a wheel in site-packages works like the checkout.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import stat
from pathlib import Path

from nightshift.engine.errors import NightshiftError
from nightshift.engine.home import data_dir

log = logging.getLogger("nightshift.paths")
_warned: set[Path] = set()
SET_HOME = "set NIGHTSHIFT_HOME to a folder of yours"


class DataDirError(NightshiftError):
    """The data dir cannot be made, or written where a command has to write; the message says what to do."""


def ensure_data_dir() -> Path:
    """The data dir, created owner-only (0700) if missing; one the user already had keeps its mode.

    Reviews hold the user's numbers, so a data dir that others can read is warned about (once per
    process), never changed: it may be a shared folder on purpose.
    """
    home = data_dir()
    try:
        home.mkdir(mode=0o700, parents=True)
        home.chmod(0o700)  # whatever the umask
    except FileExistsError:
        if not home.is_dir():
            raise DataDirError(
                f"the data dir {home} is a file, not a folder; move the file away or {SET_HOME}"
            ) from None
        mode = stat.S_IMODE(home.stat().st_mode)
        if mode & 0o077 and home not in _warned:
            _warned.add(home)
            log.warning(
                "the data dir %s is mode %04o: other users may read or enter it; nightshift leaves it so "
                "(chmod 700 %s to keep reviews private); its own files are created owner-only",
                home, mode, home,
            )  # fmt: skip
    except OSError as exc:
        raise DataDirError(f"cannot make the data dir {home}: {_why(home, exc)}; {SET_HOME}") from None
    return home


def _why(home: Path, error: OSError) -> str:
    """What keeps `home` from being made: a part of its path that is a file, else the system's reason."""
    if isinstance(error, NotADirectoryError):
        blocking = next((part for part in home.parents if part.is_file()), None)
        if blocking is not None:
            return f"{blocking} is a file, not a folder"
    return error.strerror or str(error)


def writable_data_dir() -> Path:
    """The data dir, made if missing and checked writable: for the commands that write there (serve, review run),
    so a data dir they cannot use is one line that says why, before they start."""
    home = ensure_data_dir()
    if os.access(home, os.W_OK | os.X_OK):
        return home
    if os.statvfs(home).f_flag & os.ST_RDONLY:
        raise DataDirError(f"the data dir {home} is on a read-only file system; mount it read-write or {SET_HOME}")
    raise DataDirError(f"the data dir {home} is not writable by you; make it yours (chmod u+rwx) or {SET_HOME}")


def private_folder(path: Path) -> Path:
    """The folders of `path` created owner-only (0700) where missing, the data dir as `ensure_data_dir` makes it;
    returns `path`."""
    if path.is_relative_to(data_dir()):
        ensure_data_dir()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def private_file(path: Path) -> Path:
    """`path` created empty and owner-only (0600) if it does not exist, its folders 0700; returns it.

    Called before a file in the data dir is first opened, whichever command gets there first. Never for a
    SQLite file: opening and closing one beside SQLite's connections drops their locks (engine `open_database`).
    """
    try:
        os.close(os.open(private_folder(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    except OSError as exc:
        if path.is_dir():
            raise DataDirError(f"{path} is a folder where nightshift keeps a file; move the folder away") from None
        raise DataDirError(f"cannot create {path}: {exc.strerror}; check that its folder is yours, writable and has "
                           "free space") from None  # fmt: skip
    return path


def bundled(folder: str) -> Path:
    """A folder shipped inside the package (`templates`, `schedules`), wherever nightshift is installed.

    They are namespace packages (data, no `__init__.py`), so their spec names the folder itself.
    """
    spec = importlib.util.find_spec(f"nightshift.{folder}")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"nightshift.{folder} is not installed with this copy of nightshift; reinstall it")
    return Path(next(iter(spec.submodule_search_locations)))


def doc(name: str) -> Path:
    """One of the docs (`reviews.md`), where this copy of nightshift has them: shipped in the package, so
    that a message citing one points at a file that is there, from a checkout or an installed wheel (an
    editable install made before the docs were a package finds them beside app/)."""
    try:
        return bundled("docs") / name
    except FileNotFoundError:
        return Path(__file__).resolve().parent.parent / "docs" / name


def models_dir() -> Path:
    return data_dir() / "models"


def cache_dir() -> Path:
    """Downloads kept so a model can be rebuilt offline."""
    return data_dir() / "cache"


def drives_file() -> Path:
    """The drives expert files are placed on (`nightshift rig up` writes one)."""
    return data_dir() / "drives.toml"


def rig_dir() -> Path:
    """Where `nightshift rig` keeps its images, mounts and state ("nightshift" in the path on purpose)."""
    return data_dir() / "nightshift-rig"


def user_schedules_dir() -> Path:
    """The user's own schedule files; one with a bundled schedule's name replaces it."""
    return data_dir() / "schedules"


def reports_index() -> Path:
    return data_dir() / "reports" / "index.json"


def run_queue() -> Path:
    """The review run queue (SQLite); not the benchmark catalogue."""
    return data_dir() / "runs.sqlite"


def catalogue_file() -> Path:
    """The benchmark run catalogue (SQLite)."""
    return data_dir() / "bench_runs.sqlite"


def service_settings() -> Path:
    """The service's own settings (`[service]`: how runs due together are batched); optional."""
    return data_dir() / "service.toml"


def notices_file() -> Path:
    """Notices said once (per store, ...) and not again: which were said."""
    return data_dir() / "notices.json"


def control_socket() -> Path:
    return data_dir() / "nightshift.sock"


def service_log() -> Path:
    return data_dir() / "nightshift.log"


def service_lock() -> Path:
    """Held while `nightshift serve` runs."""
    return data_dir() / "serve.lock"


def engine_lock_file() -> Path:
    """Held while a review generates, across processes."""
    return data_dir() / "engine.lock"


def verify_record(store_name: str) -> Path:
    """The greedy tokens of record `nightshift verify` compares a store against."""
    return data_dir() / "verify" / f"{store_name}.json"
