"""Placement on real, separate disks: the rig's loop devices (root only; skipped elsewhere)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from bench.helpers.reference import PROMPT
from nightshift.engine.errors import NoSpaceError
from nightshift.engine.io.drives import load_drives
from nightshift.engine.rig.drives import RigSpec, rig_up
from nightshift.engine.store.importer import import_checkpoint
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import read_manifest
from nightshift.engine.store.placement import drive_device
from nightshift.engine.store.synth import synthesize
from nightshift.engine.store.upkeep import place_store, verify_store
from tests.helpers.rig import requires_rig
from tests.helpers.stores import tiny_checkpoint

pytestmark = [pytest.mark.rig, requires_rig, pytest.mark.slow]


def test_hot_experts_are_replicated_across_rig_disks(rig_place, tmp_path):
    rig_up(rig_place.rig_dir, RigSpec(count=3, size_bytes=64 << 20, read_bps=200_000_000), rig_place.drives_file)
    drives = load_drives(rig_place.drives_file)
    assert len({drive_device(d) for d in drives}) == 3  # three loop devices, three disks
    src = tiny_checkpoint(tmp_path, "kimi_k3", skew=4.0)
    store = tmp_path / "store"
    import_checkpoint(src, store, drives)
    before = load_store(store)[0](mx.array([PROMPT]))
    routing = {layer.layer: [8 - e for e in range(layer.num_experts)] for layer in read_manifest(store).layers}
    manifest, _ = place_store(store, drives, routing)
    holders = [e["replicas"] for layer in manifest.experts.values() for e in layer]
    assert all(len(h) == len(set(h)) for h in holders)
    assert all(len(h) == 3 for h in holders)  # room on every disk: each expert on all three
    assert not verify_store(store)
    assert mx.array_equal(load_store(store)[0](mx.array([PROMPT])), before).item()


def test_a_disk_without_room_is_refused_before_writing(rig_place, tmp_path):
    rig_up(rig_place.rig_dir, RigSpec(count=2, size_bytes=64 << 20, read_bps=200_000_000), rig_place.drives_file)
    drives = load_drives(rig_place.drives_file)
    src = synthesize("kimi_k3", "small", tmp_path / "src", layers=6)  # 134 MB of experts, 2 x 64 MB of disk
    before = {d.name: sorted(d.root.rglob("*")) for d in drives}
    with pytest.raises(NoSpaceError, match="experts need 134 MB"):
        import_checkpoint(src, tmp_path / "store", drives)
    assert not (tmp_path / "store").exists()
    assert {d.name: sorted(d.root.rglob("*")) for d in drives} == before
