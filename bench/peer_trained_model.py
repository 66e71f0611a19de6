"""The trained-routing model as a Mixtral checkpoint that every peer loads (llama.cpp, mlx-lm, nightshift).

    .venv/bin/python -m bench.peer_trained_model [--source CKPT] [--out DIR] [--epsilon 1e-6] [--dtype bfloat16]
        [--norm-gate-dtype DTYPE] [--pad-neurons N]

The trained-routing bench model (`bench-replay`) replays recorded traces, which no other engine can load; its
source, the MoEfied SmolLM2 (`llama_moe`: 128 experts of 12 neurons a layer, 16 active, the chosen experts summed
with weight 1; docs/moefication.md), is a family only nightshift knows. Mixtral is the nearest family all peers
run: llama attention, top-k of a linear gate, a softmax over the chosen logits weighting the experts' outputs.
The mapping:

- every weight dequantized exactly (4-bit affine, 8-bit embeddings) and written in `--dtype`, the norms and the
  gates too, as a real bf16 checkpoint stores them. `--norm-gate-dtype float32` (the first exports') keeps those
  float32: selection is then not rounded, but float32 norms or gate scores make every activation float32, and
  nightshift then multiplies float32 copies of the bf16 weights (the tied LM head's ~113 MB among them);
- the gate is the router times `--epsilon`: a positive scale picks the same top k, and the softmax over k logits
  scaled that small is 1/k within epsilon x their spread; the down projections are multiplied by k (exact in
  any float format: k = 16), so the weighted sum is the weight-1 sum;
- Mixtral's gate has no bias and llama_moe's router has one (an intercept the router fit needs: without it,
  45-50 % of a token's experts change). The bias-free gate is fitted by least squares to the router's scores
  (bias included) on the MoE model's own inputs over the calibration text that fitted the routers: its top k
  is measured against the router's on the held-out evaluation text, layer by layer, and printed;
- with `--pad-neurons N` each expert's neurons are padded with zero neurons to N (their gate and up rows zero,
  their down columns zero: silu(0) x 0 = 0 adds nothing, the same function exactly), so that the experts, not the
  engine, dominate memory (the export at 12 neurons has 159 MB of experts beside ~400 MB of nightshift's own).

Then the exported model (its weights as written, computed in float32) is compared with the llama_moe model on
the evaluation text: perplexity of each, the largest logit difference, the share of positions whose top token
agrees. The directory is written aside and renamed when complete, with a README.txt saying all of this.
"""

from __future__ import annotations

# First, before mlx: nightshift.engine routes MLX's float matmuls to the system BLAS (engine/cpu_blas.py).
import nightshift.engine  # noqa: F401

# isort: split
import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map
from mlx_lm.utils import load_model, load_tokenizer

from nightshift.app.paths import data_dir
from nightshift.engine.models import get_classes
from nightshift.engine.store.moefy import CALIBRATION_TEXT, EVALUATION_TEXT, DenseReference, dequantize_float32

SOURCE = "smollm2-moe128-k16-checkpoint"
EPSILON = 1e-6
DTYPES = {"bfloat16": mx.bfloat16, "float32": mx.float32}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
NORMS = {"input_layernorm", "post_attention_layernorm", "norm"}


class MoeReference(DenseReference):
    """A llama_moe checkpoint in float32 (quantized weights dequantized exactly), read as DenseReference reads."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.model, self.config = load_model(self.path, get_model_classes=get_classes)
        if self.config.get("model_type") != "llama_moe":
            raise SystemExit(f"{self.path} is a {self.config.get('model_type')!r} model, not llama_moe")
        dequantize_float32(self.model)
        self.tokenizer = load_tokenizer(self.path)


@dataclass
class Gate:
    """One layer's bias-free gate (as stored: times epsilon, rounded) and how often its top k is the router's on
    held-out text."""

    weight: np.ndarray
    agreement: float


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argpartition(-scores, k - 1, axis=-1)[:, :k]


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Mean share of each row of `a`'s chosen experts that `b` chose too."""
    return float(np.mean([len(np.intersect1d(x, y)) / len(x) for x, y in zip(a, b)]))


