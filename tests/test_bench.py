"""`nightshift bench`, `runs` and `verify` end to end on a tiny store (figures recorded, never asserted on time)."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

import pytest

from nightshift.app.cli import main
from nightshift.app.commands.stream_flags import add_stream_arguments, settings_from
from nightshift.engine.moe.settings import StreamSettings
from tests.helpers.stores import import_tiny, tiny_checkpoint


@pytest.fixture(scope="module")
def kimi_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    return import_tiny(root, tiny_checkpoint(root, "kimi_k3"), "k")


def test_decode_records_floors_roofline_and_counters(kimi_store, home, capsys):
    assert main(["bench", "decode", "--model", str(kimi_store), "--tokens", "4", "--bandwidth-seconds", "0.2"]) == 0
    err = capsys.readouterr().err
    assert "disk floor" in err and "compute floor" in err and "recorded as run 1" in err
    assert main(["runs", "show", "1"]) == 0
    run = json.loads(capsys.readouterr().out)
    figures = run["figures"]
    assert run["kind"] == "decode" and figures["tokens_identical"] is True
    assert figures["roofline_ms"] == max(figures["disk_floor_ms"], figures["compute_floor_ms"])
    # the floor's bandwidth is never below what the timed run itself read at
    assert figures["bandwidth_bytes_per_s"] == max(figures["probed_bytes_per_s"], figures["achieved_bytes_per_s"])
    assert figures["floor_error"] == (figures["roofline_fraction"] > 1 or figures["disk_floor_fraction"] > 1)
    assert figures["layer_floor_ms"] >= figures["roofline_ms"] * (1 - 1e-9)  # a sum of maxima, never under it
    assert figures["bytes_per_token"] > 0 and run["counters"]["demand_reads"] > 0
    assert run["command"].startswith("nightshift ")


def test_the_layer_floor_adds_each_pass_at_its_own_bound():
    from nightshift.engine.bench.decode import layer_floor

    # two passes a token, 2 s of compute each: one waits 3 s on its reads, the other computes; the roofline's
    # max(4 s of reads, 4 s of compute) assumes the first pass's reads overlap the second's compute
    assert layer_floor([300, 100], bandwidth=100.0, compute_per_token=4.0, tokens=1) == 5.0
    assert layer_floor([300, 100, 100, 300], bandwidth=100.0, compute_per_token=4.0, tokens=2) == 5.0


def ab(store, mechanism: str) -> int:
    """`nightshift bench ab` of `mechanism` on `store`: 3 tokens, a short bandwidth measurement."""
    return main(
        ["bench", "ab", "--model", str(store), "--tokens", "3", "--bandwidth-seconds", "0.2", "--mechanism", mechanism]
    )


def test_ab_is_recorded_only_when_the_mechanism_fired(kimi_store, home, capsys):
    # The store has one replica per expert: split reads cannot happen, so nothing is recorded.
    assert ab(kimi_store, "split") == 1
    assert "not recorded" in capsys.readouterr().err
    assert main(["runs", "list"]) == 0
    assert "no runs recorded yet" in capsys.readouterr().err
    assert ab(kimi_store, "prefetch") == 0
    assert main(["runs", "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 2 and "baseline" in listed[1] and ("win" in listed[0] or "loss" in listed[0])
    assert main(["runs", "compare", "1", "2"]) == 0
    assert "config prefetch\tFalse\tTrue" in capsys.readouterr().out
    assert main(["runs", "export", "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("kind,")
    assert main(["runs", "export"]) == 0
    for run in json.loads(capsys.readouterr().out):  # both rows carry the one in-RAM run's floor and identity
        assert run["figures"]["tokens_identical"] is True and run["figures"]["compute_floor_ms"] > 0


def test_every_setting_is_a_flag_under_its_documented_name():
    parser = argparse.ArgumentParser()
    add_stream_arguments(parser)
    assert settings_from(parser.parse_args(["--model", "m", "--no-tuning"])) == StreamSettings()
    flags = [  # every setting's flag as the docs name it, the field it sets and the value
        ("--demand-threads 8", "demand_threads", 8),
        ("--prefetch-threads 3", "prefetch_threads", 3),
        ("--shared-pool", "shared_pool", True),
        ("--dispatch first_replica", "dispatch", "first_replica"),
        ("--split-reads", "split_reads", True),
        ("--no-balance-reads", "balance_reads", False),
        ("--no-prefetch", "prefetch", False),
        ("--prefetch-off 3,4", "prefetch_off", frozenset({3, 4})),
        ("--prefetch-limit 2", "prefetch_limit", 2),
        ("--no-prefetch-fill", "prefetch_fill", False),
        ("--prefetch-cap guesses", "prefetch_cap", "guesses"),
        ("--no-prefetch-abort", "prefetch_abort", False),
        ("--load-left", "load_left", True),
        ("--spare-demand-drives", "spare_demand_drives", True),
        ("--no-prefill-prefetch", "prefill_prefetch", False),
        ("--no-prefetch-tail", "prefetch_tail", False),
        ("--no-overlap", "overlap", False),
        ("--memory-budget 30M", "cache_bytes", 30 << 20),
        ("--context-tokens 4096", "context_tokens", 4096),
        ("--cache-policy lru", "cache_policy", "lru"),
        ("--warm-start", "warm_start", True),
        ("--verify-checksums first", "verify_checksums", "first"),
        ("--trace", "trace", True),
        ("--use-drives d0,d1", "use_drives", ("d0", "d1")),
    ]
    assert {name for _, name, _ in flags} == {f.name for f in fields(StreamSettings)}
    settings = settings_from(
        parser.parse_args(["--model", "m", "--no-tuning", *" ".join(flag for flag, _, _ in flags).split()])
    )
    assert {name: getattr(settings, name) for _, name, _ in flags} == {name: value for _, name, value in flags}
    for wrong in (["--prefetch-off", "3,x"], ["--dispatch", "nearest"], ["--cache-policy", "random"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["--model", "m", *wrong])


def test_verify_passes_for_streaming_and_fails_on_a_different_record(kimi_store, home, capsys):
    assert main(["verify", "--model", str(kimi_store), "--memory-budget", "1M"]) == 0
    assert "pass" in capsys.readouterr().err
    record = home / "verify" / f"{kimi_store.name}.json"
    data = json.loads(record.read_text())
    data["tokens"][5] = (data["tokens"][5] + 1) % 512
    record.write_text(json.dumps(data))
    assert main(["verify", "--model", str(kimi_store)]) == 1
    assert "token 5 differs" in capsys.readouterr().err


def test_ladder_runs_the_same_layout_on_one_then_two_drives(kimi_store, home, capsys, tmp_path):
    replicated = import_tiny(tmp_path, tiny_checkpoint(tmp_path, "qwen3_moe"), "q")
    assert main(["bench", "replicate", "--model", str(replicated)]) == 0
    assert "copied" in capsys.readouterr().err
    assert main(["bench", "ladder", "--model", str(replicated), "--tokens", "3", "--bandwidth-seconds", "0.2"]) == 0
    assert "2-drive rate" in capsys.readouterr().err
    assert main(["runs", "export"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["config"]["use_drives"] for r in runs] == [["d0"], ["d0", "d1"]]
    assert all(r["figures"]["tokens_identical"] is True and "roofline_fraction" in r["figures"] for r in runs)
    assert runs[0]["drives"]["d1"]["bytes"] == 0 and runs[1]["drives"]["d1"]["bytes"] > 0


def test_prefill_records_read_amplification_floors_and_the_row_by_row_figure(kimi_store, home, capsys):
    assert (
        main(
            [
                "bench",
                "prefill",
                "--model",
                str(kimi_store),
                "--prompt-tokens",
                "40",
                "--chunk",
                "16",
                "--row-tokens",
                "6",
                "--bandwidth-seconds",
                "0.2",
            ]
        )
        == 0
    )
    assert "recorded as run 1" in capsys.readouterr().err
    assert main(["runs", "show", "1"]) == 0
    run = json.loads(capsys.readouterr().out)
    f = run["figures"]
    assert run["kind"] == "prefill" and run["config"]["chunk"] == 16 and f["first_token_identical"] is True
    assert f["read_amplification"] == f["bytes_read"] / f["unique_bytes"] >= 1.0  # 3 chunks: some experts re-read
    assert f["row_by_row_read_amplification"] > 1.0
    assert f["roofline_s"] == max(f["disk_floor_s"], f["compute_floor_s"])
    assert run["counters"]["prefill_unique_bytes"] == f["unique_bytes"] > 0


def test_cache_bench_replays_the_trace_and_measures_its_pick_at_the_predicted_hit_rate(kimi_store, home, capsys):
    args = ["bench", "cache", "--model", str(kimi_store), "--tokens", "3", "--bandwidth-seconds", "0.1"]
    assert main([*args, "--shares", "0.25,1", "--measure", "0.25"]) == 0
    err = capsys.readouterr().err
    assert (
        "| budget | lru | lru-admit | frequency | frequency-open | lrfu | s3fifo |" in err
    )  # then any profile's columns
    assert "| static oracle | belady |" in err
    assert "simulator's pick" in err and "recorded as run 2" in err
    assert main(["runs", "show", "2"]) == 0
    measured = json.loads(capsys.readouterr().out)
    f = measured["figures"]
    assert measured["kind"] == "cache" and f["budget_share"] == 0.25
    assert f["hit_rate"] == f["predicted_hit_rate"] <= f["belady_hit_rate"]  # same routing, the engine's cache
    assert f["roofline_ms"] == max(f["disk_floor_ms"], f["compute_floor_ms"])  # from the bytes this budget read
    assert f["roofline_fraction"] == f["roofline_ms"] / f["ms_per_token"] and f["tokens_identical"] is True
    assert f["wait_ms_per_token"] >= 0 and "(roofline: " in measured["verdict"]
    trace = next(home.rglob("traces/*.jsonl"))
    assert main([*args, "--routing", str(trace), "--measure", ""]) == 0  # a recorded trace, simulated only
    assert "recorded as run 3" in capsys.readouterr().err
    # Foresight: the same budget again with the trace's experts as every guess, recorded apart.
    assert main([*args, "--routing", str(trace), "--measure", "0.25", "--foresight"]) == 0
    assert "foresight (the trace's next-layer experts as the guesses)" in capsys.readouterr().err
    assert main(["runs", "show", "6"]) == 0
    foreseen = json.loads(capsys.readouterr().out)
    assert foreseen["kind"] == "cache-foresight" and foreseen["config"]["prefetch_fill"] is False
    assert foreseen["figures"]["prefetch_recall"] == 1.0 and foreseen["figures"]["tokens_identical"] is True
    assert foreseen["counters"]["joined_prefetch"] > 0


def test_the_resident_bench_takes_each_ratio_within_a_round():
    from bench.resident import per_round

    rates = {"streamed": [2.0, 3.0, 9.0], "in RAM": [1.0, 4.0, 10.0]}  # the ratio of medians: 3 / 4
    got = per_round({k: [{"rate": r} for r in v] for k, v in rates.items()}, "ratio", "streamed", "in RAM", "rate")
    assert got["ratio"] == 0.9 and got["ratio q1"] == 0.75 and got["ratio q3"] == 2.0  # rounds: 2, 0.75, 0.9


def test_the_resident_bench_says_unresolved_when_the_decode_interval_straddles_the_bound():
    from bench.resident import decode_figures, verdict

    read_once = {"drive_reads": 480, "distinct_experts_read": 480, "read_after_first_round": 0}
    fine = {**read_once, "tokens_identical_to_in_ram": True, "prefill_vs_dense": 1.15}

    def said(ratios: list[float], **changed) -> str:
        return verdict({**fine, **decode_figures({"ratios": ratios}), **changed})

    steady = [0.99, 1.0, 1.01, 0.98, 1.02, 1.0, 0.99, 1.01]
    assert decode_figures({"ratios": steady})["decode_vs_in_ram low"] >= 0.98
    assert said(steady) == "pass"
    assert said([r - 0.2 for r in steady]) == "below-target"
    assert said([0.85, 1.05, 0.9, 1.04, 0.88, 1.06, 0.93, 0.97]) == "unresolved"
    assert said(steady, read_after_first_round=1) == "below-target"  # an expert read again
    assert said(steady, tokens_identical_to_in_ram=False) == "below-target"
