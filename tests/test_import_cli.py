"""`nightshift model synth | import | list` as a user runs them."""

from __future__ import annotations

import pytest

from nightshift.app.cli import main
from nightshift.engine.store.families import build_model, switch_sites
from nightshift.engine.store.gguf_import import convert_gguf
from nightshift.engine.store.manifest import read_manifest
from nightshift.engine.store.synth_families import FAMILIES, PRESETS
from tests.helpers.gguf_files import write_tiny_llama


@pytest.mark.parametrize("action", ["import", "synth", "verify", "place"])
def test_store_commands_have_help(action, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["model", action, "--help"])
    assert exit_.value.code == 0 and "usage: nightshift model" in capsys.readouterr().out


def test_synth_import_list_generate(home, tmp_path, capsys):
    src = tmp_path / "ckpt"
    assert main(["model", "synth", "--arch", "qwen3_moe", "--preset", "tiny", "--skew", "2", "--out", str(src)]) == 0
    assert (src / "config.json").is_file() and (src / "tokenizer.json").is_file()
    assert main(["model", "import", str(src), "--name", "tinyq"]) == 0
    out, err = capsys.readouterr()
    assert out.strip().endswith("tinyq")
    assert "imported" in err and "ETA" in err and "(100 %)" in err
    assert "weight-exact: the store holds exactly the weights mlx-lm loads" in err
    manifest = read_manifest(home / "models" / "tinyq")
    assert manifest.trunk["bits"] == "as released" and not manifest.trunk["quantized"]
    assert manifest.source["weight_exact"] is True
    assert main(["model", "list"]) == 0
    assert "tinyq\tstore" in capsys.readouterr().out
    assert main(["generate", "--model", "tinyq", "--max-tokens", "4", "Close the month."]) == 0
    assert main(["model", "import", str(src), "--name", "tinyq"]) == 1
    assert "already holds an imported model" in capsys.readouterr().err


def test_synth_refuses_unknown_family_and_existing_directory(home, tmp_path, capsys):
    assert main(["model", "synth", "--arch", "llama", "--out", str(tmp_path / "x")]) == 1
    assert "no synthetic preset for 'llama'" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    assert main(["model", "synth", "--arch", "mixtral", "--out", str(tmp_path / "full")]) == 1
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_import_of_a_dense_model_is_refused(home, tmp_path, capsys):
    dense = convert_gguf(write_tiny_llama(tmp_path / "tiny.gguf"), tmp_path / "dense")
    assert main(["model", "import", str(dense), "--name", "dense"]) == 1
    err = capsys.readouterr().err
    assert "no routed experts" in err and "nightshift model moefy" in err


def test_bench_preset_is_a_scaled_down_kimi_k3():
    """>= 8 MoE layers, >= 128 experts with 16 active, MXFP4 experts >= 1 MiB, >= 2 GiB of experts."""
    config = FAMILIES["kimi_k3"].config(*PRESETS["bench"])
    sites = switch_sites(build_model(config))
    assert len(sites) >= 8 and all(site.num_experts >= 128 for site in sites)
    assert config["num_experts_per_token"] == 16
    hidden, inner = config["hidden_size"], config["moe_intermediate_size"]
    expert = 3 * (hidden * inner // 2 + hidden * inner // 32)  # packed FP4 codes + one E8M0 scale per 32
    assert expert >= 2**20
    assert expert * sum(site.num_experts for site in sites) >= 2 * 2**30


def test_import_uses_the_data_dirs_drives_file(home, tmp_path, capsys):
    src = tmp_path / "ckpt"
    assert main(["model", "synth", "--arch", "mixtral", "--out", str(src)]) == 0
    home.mkdir(parents=True, exist_ok=True)
    (home / "drives.toml").write_text(f'[[drive]]\nname = "fast"\nroot = "{tmp_path / "fast"}"\n')
    assert main(["model", "import", str(src), "--name", "m"]) == 0
    assert "drives in" in capsys.readouterr().err
    assert read_manifest(home / "models" / "m").drives == {"fast": str(tmp_path / "fast")}
    assert list((tmp_path / "fast" / "m").rglob("*.expert"))