def fit_gates(reference: MoeReference, k: int, epsilon: float, dtype: mx.Dtype) -> list[Gate]:
    """Each layer's router (weight and bias) refitted without bias, by least squares on its own MoE inputs, times
    `epsilon` and rounded to `dtype` as it will be stored (its agreement measured as stored)."""
    fit_inputs = reference.layer_inputs(reference.windows(CALIBRATION_TEXT.read_text()))
    held_out = reference.layer_inputs(reference.windows(EVALUATION_TEXT.read_text()))
    gates = []
    for layer, x, x_eval in zip(reference.layers, fit_inputs, held_out):
        weight, bias = np.array(layer.mlp.router.weight), np.array(layer.mlp.router.bias)
        fitted = np.linalg.lstsq(x, x @ weight.T + bias, rcond=None)[0].T
        stored = np.array(mx.array(fitted * epsilon).astype(dtype).astype(mx.float32))
        gates.append(Gate(stored, agreement(top_k(x_eval @ weight.T + bias, k), top_k(x_eval @ stored.T, k))))
    return gates


def padded(weight: mx.array, neurons: int, axis: int) -> mx.array:
    """Experts' `weight` (one expert per row of axis 0) with zero neurons added along `axis` up to `neurons`."""
    widths = [(0, 0)] * weight.ndim
    widths[axis] = (0, neurons - weight.shape[axis])
    return mx.pad(weight, widths)


def mixtral_weights(
    reference: MoeReference,
    gates: list[Gate],
    dtypes: tuple[mx.Dtype, mx.Dtype],
    neurons: int | None = None,
) -> dict:
    """The llama_moe model's weights under Mixtral's names (experts one by one, as Mixtral releases them), the norms
    and gates in the second of `dtypes`, every other weight in the first, each expert padded with zero neurons to `neurons` if given."""
    k = reference.config["num_experts_per_tok"]
    dtype, small = dtypes
    flat = dict(tree_flatten(reference.model.parameters()))
    out = {}
    for name, value in flat.items():
        if ".mlp." not in name:
            is_norm = value.ndim == 1 and name.split(".")[-2] in NORMS
            out[name] = value.astype(small if is_norm else dtype)
    for number, gate in enumerate(gates):
        prefix = f"model.layers.{number}"
        out[f"{prefix}.block_sparse_moe.gate.weight"] = mx.array(gate.weight, dtype=small)
        for mine, theirs, scale, axis in (
            ("gate_proj", "w1", 1, 1),
            ("down_proj", "w2", k, 2),
            ("up_proj", "w3", 1, 1),
        ):
            stacked = flat[f"{prefix}.mlp.switch_mlp.{mine}.weight"] * scale
            if neurons is not None:
                stacked = padded(stacked, neurons, axis)
            for expert in range(stacked.shape[0]):
                out[f"{prefix}.block_sparse_moe.experts.{expert}.{theirs}.weight"] = stacked[expert].astype(dtype)
    return out


def mixtral_config(config: dict, dtype: str, neurons: int | None = None) -> dict:
    keep = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size", "tie_word_embeddings",
            "num_experts_per_tok", "bos_token_id", "eos_token_id")  # fmt: skip
    out = {key: config[key] for key in keep if key in config}
    experts = config["num_experts"]
    out.update(
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        num_local_experts=experts,
        intermediate_size=neurons or config["intermediate_size"] // experts,
        hidden_act="silu",
        sliding_window=None,
        router_aux_loss_coef=0.0,
        output_router_logits=False,
        torch_dtype=dtype,
    )
    return out


def float32_model(path: Path) -> nn.Module:
    """mlx-lm's model of `path`, every float parameter cast to float32 (mlx-lm runs 16-bit experts on no CPU)."""
    model, _ = load_model(path, get_model_classes=get_classes)
    model.update(tree_map(lambda v: v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v,
                          model.parameters()))  # fmt: skip
    return model


def distance(reference: MoeReference, exported: nn.Module) -> dict:
    """Perplexity of both models, largest logit difference and top-token agreement, over the evaluation text."""
    nll = {"llama_moe": [], "mixtral": []}
    worst, same, positions = 0.0, 0, 0
    for window in reference.windows(EVALUATION_TEXT.read_text()):
        a, b = reference.model(window)[0], exported(window)[0]
        worst = max(worst, float(mx.max(mx.abs(a - b))))
        same += int(mx.sum(mx.argmax(a, -1) == mx.argmax(b, -1)))
        positions += a.shape[0]
        target = window[0, 1:]
        for name, logits in (("llama_moe", a), ("mixtral", b)):
            nll[name].append(np.array(nn.losses.cross_entropy(logits[:-1], target)))
    out = {f"perplexity_{name}": float(np.exp(np.concatenate(v).mean())) for name, v in nll.items()}
    return out | {"max_logit_difference": worst, "top_token_agreement": same / positions, "positions": positions}


