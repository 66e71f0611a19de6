"""Shared fixtures: an isolated data dir per test, and the real default model (prepared once, in the tests' own
data dir: never in the user's)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import apscheduler.schedulers.base
import pytest

from nightshift.app import default_model
from nightshift.app.daemon import clock
from nightshift.app.default_model import (
    DEFAULT_MODEL,
    default_gguf_path,
    prepare_default_model,
    prepare_sparse_default_model,
    require_default_model,
)
from nightshift.app.paths import cache_dir, data_dir
from nightshift.app.review.runner import run_checks_for
from nightshift.app.review.schedule import BUNDLED_DIR, load_schedule, load_schedules
from nightshift.engine.errors import NightshiftError
from nightshift.engine.moe.tuning import TUNING_FILE
from nightshift.engine.moe.warm import PROFILE_FILE
from nightshift.engine.rig.drives import STATE_FILE, RigState, rig_down
from nightshift.engine.store.gguf_import import convert_gguf
from nightshift.engine.store.manifest import read_manifest, write_manifest
from tests.helpers.clock import ZONE, Clock
from tests.helpers.gguf_files import write_tiny_llama
from tests.helpers.rig import RigPlace, leftovers
from tests.helpers.shared import built_once, locked
from tests.helpers.stores import PROMPT, QUICK, import_tiny, tiny_checkpoint, tiny_store_in, tokens_and_stats
from tests.helpers.waits import wait_for

# The user's real data dir, read before any test points NIGHTSHIFT_HOME elsewhere; tests only read from it.
REAL_DATA_DIR = data_dir()
# The tests' own data dir for the real default model, kept across runs so it is prepared once.
MODEL_HOME = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nightshift-tests"


@contextmanager
def data_dir_at(home: Path) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NIGHTSHIFT_HOME", str(home))
        yield


def seed_downloads(real: Path, home: Path) -> None:
    """Give `home`'s cache the default model's wheel and GGUF that `real` has already downloaded, so a test
    run after `nightshift model default` downloads nothing. Hard links where they can be (a copy across file
    systems): preparing a model only ever replaces these files, never writes into them."""
    with data_dir_at(real):
        downloads = [default_gguf_path(), *cache_dir().glob(DEFAULT_MODEL.wheel_glob)]
    (home / "cache").mkdir(parents=True, exist_ok=True)
    for source in downloads:
        target = home / "cache" / source.name
        if source.is_file() and not target.exists():
            try:
                os.link(source, target)
            except OSError:
                partial = target.with_name(target.name + ".partial")
                shutil.copyfile(source, partial)
                partial.replace(target)


def seed_models(real: Path, home: Path) -> None:
    """Copy the default model `nightshift model default` prepared in `real`, dense and sparse, into `home`
    when `home` has neither, so the first test run does not convert and MoEfy it again (~50 s): the same
    files a first preparation there would write. The store's drive moves with the copy; the user's own
    routing profile and tuning record stay behind. A model not prepared in `real` is prepared as before."""
    with data_dir_at(real):
        dense, sparse = default_model.default_model_dir(), default_model.sparse_default_model_dir()
        try:
            if require_default_model() != sparse:  # only the dense model there
                return
        except NightshiftError:
            return
    with data_dir_at(home):
        dense_to, sparse_to = default_model.default_model_dir(), default_model.sparse_default_model_dir()
    manifest = read_manifest(sparse)
    if dense_to.exists() or sparse_to.exists() or manifest.drives != {"store": str(sparse / "experts")}:
        return
    for source, target in ((dense, dense_to), (sparse, sparse_to)):
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(source, partial, ignore=shutil.ignore_patterns(PROFILE_FILE, TUNING_FILE))
        if source == sparse:
            manifest.drives = {"store": str(sparse_to / "experts")}
            write_manifest(partial, manifest)
        partial.rename(target)


@contextmanager
def preparing_at(home: Path) -> Iterator[None]:
    """NIGHTSHIFT_HOME at `home`, holding its lock so two test runs do not prepare a model there at once."""
    with locked(home), data_dir_at(home):
        yield


@pytest.fixture(scope="session")
def model_home() -> Path:
    """MODEL_HOME, its cache and models seeded from what the real data dir has prepared."""
    with preparing_at(MODEL_HOME):
        seed_downloads(REAL_DATA_DIR, MODEL_HOME)
        seed_models(REAL_DATA_DIR, MODEL_HOME)
    return MODEL_HOME


@pytest.fixture(scope="session")
def default_model_dir(model_home) -> Path:
    """The real default model in the tests' data dir; prepared (downloaded, if it was not seeded) if missing."""
    with preparing_at(model_home):
        try:
            return prepare_default_model(say=lambda message: None)
        except NightshiftError as exc:
            pytest.skip(f"the default model cannot be prepared here: {exc}")


@pytest.fixture(scope="session")
def default_gguf(model_home, default_model_dir) -> Path:
    """The GGUF the default model was converted from (kept in the tests' data dir's cache)."""
    with data_dir_at(model_home):
        return default_gguf_path()


@pytest.fixture(scope="session")
def sparse_store(model_home, default_model_dir) -> tuple[Path, Path]:
    """The sparse default model (a store) and the tests' data dir, as `nightshift model default` leaves them.

    Built there (a few minutes) on the first run only, like `default_model_dir`.
    """
    with preparing_at(model_home):
        return prepare_sparse_default_model(say=lambda message: None), model_home


