"""The copies of one Mixtral checkpoint that the streaming peers read (bench/peer_qwen2_moe_copy.py for fastllm,
bench/peers/nunspark_mixtral.py for nunspark) compute what the checkpoint computes: checked with mlx-lm on both
sides, and with nunspark itself where its venv is built."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load

from bench import peer_qwen2_moe_copy as qwen2
from bench import streaming_peers as peers
from tests.helpers.stores import tiny_checkpoint

REPO = Path(__file__).resolve().parent.parent
EPSILON = 1e-4  # the export's 1e-6 leaves float32 softmax near-ties that flip a selection now and then


def epsilon_gated(src: Path) -> dict:
    """Make `src` (a tiny Mixtral) gated as bench/peer_trained_model.py's export is: the gate times EPSILON (each
    softmax uniform within it), every down projection times k (the weighted sum is then the weight-1 sum)."""
    config = json.loads((src / "config.json").read_text())
    for path in src.glob("*.safetensors"):
        tensors = mx.load(str(path))
        for name, value in tensors.items():
            if name.endswith("block_sparse_moe.gate.weight"):
                tensors[name] = value * EPSILON
            elif name.endswith(".w2.weight"):
                tensors[name] = value * config["num_experts_per_tok"]
        mx.save_safetensors(str(path), tensors, metadata={"format": "pt"})
    return config


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory) -> tuple[Path, dict]:
    src = tiny_checkpoint(tmp_path_factory.mktemp("mixtral"), "mixtral")
    return src, epsilon_gated(src)


def test_the_qwen2_moe_copy_of_an_epsilon_gated_mixtral_computes_the_same_layers(mixtral, tmp_path):
    """mlx-lm's qwen2_moe weights the experts by the softmax over all of them, as fastllm's does (neither reads
    `norm_topk_prob`): with --down-scale E/k every layer of the copy computes the source's layer within epsilon
    (attention exactly: zero biases); without, its experts' sum is weighted 1/E instead of 1/k."""
    src, config = mixtral
    scale = config["num_local_experts"] / config["num_experts_per_tok"]
    source, _ = load(str(src))
    x = mx.random.normal((1, 7, config["hidden_size"]), key=mx.random.key(3))
    for down_scale in (scale, 1.0):
        out = tmp_path / f"q2-{down_scale:g}"
        subprocess.run([sys.executable, "-m", "bench.peer_qwen2_moe_copy", str(src), str(out), "--down-scale",
                        str(down_scale)], cwd=REPO, check=True, capture_output=True)  # fmt: skip
        written = json.loads((out / "config.json").read_text())
        assert written["model_type"] == "qwen2_moe" and written["num_experts"] == config["num_local_experts"]
        copy, _ = load(str(out))
        for ours, theirs in zip(source.model.layers, copy.model.layers, strict=True):
            assert mx.array_equal(ours.self_attn(x), theirs.self_attn(x))
            expected = ours.block_sparse_moe(x)
            error = (mx.abs(theirs.mlp(x) - expected).max() / mx.abs(expected).max()).item()
            assert error < 1e-3 if down_scale == scale else error > 0.5


def test_the_qwen2_moe_copy_refuses_what_is_not_mixtral_and_an_existing_folder(mixtral, tmp_path):
    src, config = mixtral
    with pytest.raises(SystemExit, match="exists"):
        sys.argv = ["peer_qwen2_moe_copy", str(src), str(src)]
        qwen2.main()
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_moe"}))
    with pytest.raises(SystemExit, match="give a Mixtral one"):
        sys.argv = ["peer_qwen2_moe_copy", str(other), str(tmp_path / "out")]
        qwen2.main()


@pytest.mark.slow
def test_nunspark_streams_the_padded_4_bit_mixtral_as_mlx_lm_computes_it(mixtral, tmp_path):
    """The registry entry nunspark lacks, and the copy padded to whole 4-bit groups: nunspark's greedy tokens equal
    mlx-lm's on the same MLX copy, and the experts are packed one piece each."""
    python = peers.PEERS_HOME / "nunspark" / "venv" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no {python}; build it with `bash bench/peers/setup.sh nunspark`")
    src, config = mixtral
    script = REPO / "bench" / "peers" / "nunspark_mixtral.py"
    mlx4, packed = tmp_path / "mlx4", tmp_path / "packed"
    subprocess.run([str(python), str(script), "convert", str(src), str(mlx4)], check=True, capture_output=True)
    subprocess.run([str(python), str(script), "pack", str(mlx4), str(packed)], check=True, capture_output=True)
    assert json.loads((mlx4 / "config.json").read_text())["intermediate_size"] % 32 == 0
    layers, experts = config["num_hidden_layers"], config["num_local_experts"]
    assert len(list(packed.glob("layer_*_expert_*.safetensors"))) == layers * experts
    prompt = list(range(3, 19))
    job = {"model": str(packed), "budget": 10**6, "prompt": prompt, "prompts": [prompt], "tokens": 6, "threads": 1,
           "width": 1}  # fmt: skip
    side = subprocess.run([str(python), str(REPO / "bench" / "peers" / "side_nunspark.py"), json.dumps(job)],
                          check=True, capture_output=True, text=True)  # fmt: skip
    said = json.loads([line for line in side.stdout.splitlines() if line.startswith("{")][-1])
    model, _ = load(str(mlx4))
    from mlx_lm.generate import generate_step

    expected = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=6)]
    assert said["tokens"] == [expected]