def write_readme(
    out: Path, source: Path, epsilon: float, dtypes: tuple[str, str], gates: list[Gate], measured: dict
) -> None:
    config = json.loads((out / "config.json").read_text())
    k, neurons = config["num_experts_per_tok"], config["intermediate_size"]
    per_layer = " ".join(f"{gate.agreement:.3f}" for gate in gates)
    dtype, small = dtypes
    (out / "README.txt").write_text(
        f"""A Mixtral checkpoint of the trained-routing model (issue [22]), written by bench/peer_trained_model.py.

Source: {source} (llama_moe: SmolLM2-135M MoEfied into 128 experts of 12 neurons a layer, 16 active, the
chosen experts summed with weight 1; 4-bit affine g32 weights, 8-bit embeddings), dequantized exactly.
Precision: every weight {dtype} (experts, attention, embeddings; tied LM head), the norms and the gates
{small}.
Padding: each expert is {neurons} neurons; those past the source's (12) are zero neurons (gate and up rows zero, down
columns zero: silu(0) x 0 = 0, the same function exactly), written so that experts dominate memory.
Gate: the router refitted without its bias (Mixtral's gate has none) by least squares on the MoE inputs over the
calibration text, times epsilon = {epsilon:g}, so the softmax over the {k} chosen logits is 1/{k} within epsilon x
their spread; the down projections are multiplied by {k}. Share of the router's {k} experts the bias-free gate picks,
held-out evaluation text, layer by layer: {per_layer}.
Against the llama_moe model over the evaluation text ({measured["positions"]} positions, float32 compute):
perplexity {measured["perplexity_llama_moe"]:.1f} (llama_moe) vs {measured["perplexity_mixtral"]:.1f} (this);
largest logit difference {measured["max_logit_difference"]:.3f}; top token agrees at
{100 * measured["top_token_agreement"]:.1f} % of positions. The MoEfied model is chaotic: a float32 export with
the source's routers (their bias zeroed on both sides) gives each layer's output within 5e-4 of the source's from
the same input, yet differences compound over 30 layers (top token agrees at 73 % of 64 positions; bf16 rounding
and the refitted gates add to it here). The model writes no good text (the MoEfied model is
~900x the dense model's perplexity at 16 of 128, docs/moefication.md): it is for timing, its routing is trained.
"""
    )


def export(
    source: Path,
    out: Path,
    epsilon: float = EPSILON,
    dtype: str = "bfloat16",
    neurons: int | None = None,
    norm_gate_dtype: str | None = None,
    say=print,
) -> dict:
    """Write `source` (llama_moe) as a Mixtral checkpoint at `out`, its norms and gates in `norm_gate_dtype` (default:
    `dtype`), each expert padded to `neurons` if given; the distance measured (see `distance`)."""
    small = norm_gate_dtype or dtype
    if out.exists():
        raise SystemExit(f"{out} exists: remove it or name another --out")
    reference = MoeReference(source)
    k = reference.config["num_experts_per_tok"]
    own = reference.config["intermediate_size"] // reference.config["num_experts"]
    if neurons is not None and neurons < own:
        raise SystemExit(f"--pad-neurons {neurons} is fewer than an expert's {own} neurons: give at least {own}")
    gates = fit_gates(reference, k, epsilon, DTYPES[small])
    for number, gate in enumerate(gates):
        say(f"layer {number}: the bias-free gate picks {100 * gate.agreement:.1f} % of the router's {k} experts")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    weights = mixtral_weights(reference, gates, (DTYPES[dtype], DTYPES[small]), neurons)
    mx.save_safetensors(str(partial / "model.safetensors"), weights, {"format": "pt"})
    config = mixtral_config(reference.config, dtype, neurons)
    (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, partial / name)
    measured = distance(reference, float32_model(partial))
    say(json.dumps(measured))
    write_readme(partial, source, epsilon, (dtype, small), gates, measured)
    partial.rename(out)
    say(f"wrote {out}")
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=data_dir() / "models" / SOURCE)
    parser.add_argument("--out", type=Path, help="where to write it (default: moe128-mixtral[-pN] in the data dir)")
    parser.add_argument("--epsilon", type=float, default=EPSILON)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument(
        "--norm-gate-dtype",
        choices=sorted(DTYPES),
        help="the norms' and gates' (default: --dtype, as real checkpoints)",
    )
    parser.add_argument("--pad-neurons", type=int, metavar="N", help="pad each expert with zero neurons to N")
    args = parser.parse_args(argv)
    name = "moe128-mixtral" + (f"-p{args.pad_neurons}" if args.pad_neurons else "")
    out = args.out or data_dir() / "models" / name
    export(args.source, out, args.epsilon, args.dtype, args.pad_neurons, args.norm_gate_dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
