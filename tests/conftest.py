"""Shared fixtures: an isolated data dir per test, and the real default model (prepared once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.default_model import default_gguf_path, prepare_default_model, prepare_sparse_default_model
from app.paths import data_dir
from engine import NightshiftError

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
