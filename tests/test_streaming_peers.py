"""bench/streaming_peers.py and bench/peer_traces.py: the prompts every engine gets, a missing peer named with the
command that builds it, both trace formats replayed alike, alternated pairs and their median, CPU seconds a token;
end to end on a tiny qwen3_moe with nightshift and every peer whose venv is built (slow; root for the memory
cgroups)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import peer_traces as traces
from bench import streaming_peers as peers
from tests.helpers.stores import import_tiny, tiny_checkpoint

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def peer_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("peers")
    return import_tiny(root, tiny_checkpoint(root, "qwen3_moe"), "qwen-store")


def test_every_engine_reads_the_same_prompts_each_two_tokens_further_on(peer_store):
    [single] = peers.prompt_ids(peer_store, 12)
    batch = peers.prompt_ids(peer_store, 12, width=4)
    assert len(single) == 12 and batch[0] == single
    assert all(len(p) == 12 for p in batch) and batch[1][:10] == batch[0][2:] and batch[3][:6] == batch[0][6:]
    with pytest.raises(SystemExit, match="ask less"):
        peers.prompt_ids(peer_store, 10_000)


def test_a_forced_run_feeds_the_ids_that_follow_the_prompt_in_the_bench_text(peer_store):
    [prompt] = peers.prompt_ids(peer_store, 12)
    forced = peers.forced_ids(peer_store, prompt, 40)
    whole = peers.Tokenizer.from_file(str(peer_store / "tokenizer.json")).encode(peers.PROMPT_TEXT + peers.FORCED_TEXT)
    assert forced == whole.ids[12:52] and len(forced) == 40
    with pytest.raises(SystemExit, match="ask fewer tokens"):
        peers.forced_ids(peer_store, prompt, 10_000)


def test_the_budgets_are_shares_of_the_stores_expert_bytes(peer_store):
    manifest = json.loads((peer_store / "manifest.json").read_text())
    layers = manifest["layers"]
    assert peers.expert_bytes(peer_store) == sum(layer["file_bytes"] * layer["num_experts"] for layer in layers) > 0


def test_a_missing_peer_is_named_with_the_command_that_builds_it(tmp_path):
    engine = peers.Engine("nunspark", tmp_path / "venv" / "bin" / "python", tmp_path)
    assert "bash bench/peers/setup.sh nunspark" in engine.missing()
    engine = peers.Engine("nunspark", Path(sys.executable), tmp_path / "nowhere")
    assert "no model copy" in engine.missing()


def test_hit_rates_come_from_each_engines_own_counters():
    assert peers.hit_rate("ftllm", {"cpu_hits": 3, "misses": 1, "cuda_hits": 0}) == 0.75
    assert peers.hit_rate("nunspark", {"hits": 1, "misses": 3}) == 0.25
    assert peers.hit_rate("airllm", {"expert_streaming": True}) is None


def test_fill_grows_the_cache_by_what_the_limit_left_and_no_further():
    mb = 10**6
    assert peers.filled_budget(50 * mb, limit=500 * mb, peak_rss=400 * mb, margin=20 * mb, total=200 * mb) == 130 * mb
    assert peers.filled_budget(50 * mb, limit=500 * mb, peak_rss=300 * mb, margin=20 * mb, total=200 * mb) == 200 * mb
    assert peers.filled_budget(50 * mb, limit=410 * mb, peak_rss=400 * mb, margin=20 * mb, total=200 * mb) == 50 * mb


def test_a_variant_names_stream_settings_by_field_with_json_values():
    assert peers.settings_of("prefetch=false,cache_policy=lrfu") == {"prefetch": False, "cache_policy": "lrfu"}
    for wrong in ("prefetch", "no_such_setting=1", "prefetch="):
        with pytest.raises(argparse.ArgumentTypeError, match="stream settings"):
            peers.settings_of(wrong)


def test_nightshift_and_nunspark_traces_replay_as_the_same_calls(tmp_path):
    ours = tmp_path / "nightshift.jsonl"
    ours.write_text('{"layer": 0, "experts": [3, 1], "rows": 4}\n{"layer": 1, "experts": [2], "rows": 1}\n')
    theirs = tmp_path / "nunspark.jsonl"
    theirs.write_text(
        '{"t": 1, "layer": 0, "fired": [1, 3], "batch_tokens": 4}\n{"t": 2, "layer": 1, "fired": [2], "batch_tokens": 1}\n'
    )
    assert traces.load_any(ours) == traces.load_any(theirs)
    assert [call.experts for call in traces.load_any(ours)] == [(1, 3), (2,)]


@pytest.mark.slow
def test_streaming_peers_end_to_end_records_every_engine_it_can_run(tmp_path, peer_store):
    """nightshift always; each peer whose venv bench/peers/setup.sh built (NIGHTSHIFT_PEERS), on its own copy."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a memory cgroup per engine)")
    src = peer_store.parent / "qwen3_moe-src"
    catalogue = tmp_path / "runs.sqlite"
    argv = [sys.executable, "-m", "bench.streaming_peers", str(peer_store), "--ftllm", str(src),
            "--shares", "0.5", "--tokens", "3", "--prompt-tokens", "6", "--threads", "1",
            "--catalogue", str(catalogue), "--traces", str(tmp_path / "traces"), "--fill", "--fill-margin-mb", "0",
            "--variant", "prefetch=false"]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr
    from nightshift.engine.instruments.catalogue import Catalogue

    runs = Catalogue(catalogue).runs("streaming-peers")[::-1]  # in the order run
    ours, *more = [r for r in runs if r.config["engine"] == "nightshift"]
    variant = next(r for r in more if r.config["settings"])
    assert variant.config["settings"] == {"prefetch": False} and variant.config["limit_bytes"] > 0
    for other in more:  # --fill's run only where the first run left room under its limit
        assert other.config["limit_bytes"] == ours.figures["group_peak_bytes"]
        assert other.config["fill"] == (not other.config["settings"])
        assert other.verdict == "measured" or other.note
    assert ours.verdict == "measured" and len(ours.figures["tokens"][0]) == 3 and ours.figures["decode_tok_s"] > 0
    assert ours.figures["group_peak_bytes"] > 0 and 0 <= ours.figures["hit_rate"] <= 1
    assert ours.figures["cpu_s"] > ours.figures["decode_cpu_s"] > 0 and ours.figures["cpu_s_per_token"] > 0
    assert (tmp_path / "traces" / "nightshift-0.5.jsonl").read_text().count("\n") >= 3
    ftllm = [r for r in runs if r.config["engine"] == "ftllm"]
    if "skipped: ftllm" in done.stdout:
        assert not ftllm
    else:  # held to nightshift's measured memory, and recorded whether it ran or failed (with its last line)
        assert ftllm[0].config["limit_bytes"] == ours.figures["group_peak_bytes"]
        assert ftllm[0].verdict == "measured" or ftllm[0].note


