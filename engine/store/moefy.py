"""MoEfication: split a dense llama's feed-forward layers into routed experts.

An expert is a group of the FFN's SwiGLU neurons (rows of gate/up, columns of
down). Neurons that fire together on calibration text go into the same group
(balanced co-activation clustering), and a linear router is fitted by least
squares to predict, from the FFN's input, the log of each group's output norm.
The experts' outputs are added with weight 1, so with all experts active the
result is the dense FFN; with the top k active it is an approximation whose cost
is measured in docs/moefication.md (bench/moefy_study.py).

Precision: gate/up rows are sliced out of their quantized tensors untouched
(quantization groups run along a row, so this is exact). down's columns are its
input dimension, across which its 4-bit groups run, so an arbitrary neuron group
would cut through them; down slices are therefore stored as float32, into which
the affine 4-bit values (fp16 scale x integer + fp16 bias) dequantize exactly.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.activations import swiglu
from mlx_lm.models.switch_layers import QuantizedSwitchLinear
from mlx_lm.tokenizer_utils import load as load_tokenizer
from mlx_lm.utils import dequantize_model, load_model

from nightshift.engine.errors import ModelFormatError, NightshiftError, UnsupportedModelError
from nightshift.engine.store.moefy_defaults import DEFAULT_EXPERTS, DEFAULT_K

DATA_DIR = Path(__file__).parent / "data"
CALIBRATION_TEXT = DATA_DIR / "calibration.txt"
EVALUATION_TEXT = DATA_DIR / "evaluation.txt"

# Token windows for calibration and evaluation: short enough to look like ordinary prompts.
WINDOW_TOKENS = 512
# Ridge strength for the router fit, relative to the mean diagonal of X^T X.
ROUTER_RIDGE = 1e-3
MARKER = "nightshift.json"
MODEL_FILE = "model.safetensors"

Say = Callable[[str], None]


def _mlp_prefix(layer: int) -> str:
    return f"model.layers.{layer}.mlp"


def dequantize_float32(model: nn.Module) -> nn.Module:
    """Replace quantized layers by float32 ones holding exactly the same values.

    mlx-lm's `dequantize_model` computes in the scales' dtype (float16 here), which
    rounds; with float32 scales and biases the affine values are exact.
    """
    for _, module in model.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear)):
            module.scales = module.scales.astype(mx.float32)
            module.biases = module.biases.astype(mx.float32)
    return dequantize_model(model)


class _Recorder(nn.Module):
    """Wraps an MLP and keeps each input it sees."""

    def __init__(self, mlp: nn.Module, sink: list):
        super().__init__()
        self.mlp = mlp
        self.sink = sink

    def __call__(self, x: mx.array) -> mx.array:
        self.sink.append(x)
        return self.mlp(x)


class DenseReference:
    """A dense llama in float32 (quantized weights dequantized exactly), to calibrate and to compare against."""

    def __init__(self, dense_dir: Path):
        self.path = Path(dense_dir)
        config_file = self.path / "config.json"
        if not config_file.is_file():
            raise ModelFormatError(f"no model at {self.path} (config.json missing)")
        self.config = json.loads(config_file.read_text())
        if self.config.get("model_type") != "llama":
            raise UnsupportedModelError(
                f"{self.path} is a {self.config.get('model_type')!r} model; MoEfication takes a dense llama "
                "(e.g. the default model, `nightshift model default`)"
            )
        self.model, _ = load_model(self.path)
        dequantize_float32(self.model)
        self.tokenizer = load_tokenizer(self.path)

    @property
    def layers(self) -> list[nn.Module]:
        return self.model.layers

    def windows(self, text: str) -> list[mx.array]:
        """`text` as token windows of at most WINDOW_TOKENS, each a (1, n) batch."""
        tokens = self.tokenizer.encode(text)
        return [mx.array(tokens[i : i + WINDOW_TOKENS])[None] for i in range(0, len(tokens), WINDOW_TOKENS)]

    def layer_inputs(self, windows: list[mx.array]) -> Iterator[np.ndarray]:
        """For each layer in turn, the (tokens, hidden) inputs its FFN receives over `windows`.

        The forward passes over all windows are built lazily and evaluated a layer at a
        time, so a caller can work on each layer as soon as its inputs are known; the
        values are those of whole passes (same operations on the same arrays), and the
        last layer's FFN, whose output no FFN sees, is never run.
        """
        sinks: list[list] = [[] for _ in self.layers]
        originals = [layer.mlp for layer in self.layers]
        for layer, sink in zip(self.layers, sinks):
            layer.mlp = _Recorder(layer.mlp, sink)
        try:
            for window in windows:
                self.model.model(window)  # the trunk only: no logits needed
        finally:
            for layer, mlp in zip(self.layers, originals):
                layer.mlp = mlp
        for sink in sinks:
            mx.eval(sink)
            yield np.concatenate([np.array(x.reshape(-1, x.shape[-1])) for x in sink])
            sink.clear()

    def mlp_inputs(self, windows: list[mx.array]) -> list[np.ndarray]:
        """For each layer, the (tokens, hidden) inputs its FFN receives over `windows`."""
        return list(self.layer_inputs(windows))


def neuron_activations(mlp: nn.Module, x: np.ndarray) -> np.ndarray:
    """(tokens, neurons) SwiGLU activations of a float llama MLP on inputs `x`."""
    xs = mx.array(x)
    return np.array(swiglu(mlp.gate_proj(xs), mlp.up_proj(xs)))


def group_outputs(h: np.ndarray, down: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(tokens, experts, hidden): each group's contribution to the FFN output."""
    return np.einsum("ten,den->ted", h[:, groups], down[:, groups], optimize=True)


