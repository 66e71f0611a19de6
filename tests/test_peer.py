"""`nightshift bench peer`: budgets to cgroup limits, the GGUF's expert bytes, the table, the command; end to end
against llama.cpp when an interpreter with llama-cpp-python is at hand (slow; skipped, saying why, otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest

from nightshift.app.cli import main
from nightshift.engine.bench.peer import (
    IN_RAM,
    LLAMA,
    NIGHTSHIFT,
    SLACK,
    PeerError,
    SideRun,
    budgets,
    limit_for,
    llama_cpp_python,
    read_gguf,
    table,
)

REPO = Path(__file__).resolve().parent.parent


def test_a_budget_becomes_a_limit_on_top_of_what_the_process_needs_besides_experts():
    # nightshift: 300 MB of its own memory after warm-up, 40 MB of it experts already cached
    assert limit_for(300_000_000, 40_000_000, 0, 100_000_000) == 360_000_000 + SLACK
    # llama.cpp: 60 MB of its own, its 25 MB of non-expert tensors mapped from the file, the same budget
    assert limit_for(60_000_000, 0, 25_000_000, 100_000_000) == 185_000_000 + SLACK
    assert budgets(1_000_000, (0.1, 0.25, 0.5)) == [(0.1, 100_000), (0.25, 250_000), (0.5, 500_000)]


def _write_moe_gguf(path: Path, split: tuple[int, int] | None = None) -> None:
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    if split:
        writer.add_uint16("split.no", split[0])
        writer.add_uint16("split.count", split[1])
    q = gguf.GGMLQuantizationType.Q4_1
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((16, 64)).astype(np.float32))
    writer.add_tensor("blk.0.ffn_up_exps.weight", gguf.quants.quantize(rng.standard_normal((4 * 32, 64)).astype(np.float32), q), raw_dtype=q)  # fmt: skip
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_read_gguf_counts_expert_and_trunk_bytes_over_every_split_file(tmp_path):
    _write_moe_gguf(tmp_path / "m-00001-of-00002.gguf", (0, 2))
    _write_moe_gguf(tmp_path / "m-00002-of-00002.gguf", (1, 2))
    model = read_gguf(tmp_path / "m-00001-of-00002.gguf")
    assert [p.name for p in model.files] == ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    # per file: 128 x 64 Q4_1 weights (20 bytes per 32: 4-bit codes, a float16 scale and minimum) and a 16 x 64
    # float32 embedding
    assert (model.expert_weights, model.expert_bytes, model.trunk_bytes) == (2 * 8192, 2 * 5120, 2 * 4096)
    assert model.bits_per_expert_weight == 5.0


def test_a_gguf_without_routed_experts_is_refused(tmp_path):
    from tests.helpers.gguf_files import write_tiny_llama

    with pytest.raises(PeerError, match="no routed expert tensors"):
        read_gguf(write_tiny_llama(tmp_path / "dense.gguf"))


def _run(engine: str, share: float | None, s_per_token: float, read: int, **extra) -> SideRun:
    done = {"tokens": [1, 2, 3, 4, 5], "s_per_token": s_per_token, "wall_s": 4 * s_per_token, "cpu_s": s_per_token,
            "read_bytes": read, "major_faults": 8, **extra}  # fmt: skip
    budget = None if share is None else int(share * 1e9)
    return SideRun(
        engine, share, budget, None if share is None else budget + 200_000_000, done, {"peak": 1_500_000_000}
    )


def test_the_table_puts_each_engine_side_by_side_with_nightshifts_rate_over_llamas():
    runs = [
        _run(NIGHTSHIFT, 0.25, 0.5, 40_000_000, wait_s=1.0, cache_hits=30, cache_misses=10, cache_used=1),
        _run(LLAMA, 0.25, 2.0, 400_000_000),
        _run(IN_RAM, None, 0.1, 0),
    ]
    lines = table(runs).splitlines()
    assert lines[0].startswith("| budget | engine | limit MB | tok/s | x llama.cpp |") and len(lines) == 5
    ours, theirs, in_ram = (line.split(" | ") for line in lines[2:])
    assert ours[:5] == ["| 25% (250 MB)", "nightshift", "450", "2.000", "4.00"]  # 2.0 tok/s over 0.5
    assert ours[5:10] == ["10.0", "20.0", "0.25", "50%", "75.0%"]  # MB/token, MB/s, CPU/wall, wait share, hits
    assert theirs[:5] == ["| 25% (250 MB)", "llama.cpp", "450", "0.500", ""] and theirs[5] == "100.0"
    assert in_ram[:3] == ["| all (in RAM)", "mlx-lm in RAM", "none (peak 1500)"]


def test_bench_peer_without_a_llama_cpp_interpreter_says_how_to_get_one(home, monkeypatch, capsys):
    monkeypatch.delenv("NIGHTSHIFT_LLAMA_CPP_PYTHON", raising=False)
    if llama_cpp_python() is not None:
        pytest.skip("llama-cpp-python is importable here")
    assert main(["bench", "peer", "--model", "nowhere", "--gguf", "nowhere.gguf", "--shares", "0.1,0.25"]) != 0
    assert "bench/peer_setup.sh" in capsys.readouterr().err


def test_bench_peer_refuses_a_share_outside_0_to_1(home, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "peer", "--model", "m", "--gguf", "g.gguf", "--shares", "0.25,1.5"])
    assert "shares of the expert bytes" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_peer_end_to_end_against_llama_cpp(tmp_path, home, capsys):
    """A tiny qwen3_moe: synthesized, imported by nightshift, converted by llama.cpp's own converter
    (NIGHTSHIFT_LLAMA_CPP_SOURCE: its source tree), then every engine run at one budget and recorded."""
    python = llama_cpp_python()
    source = os.environ.get("NIGHTSHIFT_LLAMA_CPP_SOURCE")
    if python is None or not source:
        pytest.skip(
            "needs llama-cpp-python (NIGHTSHIFT_LLAMA_CPP_PYTHON, built by bench/peer_setup.sh) and llama.cpp's "
            "converter (NIGHTSHIFT_LLAMA_CPP_SOURCE: the sdist's vendor/llama.cpp)"
        )
    if os.geteuid() != 0:
        pytest.skip("needs root (a memory cgroup per engine)")
    from nightshift.engine.store.synth import synthesize

    src = synthesize("qwen3_moe", "tiny", tmp_path / "src", seed=0, skew=2.0)
    assert main(["model", "import", str(src), "--name", "tiny-peer", "--quantize-experts"]) == 0
    convert = [python, str(REPO / "bench" / "peer_convert.py"), str(src), str(tmp_path / "gguf"),
               "--llama-cpp", source, "--shards", "1"]  # fmt: skip
    subprocess.run(convert, check=True, capture_output=True)
    first = sorted((tmp_path / "gguf").glob("model*.gguf"))[0]
    argv = ["bench", "peer", "--model", "tiny-peer", "--gguf", str(first), "--shares", "0.5", "--tokens", "3",
            "--threads", "1"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| 50% (" in out and "| llama.cpp |" in out and "| mlx-lm in RAM |" in out
    assert main(["runs", "export", "--format", "json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert sorted(r["config"]["engine"] for r in runs) == sorted([NIGHTSHIFT, LLAMA, IN_RAM])
    for run in runs:
        assert run["kind"] == "peer" and run["verdict"] == "measured" and run["figures"]["tokens_per_s"] > 0
        assert run["figures"]["oom_kills"] == 0 and (run["config"]["limit"] is None) == (
            run["config"]["engine"] == IN_RAM
        )
    ours = next(r for r in runs if r["config"]["engine"] == NIGHTSHIFT)
    assert ours["figures"]["cache_used"] <= ours["config"]["budget"] and 0 <= ours["figures"]["hit_rate"] <= 1


def test_the_read_ahead_of_the_drive_holding_a_file_is_read(tmp_path):
    """llama.cpp's reads through mmap are the faulting page plus the device's read-ahead: the run records it."""
    from nightshift.engine.bench.peer import read_ahead_kb

    (tmp_path / "f").write_bytes(b"x")
    assert read_ahead_kb(tmp_path / "f") >= 0