def test_rates_count_every_prompt_of_a_batch_whatever_their_lengths():
    figures = {"tokens": [[1, 2, 3], [4, 5, 6]], "prompt_s": 2.0, "decode_s": 4.0, "prompt_read_bytes": 10**6,
               "decode_read_bytes": 8 * 10**6, "cpu_s": 12.0, "decode_cpu_s": 6.0}  # fmt: skip
    r = peers.rates(figures, prompt_tokens=30 + 10)
    assert r["prompt_tok_s"] == 20.0 and r["decode_tok_s"] == 1.0 and r["aggregate_tok_s"] == 1.0
    assert r["decode_read_mb_per_token"] == 2.0 and r["prompt_read_mb"] == 1.0
    assert r["cpu_s_per_token"] == 2.0 and r["decode_cpu_s_per_token"] == 1.5  # every token made; the decode's


def test_pairs_alternate_their_order_and_peers_first_starts_the_other_way(tmp_path):
    ours, a, b = (peers.Engine(name, Path(sys.executable), tmp_path) for name in ("nightshift", "nunspark", "ftllm"))
    orders = [[e.name for e in peers.pair_order(ours, [a, b], pair, peers_first=False)] for pair in range(3)]
    assert orders == [["nightshift", "nunspark", "ftllm"], ["nunspark", "ftllm", "nightshift"], orders[0]]
    assert peers.pair_order(ours, [a, b], 0, peers_first=True) == [a, b, ours]
    assert peers.pair_order(ours, [a, b], 1, peers_first=True) == [ours, a, b]


def test_a_pairs_ratio_is_the_decode_rates_and_a_failed_side_gives_none_not_a_figure():
    assert peers.speed_ratio({"decode_tok_s": 3.0}, {"decode_tok_s": 2.0}) == 1.5
    assert peers.speed_ratio({"decode_tok_s": 3.0}, {"error": "killed at the memory limit"}) is None
    assert peers.speed_ratio({"error": "exit 1"}, {"decode_tok_s": 2.0}) is None


def test_the_median_counts_the_pairs_that_finished_and_names_the_rest():
    line = peers.median_line("share 0.25", [1.0, None, 1.2, 0.9])
    assert line == "share 0.25: median 1.00x over 3 pairs (1.00, failed, 1.20, 0.90)"
    assert "no pair finished" in peers.median_line("share 0.1", [None])


def test_peers_first_without_a_known_limit_is_refused(monkeypatch, tmp_path, peer_store):
    argv = ["streaming_peers", str(peer_store), "--peers-first", "--catalogue", str(tmp_path / "runs.sqlite")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="give --limits"):
        peers.main()


def test_a_side_counts_its_decodes_cpu_seconds_from_the_first_token_to_the_last(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(REPO / "bench" / "peers"))
    import side  # the sides' own helper, imported by path as each side does

    clock = side.Clock()
    clock.token()
    deadline = side.cpu_seconds() + 0.05
    while side.cpu_seconds() < deadline:  # burn CPU: a condition, not a sleep
        pass
    clock.token()
    side.report(clock, [[1, 2]], {})
    said = json.loads(capsys.readouterr().out)
    # at least the 0.05 s burnt, less float rounding: os.times() gives tick counts summed as floats (0.04999...)
    assert said["decode_cpu_s"] >= 0.05 - 1e-9 and said["tokens"] == [[1, 2]]


@pytest.mark.slow
def test_the_batch_is_the_month_end_reviews_finding_chats(peer_store):
    chats = peers.chat_prompts(peer_store, "month-end", 8)
    assert len(chats) == 8 and len({tuple(c) for c in chats}) == 8  # eight different chats
    preamble = min(len(c) for c in chats)
    shared = next(i for i in range(preamble) if len({c[i] for c in chats}) > 1)
    assert 0 < shared < preamble  # the same template, then each its own finding
    with pytest.raises(SystemExit, match="finding chats"):
        peers.chat_prompts(peer_store, "month-end", 100)
