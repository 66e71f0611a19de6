"""Where checkpoints come from and what the trunk keeps: the local Hugging Face cache, RAM, weight-exactness."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from huggingface_hub import constants

from nightshift.app.cli import main
from nightshift.engine.errors import MemoryFitError, ModelFormatError, UnsupportedModelError
from nightshift.engine.io.drives import Drive
from nightshift.engine.store.importer import ImportOptions, import_checkpoint, plan_import
from nightshift.engine.store.manifest import read_manifest
from nightshift.engine.store.source import resolve_source
from tests.helpers.stores import tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("src"), "qwen3_moe")


def hub_cache(root: Path, repo: str, source: Path) -> Path:
    """`source` laid out as huggingface_hub caches a download: blobs by hash, a snapshot of links, refs/main."""
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    commit = hashlib.sha1(repo.encode()).hexdigest()
    snapshot = repo_dir / "snapshots" / commit
    (repo_dir / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in source.iterdir():
        data = file.read_bytes()
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    return snapshot


def test_a_repo_id_in_the_local_hub_cache_imports_in_place(home, checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = hub_cache(tmp_path / "hub", "acme/tiny-moe", checkpoint)
    assert main(["model", "import", "acme/tiny-moe", "--name", "fromhub"]) == 0
    assert f"importing {snapshot}" in capsys.readouterr().err
    assert read_manifest(home / "models" / "fromhub").source["path"] == str(snapshot.resolve())
    assert all(p.is_symlink() for p in snapshot.iterdir())  # read where it lies, never copied or changed


def test_a_repo_id_not_in_the_cache_is_refused_without_going_online(home, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["model", "import", "acme/not-downloaded", "--name", "x"]) == 1
    err = capsys.readouterr().err
    assert "no copy of the repo 'acme/not-downloaded' in the local Hugging Face cache" in err
    assert not (home / "models" / "x").exists()


def test_a_file_or_a_missing_directory_is_named(home, checkpoint, capsys):
    assert main(["model", "import", str(checkpoint / "config.json"), "--name", "x"]) == 1
    assert "is a file; give the checkpoint's directory" in capsys.readouterr().err
    with pytest.raises(ModelFormatError, match="no such directory"):
        resolve_source("./nowhere/at/all")


def test_a_trunk_that_does_not_fit_in_ram_is_refused_unless_quantizing_is_asked_for(checkpoint):
    plan = plan_import(checkpoint, ImportOptions())
    with pytest.raises(MemoryFitError, match=r"--trunk-bits 8.*not weight-exact"):
        plan_import(checkpoint, ImportOptions(), available_ram=plan.trunk_bytes)
    quantized = plan_import(checkpoint, ImportOptions(trunk_bits=8), available_ram=plan.trunk_bytes)
    assert quantized.trunk_quantized and not quantized.weight_exact
    assert plan.weight_exact and not plan.trunk_quantized


def test_the_manifest_says_whether_the_store_is_weight_exact(checkpoint, tmp_path):
    exact = import_checkpoint(checkpoint, tmp_path / "exact", [Drive("d", tmp_path / "d1")])
    int8 = import_checkpoint(checkpoint, tmp_path / "int8", [Drive("d", tmp_path / "d2")], ImportOptions(trunk_bits=8))
    assert exact.source["weight_exact"] is True and exact.trunk["bits"] == "as released"
    assert int8.source["weight_exact"] is False and int8.trunk["bits"] == 8
    error = int8.trunk["error"]
    assert 0 < error["mean"] <= error["worst"] < 0.05 and error["worst_module"] in int8.trunk["quantized"]
    assert exact.trunk["error"] == {}


def test_a_config_the_family_cannot_use_is_named(checkpoint, tmp_path):
    src = Path(shutil.copytree(checkpoint, tmp_path / "src"))
    config = json.loads((src / "config.json").read_text())
    del config["hidden_size"]
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=r"config\.json: this qwen3_moe config is not usable.*hidden_size"):
        plan_import(src, ImportOptions())
