"""Tuned settings per store: the record next to the manifest, applied unless a flag overrides, and the
calibration end to end on a tiny store (choices and gains recorded, never asserted on time)."""

from __future__ import annotations

import argparse
import json

import pytest

from nightshift.app.cli import main
from nightshift.app.commands.stream_flags import add_stream_arguments, settings_from
from nightshift.engine.bench.cache_sim import Call
from nightshift.engine.bench.tune import policy_record
from nightshift.engine.moe.held import held_expert_bytes
from nightshift.engine.moe.settings import LRFU, StreamSettings
from nightshift.engine.moe.tuning import (
    TuningError,
    apply_tuning,
    describe_tuning,
    read_tuning,
    tuned_values,
    tuning_for,
    tuning_path,
    write_tuning,
)
from nightshift.engine.store.manifest import read_manifest
from tests.helpers.stores import import_tiny, tiny_checkpoint

CHOSEN = {**tuned_values(StreamSettings()), "prefetch": False, "demand_threads": 2, "prefetch_off": [3]}


def record(gain: float = 0.07, drives: tuple[str, ...] = ("d0", "d1"), every: bool = True, **chosen) -> dict:
    return {
        "tuned_at": "2026-11-30T23:00:00Z",
        "settings": {**CHOSEN, **chosen},
        "gain": gain,
        "drives_in_use": list(drives),
        "all_drives": every,
    }


def test_tuned_values_apply_except_where_given(tmp_path):
    assert read_tuning(tmp_path) == [] and apply_tuning(tmp_path, StreamSettings()) == StreamSettings()
    assert "not tuned" in describe_tuning(tmp_path)
    write_tuning(tmp_path, record())
    assert [p.name for p in tmp_path.iterdir()] == ["tuning.json"]  # the temp file was renamed, none left
    tuned = apply_tuning(tmp_path, StreamSettings(cache_bytes=0, verify_checksums="first"))
    assert (tuned.prefetch, tuned.demand_threads, tuned.prefetch_off) == (False, 2, frozenset({3}))
    assert tuned.cache_bytes == 0 and tuned.verify_checksums == "first"  # never tuned: the caller's
    kept = apply_tuning(tmp_path, StreamSettings(demand_threads=8), frozenset({"demand_threads"}))
    assert kept.demand_threads == 8 and kept.prefetch is False
    line = describe_tuning(tmp_path)
    assert "demand_threads=2" in line and "prefetch=False" in line and "+7.0%" in line and "all its drives" in line


def test_each_set_of_drives_keeps_its_own_record(tmp_path):
    write_tuning(tmp_path, record())
    write_tuning(tmp_path, record(drives=("d1", "d0"), every=True, demand_threads=1))  # same set: replaced
    write_tuning(tmp_path, record(drives=("d0",), every=False, prefetch=True))
    assert len(read_tuning(tmp_path)) == 2
    assert apply_tuning(tmp_path, StreamSettings()).demand_threads == 1
    one = apply_tuning(tmp_path, StreamSettings(use_drives=("d0",)))
    assert one.prefetch is True and "on d0 (" in describe_tuning(tmp_path, ("d0",))
    assert tuning_for(tmp_path, ("d1",))["all_drives"]  # no record for d1 alone: the all-drives one


def test_a_damaged_record_is_refused_with_what_to_do(tmp_path):
    tuning_path(tmp_path).write_text("{not json")
    with pytest.raises(TuningError, match="model tune"):
        apply_tuning(tmp_path, StreamSettings())
    tuning_path(tmp_path).write_text(json.dumps({"format": 99, "tunings": []}))
    with pytest.raises(TuningError, match="format"):
        read_tuning(tmp_path)


