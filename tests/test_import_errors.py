"""Bad checkpoints, damaged stores, full drives and interrupted imports: clear errors naming the file."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from nightshift.engine.errors import ModelFormatError, NightshiftError, NoSpaceError
from nightshift.engine.io.drives import Drive
from nightshift.engine.runtime import open_model
from nightshift.engine.store.importer import ImportOptions, import_checkpoint
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import read_manifest
from nightshift.engine.store.safetensors_io import copied_tensor, read_header, write_safetensors
from nightshift.engine.store.upkeep import verify_store
from tests.helpers.stores import import_tiny, tiny_checkpoint


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("src"), "deepseek_v3")


@pytest.fixture
def src(pristine, tmp_path) -> Path:
    """A private copy of the checkpoint each test may damage."""
    return Path(shutil.copytree(pristine, tmp_path / "src"))


def shard(src: Path, number: int) -> Path:
    return sorted(src.glob("model-*.safetensors"))[number]


def rewrite(path: Path, drop: str | None = None, reshape: tuple[str, tuple] | None = None) -> None:
    """Rewrite a shard without the tensor `drop`, or with one tensor's header shape changed."""
    tensors = []
    for entry in read_header(path):
        if entry.name == drop:
            continue
        tensor = copied_tensor(entry)
        if reshape and entry.name == reshape[0]:
            tensor = type(tensor)(entry.name, entry.dtype, reshape[1], tensor.produce)
        tensors.append(tensor)
    write_safetensors(path, tensors)


def test_truncated_safetensors_is_named(src, tmp_path):
    victim = shard(src, 1)
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelFormatError, match=re.escape(str(victim)) + ".*truncated"):
        import_tiny(tmp_path, src, "m")
    assert not (tmp_path / "m").exists()  # nothing written


def test_missing_tensor_is_named_with_its_file(src, tmp_path):
    victim = shard(src, 1)  # layer 1: an MoE layer
    rewrite(victim, drop="model.layers.1.self_attn.o_proj.weight")
    with pytest.raises(ModelFormatError, match=re.escape(str(victim)) + ".*missing.*o_proj"):
        import_tiny(tmp_path, src, "m")


def test_missing_expert_is_named_with_its_file(src, tmp_path):
    victim = shard(src, 2)
    rewrite(victim, drop="model.layers.2.mlp.experts.3.up_proj.weight")
    with pytest.raises(ModelFormatError, match=re.escape(str(victim)) + ".*layer 2.*experts.3.up_proj"):
        import_tiny(tmp_path, src, "m")


def test_wrong_shape_is_named_with_its_file(src, tmp_path):
    victim = shard(src, 0)
    name = "model.layers.0.input_layernorm.weight"
    (entry,) = [e for e in read_header(victim) if e.name == name]
    # Same bytes, other shape: only the header lies.
    rewrite(victim, reshape=(name, (entry.shape[0] // 2, 2)))
    with pytest.raises(ModelFormatError, match=re.escape(str(victim)) + f".*{re.escape(name)} has shape"):
        import_tiny(tmp_path, src, "m")


def test_missing_expert_file_is_named_on_load_and_by_verify(pristine, tmp_path):
    store = import_tiny(tmp_path, pristine, "m", drives=1)
    manifest = read_manifest(store)
    ((_, path),) = manifest.replica_paths(1, 5)
    path.unlink()
    with pytest.raises(ModelFormatError, match=re.escape(str(path))):
        load_store(store)
    with pytest.raises(ModelFormatError, match=re.escape(str(path))):
        open_model(store)
    assert [(b.path, b.problem) for b in verify_store(store)] == [(path, "missing")]


def test_checksum_mismatch_is_named_and_a_good_replica_still_serves(pristine, tmp_path):
    store = import_tiny(tmp_path, pristine, "m", drives=1)
    manifest = read_manifest(store)
    ((_, path),) = manifest.replica_paths(2, 0)
    original = path.read_bytes()
    damaged = bytearray(original)
    damaged[100] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with pytest.raises(ModelFormatError, match=re.escape(str(path)) + ".*checksum mismatch"):
        load_store(store)
    assert [(b.path, b.problem) for b in verify_store(store)] == [(path, "checksum mismatch")]
    # With an intact second replica listed, loading uses it.
    spare = tmp_path / "spare"
    good = spare / path.relative_to(Path(manifest.drives["d0"]))
    good.parent.mkdir(parents=True)
    good.write_bytes(original)
    data = json.loads((store / "manifest.json").read_text())
    data["drives"]["spare"] = str(spare)
    data["experts"]["2"][0]["replicas"].append("spare")
    (store / "manifest.json").write_text(json.dumps(data))
    load_store(store)


def test_interrupted_import_is_not_complete_and_resumes_to_the_same_store(pristine, tmp_path):
    drives = [Drive("d0", tmp_path / "drive0")]
    calls = []

    def stop_after_two(progress):
        calls.append(progress.done_bytes)
        if len(calls) == 2:
            raise KeyboardInterrupt

    store = tmp_path / "m"
    with pytest.raises(KeyboardInterrupt):
        import_checkpoint(pristine, store, drives, ImportOptions(), stop_after_two)
    assert not (store / "manifest.json").exists()
    with pytest.raises(ModelFormatError, match=r"did not finish.*resume"):
        read_manifest(store)
    with pytest.raises(ModelFormatError, match="did not finish"):
        open_model(store)
    with pytest.raises(NightshiftError, match="another source or with other options"):
        import_checkpoint(pristine, store, drives, ImportOptions(trunk_bits=4))

    resumed = import_checkpoint(pristine, store, drives)
    clean = import_checkpoint(pristine, tmp_path / "clean", [Drive("d0", tmp_path / "drive1")])
    assert resumed.experts == clean.experts
    assert resumed.trunk["sha256"] == clean.trunk["sha256"]
    assert not verify_store(store)
    assert not (store / ".import").exists() and not (store / "import-state.json").exists()


def test_a_drive_without_room_is_refused_before_anything_is_written(pristine, tmp_path):
    tight = [Drive("small", tmp_path / "small", budget_bytes=100_000)]
    with pytest.raises(NoSpaceError, match=r"experts need \d+ kB .* \(small: 100 kB\)"):
        import_checkpoint(pristine, tmp_path / "m", tight)
    assert not (tmp_path / "m").exists() and not (tmp_path / "small").exists()


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(ModelFormatError, match=r"config\.json missing"):
        import_checkpoint(tmp_path, tmp_path / "m", [Drive("d", tmp_path / "d")])
