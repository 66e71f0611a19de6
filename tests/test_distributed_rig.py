"""Pipelined over 3 ranks on the rig: each rank reads its layers' experts from its own throttled rig drive."""

from __future__ import annotations

import json

import pytest

from nightshift.engine.distributed.hosts import load_hosts
from nightshift.engine.distributed.launch import free_port, generate_over_hosts
from nightshift.engine.io.drives import Drive
from nightshift.engine.rig.drives import RigSpec, inside_rig, rig_up
from nightshift.engine.store.importer import ImportOptions, import_checkpoint
from nightshift.engine.store.synth import synthesize
from tests.helpers.hosts import LAYERS, PROMPT, TOKENS, place_by_hosts, single_process
from tests.helpers.rig import requires_rig

pytestmark = [pytest.mark.rig, pytest.mark.slow, requires_rig]


def test_three_ranks_on_their_own_rig_drives_give_one_process_tokens(rig_place, tmp_path):
    state = rig_up(rig_place.rig_dir, RigSpec(3, 64 << 20, 50_000_000), rig_place.drives_file)
    drives = state.as_drives()
    src = synthesize("qwen3_moe", "tiny", tmp_path / "src", seed=1, layers=LAYERS)
    store = tmp_path / "q"
    import_checkpoint(src, store, [Drive("import", tmp_path / "import")], ImportOptions(trunk_bits=16))
    hosts = [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "drives": {d.name: str(d.root)}} for d in drives]
    (tmp_path / "hosts.json").write_text(json.dumps({"hosts": hosts}))
    place_by_hosts(store, tmp_path / "hosts.json")
    expected = single_process(store)
    with inside_rig(state):  # the ranks start in the rig's cgroup: their reads are throttled per drive
        result = generate_over_hosts(store, load_hosts(tmp_path / "hosts.json"), PROMPT, TOKENS, port=free_port(3))
    assert result.tokens == expected
    for rank, figures in enumerate(result.ranks):
        assert {d for d, b in figures["drive_bytes"].items() if b} == {drives[rank].name}