@pytest.fixture(scope="session", autouse=True)
def data_dir_outside_the_users(tmp_path_factory) -> Iterator[None]:
    """NIGHTSHIFT_HOME for the whole run: a test that does not ask for `home` still writes nothing in the
    user's data dir."""
    with data_dir_at(tmp_path_factory.mktemp("data-dir")):
        yield


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """NIGHTSHIFT_HOME pointed at an empty directory for this test."""
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def widened_tiny_model(folder: Path) -> None:
    """`folder`/model: the tiny llama, its context widened so a review's prompt fits."""
    model = convert_gguf(write_tiny_llama(folder / "tiny.gguf"), folder / "model")
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 8192
    (model / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random llama model (real, just small), built once per session (tests only read it)."""
    return built_once(tmp_path_factory, "tiny-model", widened_tiny_model) / "model"


@pytest.fixture
def rig_place(tmp_path):
    """Where a test builds its rig; afterwards the rig is taken down even if the test failed,
    and the test fails if any loop device, mount or cgroup of it is left."""
    place = RigPlace(tmp_path)
    assert leftovers(*place.markers) == {"loop devices": [], "mounts": [], "cgroups": []}
    try:
        yield place
    finally:
        if (place.rig_dir / STATE_FILE).exists():
            state = RigState.load(place.rig_dir)
            if state.cgroup and Path(state.cgroup).exists():
                for pid in state.throttle().pids():
                    os.kill(pid, signal.SIGKILL)  # only this test's processes are in its cgroup
                wait_for(lambda: not state.throttle().pids(), 30, "the killed processes to leave the cgroup", 0.05)
            rig_down(place.rig_dir)
        assert leftovers(*place.markers) == {"loop devices": [], "mounts": [], "cgroups": []}


# The suite runs on pytest-xdist workers (pyproject.toml's addopts). The README's first command on the default model
# takes minutes, most of them on one core: its test goes first, so one worker runs it while the others start on the
# rest. Rig tests (loop devices, mounts, cgroup read throttles) share the machine's drives and block I/O: they run
# one at a time, in one group on one worker (`--dist loadgroup`).
README_TEST = "test_readme_first_command_on_the_default_model"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.name != README_TEST)  # stable: everything else keeps its order
    for item in items:
        if item.get_closest_marker("rig"):
            item.add_marker(pytest.mark.xdist_group("rig"))


@pytest.fixture(scope="session")
def sources(tmp_path_factory) -> dict[str, Path]:
    """Tiny synthetic checkpoints of the quick families, built once per session (tests only read them)."""
    root = built_once(tmp_path_factory, "checkpoints", lambda folder: [tiny_checkpoint(folder, a) for a in QUICK])
    return {arch: root / f"{arch}-src" for arch in QUICK}


@pytest.fixture(scope="session")
def stores(tmp_path_factory, sources) -> dict[str, Path]:
    """Stores the tests only read from, imported once per session; a test that damages files imports its own."""
    root = built_once(
        tmp_path_factory, "stores", lambda folder: [import_tiny(folder, sources[a], f"{a}-store") for a in QUICK]
    )
    return {arch: root / f"{arch}-store" for arch in QUICK}


@pytest.fixture(scope="session")
def in_ram(stores) -> dict[str, list[int]]:
    """Each quick family's tokens from its store held in RAM: what the streamed runs must reproduce."""
    return {arch: tokens_and_stats(stores[arch], len(PROMPT), None)[0] for arch in QUICK}


@pytest.fixture(scope="session")
def mixtral_store(tmp_path_factory) -> Path:
    """A tiny synthetic mixtral store on two drives (the read-ahead tests', which read it without a cache)."""
    return built_once(tmp_path_factory, "mixtral", lambda folder: tiny_store_in(folder, "mixtral")) / "store"


@pytest.fixture(scope="session")
def tiny_dense(tmp_path_factory) -> Path:
    """A tiny dense llama model directory (Q4_1 linears, like the default model), built once per session."""
    root = built_once(
        tmp_path_factory,
        "tiny-dense",
        lambda folder: convert_gguf(write_tiny_llama(folder / "tiny.gguf"), folder / "dense"),
    )
    return root / "dense"


@pytest.fixture(scope="module")
def month_end() -> tuple:
    schedule = load_schedule(BUNDLED_DIR / "month-end.toml")
    return schedule, run_checks_for(schedule, schedule.as_of)


@pytest.fixture
def bundled(home):
    """The bundled schedules, loaded in the test's data dir."""
    schedules, errors = load_schedules()
    assert not errors
    return schedules


@pytest.fixture
def wall(monkeypatch):
    wall = Clock(datetime(2026, 10, 28, 12, 0, tzinfo=UTC))

    class FrozenDatetime(datetime):
        @classmethod
        def now(cls, tz=None):
            return wall.time.astimezone(tz) if tz else wall.time.replace(tzinfo=None)

    monkeypatch.setattr(apscheduler.schedulers.base, "datetime", FrozenDatetime)
    monkeypatch.setattr(clock, "now", lambda: wall.time)
    return wall


@pytest.fixture
def user_zone(monkeypatch):
    monkeypatch.setenv("TZ", ZONE)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
