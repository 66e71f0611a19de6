"""`bench replicate --replicas N`: a layout between one replica per expert and one on every drive, each new
replica a complete copy on the drives after the expert's first, and streamed tokens unchanged."""

from __future__ import annotations

import pytest

from bench.helpers.reference import greedy_tokens
from nightshift.app.cli import main
from nightshift.engine.bench.layout import new_replicas, replicate_everywhere
from nightshift.engine.errors import SettingError
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.store.manifest import read_manifest
from tests.helpers.stores import import_tiny, tiny_checkpoint


def streamed_tokens(store, settings: StreamSettings) -> list[int]:
    model, _, stream = load_streaming(store, settings)
    try:
        return greedy_tokens(model, 6)
    finally:
        stream.close()


def test_new_replicas_follow_the_first_in_drive_order() -> None:
    drives = ["d0", "d1", "d2", "d3"]
    assert new_replicas(["d2"], drives, 2) == ["d3"]
    assert new_replicas(["d3"], drives, 3) == ["d0", "d1"]
    assert new_replicas(["d1", "d2"], drives, 2) == []
    assert new_replicas(["d1", "d3"], drives, 1) == []
    assert new_replicas(["d1"], drives, None) == ["d2", "d3", "d0"]


def test_two_replicas_then_every_drive(tmp_path) -> None:
    store = import_tiny(tmp_path, tiny_checkpoint(tmp_path, "kimi_k3"), "kimi", drives=3)
    before = read_manifest(store)
    firsts = {(layer, e): entry["replicas"][0] for layer, row in before.experts.items() for e, entry in enumerate(row)}
    assert all(len(entry["replicas"]) == 1 for row in before.experts.values() for entry in row)

    copied = replicate_everywhere(store, 2)
    two = read_manifest(store)
    drives = list(two.drives)
    for (layer, expert), first in firsts.items():
        replicas = two.experts[layer][expert]["replicas"]
        assert replicas == [first, drives[(drives.index(first) + 1) % len(drives)]]
        paths = [path for _, path in two.replica_paths(layer, expert)]
        assert paths[0].read_bytes() == paths[1].read_bytes()
    assert copied == sum(layer.file_bytes * layer.num_experts for layer in two.layers)
    assert replicate_everywhere(store, 2) == 0  # already there

    reference = streamed_tokens(store, StreamSettings(cache_bytes=0))
    replicate_everywhere(store)
    every = read_manifest(store)
    assert all(sorted(entry["replicas"]) == sorted(drives) for row in every.experts.values() for entry in row)
    for drive in drives:  # each drive alone now holds the whole model, and streams the same tokens
        assert streamed_tokens(store, StreamSettings(cache_bytes=0, use_drives=[drive])) == reference


def test_more_replicas_than_drives_is_refused(tmp_path, home, capsys) -> None:
    store = import_tiny(tmp_path, tiny_checkpoint(tmp_path, "kimi_k3"), "kimi", drives=2)
    with pytest.raises(SettingError, match="give 1 to 2"):
        replicate_everywhere(store, 0)
    assert main(["bench", "replicate", "--model", str(store), "--replicas", "3"]) != 0
    assert "--replicas 3: the store has 2 drives; give 1 to 2" in capsys.readouterr().err
    assert all(len(entry["replicas"]) == 1 for row in read_manifest(store).experts.values() for entry in row)