def test_bench_flags_override_tuned_values_and_no_tuning_ignores_them(tmp_path, capsys):
    write_tuning(tmp_path, record())
    parser = argparse.ArgumentParser()
    add_stream_arguments(parser)
    tuned = settings_from(parser.parse_args(["--model", str(tmp_path)]))
    assert tuned.prefetch is False and tuned.demand_threads == 2
    assert "tuned settings from 2026-11-30" in capsys.readouterr().err
    flagged = settings_from(parser.parse_args(["--model", str(tmp_path), "--prefetch", "--demand-threads", "4"]))
    assert flagged.prefetch is True and flagged.demand_threads == 4 and flagged.prefetch_off == frozenset({3})
    assert settings_from(parser.parse_args(["--model", str(tmp_path), "--no-tuning"])) == StreamSettings()


def test_the_cache_policy_record_counts_the_bytes_the_cache_holds(mixtral_store):
    """The record sets the auto budget beside every expert as the cache holds them (not the padded files), the
    figure its "holds every expert" is decided by: a budget of exactly that replays no eviction."""
    manifest = read_manifest(mixtral_store)
    every = held_expert_bytes(manifest)
    # the tensors' bytes (a slab row each), not the 4 KiB-aligned files
    assert every == sum(sum(slot.nbytes for slot in spec.tensors) * spec.num_experts for spec in manifest.layers)
    layer = manifest.layers[0]
    calls = [Call(layer.layer, (expert,), 1) for expert in [0, 1, 2, 0, 3, 1, 0, 2] * 4]
    record, chosen = policy_record(calls, manifest, every, LRFU)
    assert record["held_expert_bytes"] == every == record["auto_budget_bytes"] and "expert_bytes" not in record
    assert chosen is None and "holds every expert" in record["why"]
    record, _ = policy_record(calls, manifest, every - 1, LRFU)
    assert "holds every expert" not in record["why"] and record["lookups"] == len(calls)


@pytest.mark.slow
def test_model_tune_measures_side_by_side_and_writes_the_record(tmp_path, home, capsys):
    store = import_tiny(tmp_path, tiny_checkpoint(tmp_path, "kimi_k3", skew=2.0), "k")
    assert main(["bench", "replicate", "--model", str(store)]) == 0  # replicas on both drives, one device
    assert main(["model", "tune", str(store), "--tokens", "2", "--minutes", "5", "--repeats", "2"]) == 0
    err = capsys.readouterr().err
    assert "tuned settings from" in err and "side by side" in err
    tuning = tuning_for(store)
    assert tuning["all_drives"] and set(tuning["settings"]) == set(CHOSEN) and not tuning["skipped"]
    steps = [t["step"] for t in tuning["trials"]]
    assert steps[:4] == ["prefetch"] * 4 and steps[-4:] == ["gain"] * 4  # two rounds, alternating
    labels = [t["label"] for t in tuning["trials"][:4]]
    assert labels == ["as chosen so far", "prefetch off", "prefetch off", "as chosen so far"]
    assert "reads in parts" not in steps  # both drives are on one device: parts cannot read in parallel, not tried
    measured = tuning["tuned_tokens_per_s"] / tuning["defaults_tokens_per_s"] - 1
    assert tuning["measured"] == measured
    if tuning["settings"] == {**CHOSEN, "prefetch": True, "demand_threads": 4, "prefetch_off": []}:
        assert tuning["gain"] == 0 and "the defaults won" in describe_tuning(store)  # nothing to gain from
    if tuning["rejected"]:  # the steps' choice lost side by side: the defaults stay, its loss kept
        assert tuning["gain"] == 0 and tuning["rejected"]["gain"] == measured <= 0
        assert tuning["settings"] == {**CHOSEN, "prefetch": True, "demand_threads": 4, "prefetch_off": []}
    elif tuning["gain"]:
        assert tuning["gain"] == measured
    on = tuning["trials"][0]
    assert on["changes"] == {} and on["proven"] and on["counters"]["joined_prefetch"] > 0
    assert tuning["cache_policy"]["lookups"] > 0
    assert main(["runs", "list", "--kind", "tune"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(tuning["trials"])
    assert main(["generate", "--model", str(store), "--max-tokens", "2", "Hi"]) == 0
    assert "tuned settings from" in capsys.readouterr().err
