"""Shared fixtures: an isolated data dir per test, and the real default model (prepared once)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from nightshift.app.default_model import default_gguf_path, prepare_default_model, prepare_sparse_default_model
from nightshift.app.paths import data_dir
from nightshift.engine import NightshiftError, convert_gguf
from nightshift.engine.bench.rig import STATE_FILE, RigState, rig_down
from tests.gguf_files import write_tiny_llama
from tests.rig_helpers import RigPlace, leftovers

# The user's real data dir, read before any test points NIGHTSHIFT_HOME elsewhere.
REAL_DATA_DIR = data_dir()


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The real default model in the user's data dir; prepared (downloaded once) if missing."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NIGHTSHIFT_HOME", str(REAL_DATA_DIR))
        try:
            return prepare_default_model(say=lambda message: None)
        except NightshiftError as exc:
            pytest.skip(f"the default model cannot be prepared here: {exc}")


@pytest.fixture(scope="session")
def default_gguf(default_model_dir) -> Path:
    """The GGUF the default model was converted from (kept in the real data dir's cache)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NIGHTSHIFT_HOME", str(REAL_DATA_DIR))
        return default_gguf_path()


@pytest.fixture(scope="session")
def sparse_store(default_model_dir) -> tuple[Path, Path]:
    """The sparse default model (a store) and the real data dir, as `nightshift model default` leaves them.

    Built here (a few minutes) only if that command has not run yet, like `default_model_dir`.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NIGHTSHIFT_HOME", str(REAL_DATA_DIR))
        return prepare_sparse_default_model(say=lambda message: None), REAL_DATA_DIR


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """NIGHTSHIFT_HOME pointed at an empty directory for this test."""
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random llama model (real, just small); its context widened so a review's prompt fits."""
    folder = tmp_path_factory.mktemp("tiny")
    model = convert_gguf(write_tiny_llama(folder / "tiny.gguf"), folder / "model")
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 8192
    (model / "config.json").write_text(json.dumps(config))
    return model


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
                deadline = time.monotonic() + 5
                while state.throttle().pids() and time.monotonic() < deadline:
                    time.sleep(0.05)
            rig_down(place.rig_dir)
        assert leftovers(*place.markers) == {"loop devices": [], "mounts": [], "cgroups": []}