def _balanced_assign(similarity: np.ndarray, size: int) -> np.ndarray:
    """Each row to a column, every column taking exactly `size` rows, preferring high similarity.

    Rounds of proposals: every unplaced row proposes to its most similar column
    with room left (the first such on ties), and each column keeps its most similar
    proposers (the lowest rows on ties).
    """
    rows, columns = similarity.shape
    assignment = np.full(rows, -1)
    room = np.full(columns, size)
    while (free := np.flatnonzero(assignment < 0)).size:
        choice = np.where(room > 0, similarity[free], -np.inf).argmax(axis=1)
        # Proposals by column, most similar first; lexsort is stable, so ties stay in row order.
        order = np.lexsort((-similarity[free, choice], choice))
        column = choice[order]
        rank = np.arange(order.size) - np.searchsorted(column, column)  # place in its column's queue
        kept = rank < room[column]
        assignment[free[order[kept]]] = column[kept]
        room -= np.bincount(column[kept], minlength=columns)
    return assignment


def group_neurons(magnitude: np.ndarray, experts: int, seed: int = 0, iterations: int = 20) -> np.ndarray:
    """Partition neurons into `experts` equal groups whose members are large on the same tokens.

    `magnitude` is (tokens, neurons): how much each neuron contributes on each token.
    Balanced spherical k-means on the neurons' token profiles. Returns (experts, size)
    neuron indices, each row sorted.
    """
    neurons = magnitude.shape[1]
    if neurons % experts:
        raise NightshiftError(f"{neurons} neurons do not split into {experts} equal experts; pick a divisor")
    profiles = magnitude.T / (np.linalg.norm(magnitude.T, axis=1, keepdims=True) + 1e-12)
    # The same profiles row-major: gathering a group's rows from the transposed view is ~10x slower.
    rows = np.ascontiguousarray(profiles)
    rng = np.random.default_rng(seed)
    centroids = profiles[rng.choice(neurons, experts, replace=False)]
    for _ in range(iterations):
        assignment = _balanced_assign(profiles @ centroids.T, neurons // experts)
        groups = np.argsort(assignment, kind="stable").reshape(experts, -1)  # each group's neurons, ascending
        centroids = _unit_means(rows, groups)
    return groups


def _unit_means(rows: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each group's mean row, scaled to unit length.

    A group's rows are gathered into a row-major (size, tokens) block and averaged down
    its columns, one row after another: the summation order of the plain
    `profiles[assignment == e].mean(axis=0)`, so the centroids match it bit for bit.
    """
    centroids = np.stack([rows[group].mean(axis=0) for group in groups])
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True) + 1e-12
    return centroids


def fit_linear_router(x: np.ndarray, targets: np.ndarray, ridge: float = ROUTER_RIDGE) -> tuple[np.ndarray, np.ndarray]:
    """Ridge least squares `targets ~ x @ W.T + b`; returns (W (experts, hidden), b (experts,))."""
    design = np.concatenate([x, np.ones((x.shape[0], 1), x.dtype)], axis=1).astype(np.float64)
    gram = design.T @ design
    gram[np.diag_indices_from(gram)] += ridge * np.trace(gram) / gram.shape[0]
    solution = np.linalg.solve(gram, design.T @ targets.astype(np.float64))
    return solution[:-1].T.astype(np.float32), solution[-1].astype(np.float32)


def router_targets(contribution: np.ndarray) -> np.ndarray:
    """What a router learns to predict: the log of each group's output norm.

    Top-k routing with large k is decided by which groups are smallest; in log
    space those count as much as the large ones (raw norms fit worse, see the study).
    """
    return np.log(contribution + 1e-6)


@dataclass
class LayerSplit:
    """How one FFN becomes experts: neuron groups and the router that picks them."""

    groups: np.ndarray  # (experts, neurons per expert)
    router_weight: np.ndarray  # (experts, hidden)
    router_bias: np.ndarray  # (experts,)


def layer_groups(mlp: nn.Module, x: np.ndarray, experts: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A float llama MLP's neurons grouped by co-activation on inputs `x`, and each group's output norm there.

    Returns (groups (experts, size), contribution (tokens, experts)).
    """
    h = neuron_activations(mlp, x)
    down = np.array(mlp.down_proj.weight)
    groups = group_neurons(np.abs(h) * np.linalg.norm(down, axis=0), experts, seed)
    return groups, np.linalg.norm(group_outputs(h, down, groups), axis=-1)


def split_layer(mlp: nn.Module, x: np.ndarray, experts: int, seed: int = 0) -> LayerSplit:
    """Group a float llama MLP's neurons by co-activation on inputs `x` and fit a router to their outputs."""
    groups, contribution = layer_groups(mlp, x, experts, seed)
    weight, bias = fit_linear_router(x, router_targets(contribution))
    return LayerSplit(groups, weight, bias)


def expert_tensors(
    dense: dict[str, mx.array], prefix: str, split: LayerSplit, quantization: dict | None
) -> dict[str, mx.array]:
    """The llama_moe tensors of one layer, cut from the dense checkpoint's tensors of that layer."""
    order = mx.array(split.groups.reshape(-1))
    experts, size = split.groups.shape
    out = {
        f"{prefix}.router.weight": mx.array(split.router_weight),
        f"{prefix}.router.bias": mx.array(split.router_bias),
    }
    for name in ("gate_proj", "up_proj"):
        for part in ("weight", "scales", "biases"):
            if (key := f"{prefix}.{name}.{part}") in dense:
                rows = dense[key][order]
                out[f"{prefix}.switch_mlp.{name}.{part}"] = rows.reshape(experts, size, rows.shape[-1])
    down = _float32_weight(dense, f"{prefix}.down_proj", quantization)
    columns = down[:, order].reshape(down.shape[0], experts, size)
    out[f"{prefix}.switch_mlp.down_proj.weight"] = columns.transpose(1, 0, 2)
    return out


def _float32_weight(dense: dict[str, mx.array], path: str, quantization: dict | None) -> mx.array:
    """The weight at `path` as float32; affine-quantized weights dequantize exactly with float32 scales."""
    weight = dense[f"{path}.weight"]
    if f"{path}.scales" not in dense:
        return weight.astype(mx.float32)
    settings = {**(quantization or {}), **(quantization or {}).get(path, {})}
    if settings.get("mode", "affine") != "affine":
        raise UnsupportedModelError(f"{path} is quantized as {settings['mode']!r}; MoEfication reads affine weights")
    scales, biases = (dense[f"{path}.{part}"].astype(mx.float32) for part in ("scales", "biases"))
    return mx.dequantize(weight, scales, biases, group_size=settings["group_size"], bits=settings["bits"])


def moefy(
    dense_dir: Path,
    out_dir: Path,
    experts: int = DEFAULT_EXPERTS,
    k: int = DEFAULT_K,
    calibration: str | None = None,
    say: Say = print,
) -> Path:
    """Write a llama_moe checkpoint of the dense llama at `dense_dir` into `out_dir` (built aside, then renamed).

    Neurons are grouped and routers fitted on `calibration` (default: the shipped CALIBRATION_TEXT).
    """
    if experts < 1:
        raise NightshiftError(f"the number of experts must be at least 1, got {experts}")
    if not 1 <= k <= experts:
        raise NightshiftError(f"k must be between 1 and the number of experts ({experts}), got {k}")
    start = time.monotonic()
    reference = DenseReference(dense_dir)
    neurons = reference.config["intermediate_size"]
    if neurons % experts:
        raise NightshiftError(f"the FFN's {neurons} neurons do not split into {experts} equal experts; pick a divisor")
    text = CALIBRATION_TEXT.read_text() if calibration is None else calibration
    say(f"calibrating on {len(text.split())} words of text")
    dense = mx.load(str(reference.path / MODEL_FILE))
    weights = {name: tensor for name, tensor in dense.items() if ".mlp." not in name}
    layers = len(reference.layers)
    for index, (layer, x) in enumerate(zip(reference.layers, reference.layer_inputs(reference.windows(text)))):
        say(
            f"layer {index + 1}/{layers}: {experts} experts of {neurons // experts} neurons, "
            f"{time.monotonic() - start:.0f} s so far"
        )
        split = split_layer(layer.mlp, x, experts, seed=index)
        weights.update(expert_tensors(dense, _mlp_prefix(index), split, reference.config.get("quantization")))
    config = {**reference.config, "model_type": "llama_moe", "num_experts": experts, "num_experts_per_tok": k}
    calibrated_on = CALIBRATION_TEXT.name if calibration is None else "text given by the caller"
    marker = {"source": str(reference.path), "moefy": {"experts": experts, "k": k, "calibration": calibrated_on}}
    say(f"writing {out_dir}")
    _write_checkpoint(reference.path, Path(out_dir), weights, config, marker)
    return Path(out_dir)


def _write_checkpoint(dense_dir: Path, out_dir: Path, weights: dict, config: dict, marker: dict) -> None:
    """config, weights, marker and the dense model's tokenizer files, in a sibling directory renamed at the end."""
    staging = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for source in dense_dir.iterdir():
            if source.is_file() and source.name.startswith("tokenizer"):
                shutil.copy2(source, staging / source.name)
        mx.save_safetensors(str(staging / MODEL_FILE), weights, metadata={"format": "mlx"})
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        (staging / MARKER).write_text(json.dumps(marker, indent=2))
        retired = out_dir.with_name(f".{out_dir.name}.old")
        if out_dir.exists():
            shutil.rmtree(retired, ignore_errors=True)
            out_dir.rename(retired)
        staging.rename(out_dir)
        shutil.rmtree(retired, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
