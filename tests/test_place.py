"""The layout planner and `model place`: every expert once, hot ones replicated on other devices, budgets kept."""

from __future__ import annotations

import mlx.core as mx
import pytest

from bench.helpers.reference import PROMPT
from nightshift.app.cli import main
from nightshift.engine.errors import NoSpaceError
from nightshift.engine.io.drives import Drive
from nightshift.engine.runtime import open_model
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import read_manifest
from nightshift.engine.store.placement import DriveRoom, plan_placement
from nightshift.engine.store.upkeep import calibration_prompts, measure_routing, place_store, verify_store
from tests.helpers.stores import import_tiny, tiny_checkpoint

MB = 1_000_000


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("src"), "kimi_k3", skew=4.0)


def sizes(layers: int = 2, experts: int = 8, size: int = MB) -> dict:
    return {(layer, e): size for layer in range(layers) for e in range(experts)}


def test_every_expert_once_and_bytes_balanced_without_routing():
    plan = plan_placement(sizes(), [DriveRoom("a", "sda", 100 * MB), DriveRoom("b", "sdb", 100 * MB)], replicate=False)
    assert all(len(holders) == 1 for holders in plan.values())
    assert sum(h == ["a"] for h in plan.values()) == sum(h == ["b"] for h in plan.values()) == 8


def test_hottest_experts_get_replicas_on_other_devices_within_budget():
    frequency = {key: 1.0 / (1 + key[1]) for key in sizes()}  # expert 0 hottest in each layer
    drives = [DriveRoom("a", "sda", 12 * MB), DriveRoom("a2", "sda", 12 * MB), DriveRoom("b", "sdb", 12 * MB)]
    plan = plan_placement(sizes(), drives, frequency)
    device = {d.name: d.device for d in drives}
    for holders in plan.values():
        assert len({device[h] for h in holders}) == len(holders)  # never two replicas on one device
    used = {d.name: sum(MB for h in plan.values() if d.name in h) for d in drives}
    assert all(used[d.name] <= d.room for d in drives)
    replicated = {key for key, holders in plan.items() if len(holders) > 1}
    assert {(0, 0), (1, 0)} <= replicated  # the hottest are replicated
    for key, holders in plan.items():  # and replication stopped only because the other device is full
        if key not in replicated:
            others = [d for d in drives if d.device != device[holders[0]]]
            assert all(used[d.name] + MB > d.room for d in others)


def test_no_room_for_one_copy_is_refused():
    with pytest.raises(NoSpaceError, match=r"need 16 MB .*\(a: 10 MB\)"):
        plan_placement(sizes(), [DriveRoom("a", "sda", 10 * MB)])


def test_skewed_checkpoint_has_hot_experts_the_router_prefers(source, tmp_path):
    model = open_model(import_tiny(tmp_path, source, "m", drives=1))
    counts = measure_routing(model.model, calibration_prompts(model.tokenizer))
    for per_expert in counts.values():
        assert per_expert.sum() > 0
        assert per_expert.max() > 1.5 * sorted(per_expert)[len(per_expert) // 2]  # a hot expert, well above median


def test_place_moves_files_to_new_drives_and_keeps_the_model_identical(source, tmp_path):
    store = import_tiny(tmp_path, source, "m", drives=1)
    before = load_store(store)[0](mx.array([PROMPT]))
    old_files = set((tmp_path / "m-drive0").rglob("*.expert"))
    new = [Drive("x", tmp_path / "x"), Drive("y", tmp_path / "y", budget_bytes=200_000)]
    routing = {layer.layer: list(range(1, layer.num_experts + 1)) for layer in read_manifest(store).layers}
    manifest, copied = place_store(store, new, routing)
    assert set(manifest.drives) == {"x", "y"} and copied
    assert not any(path.exists() for path in old_files)
    holders = [tuple(e["replicas"]) for layer in manifest.experts.values() for e in layer]
    assert all(h[0] in ("x", "y") for h in holders)
    y_bytes = sum(
        manifest.layer(index).file_bytes
        for index, layer in manifest.experts.items()
        for e in layer
        if "y" in e["replicas"]
    )
    assert 0 < y_bytes <= 200_000
    assert not verify_store(store)
    assert mx.array_equal(load_store(store)[0](mx.array([PROMPT])), before).item()


def test_place_and_verify_from_the_command_line(source, tmp_path, home, capsys):
    store = import_tiny(home / "models", source, "cli", drives=1)
    drives = tmp_path / "drives.toml"
    drives.write_text(f'[[drive]]\nname = "n"\nroot = "{tmp_path / "n"}"\n')
    assert main(["model", "place", "cli", "--drives", str(drives)]) == 0
    assert "measuring expert routing" in capsys.readouterr().err
    assert read_manifest(store).routing  # measured counts kept in the manifest
    assert main(["model", "verify", "cli"]) == 0
    victim = next((tmp_path / "n").rglob("E0003.expert"))
    victim.write_bytes(b"garbage")
    assert main(["model", "verify", "cli"]) == 1
    err = capsys.readouterr().err
    assert str(victim) in err and "bytes, expected" in err
