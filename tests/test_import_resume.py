"""An import killed outright (SIGKILL, no clean-up) leaves no complete-looking store, and resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from nightshift.app.cli import main
from nightshift.engine.errors import ModelFormatError
from nightshift.engine.runtime import open_model
from nightshift.engine.store.manifest import read_manifest
from nightshift.engine.store.synth import synthesize
from nightshift.engine.store.upkeep import verify_store
from tests.helpers.waits import wait_for


@pytest.mark.slow
def test_killed_import_resumes_from_the_layers_already_done(home, tmp_path, capsys):
    src = synthesize("kimi_k3", "small", tmp_path / "src", layers=6)
    store = home / "models" / "killed"
    command = [sys.executable, "-m", "nightshift.app.cli", "model", "import", str(src), "--name", "killed"]
    env = {**os.environ, "NIGHTSHIFT_HOME": str(home)}
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        done = store / ".import" / "layer-0002.done.json"
        wait_for(lambda: done.exists() or child.poll() is not None, 120, "the import's third layer", 0.02)
        assert child.poll() is None, "the import ended before it could be interrupted"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    assert not (store / "manifest.json").exists()
    with pytest.raises(ModelFormatError, match="did not finish"):
        open_model(store)
    assert main(["model", "list"]) == 0
    assert "killed\timport unfinished" in capsys.readouterr().out

    assert main(["model", "import", str(src), "--name", "killed"]) == 0
    assert "(resuming)" in capsys.readouterr().err
    assert len(read_manifest(store).layers) == 5
    assert not verify_store(store)
    assert not list(store.rglob("*.partial"))
