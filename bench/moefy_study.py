"""How much does MoEfication cost? Perplexity against k, for each grouping and router tried.

Runs the dense model in float32 (its quantized weights dequantized exactly) with
each FFN replaced by `RoutedFFN`: the same neuron groups, top-k selection and
weight-1 sum as llama_moe, computed with dense matmuls so a sweep is fast on a CPU.
Groups and routers are fitted on the calibration text; perplexity is measured on
the separate evaluation text. Prints a markdown table and writes the figures as JSON.

    .venv/bin/python -m bench.moefy_study DENSE_DIR --experts 16 32 64 --routers oracle linear mlp --json out.json
"""

from __future__ import annotations

# First, before mlx: nightshift.engine routes MLX's float matmuls to an OpenBLAS (engine/cpu_blas.py).
import nightshift.engine  # noqa: F401

# isort: split
import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx_lm.models.activations import swiglu

from nightshift.engine.store.moefy import (
    CALIBRATION_TEXT,
    EVALUATION_TEXT,
    DenseReference,
    fit_linear_router,
    group_outputs,
    layer_groups,
    neuron_activations,
    router_targets,
)

Scorer = Callable[[mx.array], mx.array]
ROUTERS = ("oracle", "linear", "linear-norm", "mlp")
MLP_ROUTER_HIDDEN = 64
MLP_ROUTER_STEPS = 300


class RoutedFFN(nn.Module):
    """A float llama MLP whose neuron groups are selected top-k per token and summed with weight 1.

    `scorer` maps FFN inputs to per-group scores; None is the oracle, which ranks
    groups by the norm of their true output (the best any router could do by norm).
    """

    def __init__(self, mlp: nn.Module, groups: np.ndarray, scorer: Scorer | None):
        super().__init__()
        self.mlp = mlp
        self.order = mx.array(groups.reshape(-1))
        self.experts, self.size = groups.shape
        down = mlp.down_proj.weight[:, self.order]
        self.down = down.reshape(down.shape[0], self.experts, self.size)
        self.scorer = scorer
        self.k = self.experts

    def __call__(self, x: mx.array) -> mx.array:
        h = swiglu(self.mlp.gate_proj(x), self.mlp.up_proj(x))[..., self.order]
        h = h.reshape(*h.shape[:-1], self.experts, self.size)
        outputs = mx.einsum("...en,den->...ed", h, self.down)
        scores = mx.linalg.norm(outputs, axis=-1) if self.scorer is None else self.scorer(x)
        kth = mx.sort(scores, axis=-1)[..., -self.k : -self.k + 1]
        return (outputs * (scores >= kth)[..., None]).sum(axis=-2)


class MLPRouter(nn.Module):
    """A small two-layer router, for comparison with the linear one."""

    def __init__(self, hidden: int, experts: int, width: int = MLP_ROUTER_HIDDEN):
        super().__init__()
        self.layers = [nn.Linear(hidden, width), nn.Linear(width, experts)]

    def __call__(self, x: mx.array) -> mx.array:
        return self.layers[1](nn.relu(self.layers[0](x)))


def fit_mlp_router(x: np.ndarray, targets: np.ndarray, seed: int) -> MLPRouter:
    """Adam on mean squared error to the (standardised) targets."""
    mx.random.seed(seed)
    router = MLPRouter(x.shape[1], targets.shape[1])
    xs, ys = mx.array(x), mx.array((targets - targets.mean(0)) / (targets.std(0) + 1e-6))
    optimizer = optim.Adam(learning_rate=3e-3)
    step = nn.value_and_grad(router, lambda model: ((model(xs) - ys) ** 2).mean())
    for _ in range(MLP_ROUTER_STEPS):
        _, grads = step(router)
        optimizer.update(router, grads)
        mx.eval(router.parameters(), optimizer.state)
    return router


def linear_scorer(weight: np.ndarray, bias: np.ndarray) -> Scorer:
    w, b = mx.array(weight), mx.array(bias)
    return lambda x: x @ w.T + b


def perplexity(model: nn.Module, windows: list[mx.array]) -> float:
    """exp of the mean next-token cross-entropy over all windows."""
    total, count = 0.0, 0
    for window in windows:
        logits = model(window[:, :-1]).astype(mx.float32)
        losses = nn.losses.cross_entropy(logits, window[:, 1:], reduction="sum")
        total += losses.item()
        count += window.shape[1] - 1
    return math.exp(total / count)


def k_values(experts: int, fractions: list[float] | None = None) -> list[int]:
    """k for each fraction of the FFN kept active; by default five eighths to all, in sixteenths."""
    if fractions is None:
        fractions = [f / 16 for f in range(10, 17)]
    return sorted({max(1, min(experts, round(f * experts))) for f in fractions})


def study(
    dense_dir: Path, expert_counts: list[int], routers: list[str], fractions: list[float] | None = None, say=print
) -> dict:
    """Perplexity of the dense model and of every (experts, router, k); the figures as a dict."""
    reference = DenseReference(dense_dir)
    calibration = reference.mlp_inputs(reference.windows(CALIBRATION_TEXT.read_text()))
    windows = reference.windows(EVALUATION_TEXT.read_text())
    dense_mlps = [layer.mlp for layer in reference.layers]
    started = time.perf_counter()
    dense = perplexity(reference.model, windows)
    say(
        f"dense perplexity {dense:.3f} ({sum(w.shape[1] for w in windows)} tokens, {time.perf_counter() - started:.0f} s)"
    )
    neurons = reference.config["intermediate_size"]
    results = {"dense": dense, "neurons": neurons, "evaluation_tokens": sum(w.shape[1] for w in windows), "rows": []}
    for experts in expert_counts:
        fitted = [
            (mlp, x, *layer_groups(mlp, x, experts, seed=index))
            for index, (mlp, x) in enumerate(zip(dense_mlps, calibration))
        ]
        for router in routers:
            scorers = [_scorer(router, x, norms, seed) for seed, (_, x, _, norms) in enumerate(fitted)]
            routed = [RoutedFFN(mlp, groups, scorer) for (mlp, _, groups, _), scorer in zip(fitted, scorers)]
            for layer, ffn in zip(reference.layers, routed):
                layer.mlp = ffn
            for k in k_values(experts, fractions):
                for ffn in routed:
                    ffn.k = k
                value = perplexity(reference.model, windows)
                row = {"experts": experts, "router": router, "k": k, "perplexity": value, "vs_dense": value / dense - 1}
                results["rows"].append(row)
                say(
                    f"experts {experts:3d}  router {router:7s}  k {k:3d}  perplexity {value:10.3f}  ({row['vs_dense']:+.1%})"
                )
        for layer, mlp in zip(reference.layers, dense_mlps):
            layer.mlp = mlp
    return results


def _scorer(router: str, x: np.ndarray, contribution: np.ndarray, seed: int) -> Scorer | None:
    """oracle; linear (the shipped router: log norms); linear-norm (raw norms); mlp (two layers, log norms)."""
    if router == "oracle":
        return None
    if router == "linear":
        return linear_scorer(*fit_linear_router(x, router_targets(contribution)))
    if router == "linear-norm":
        return linear_scorer(*fit_linear_router(x, contribution))
    return fit_mlp_router(x, router_targets(contribution), seed)


def ffn_errors(
    dense_dir: Path,
    experts: int,
    k: int,
    routers: list[str],
    layers: list[int],
    compensate: bool = False,
    on: str = "evaluation",
    say=print,
) -> list[dict]:
    """Per layer, the relative error of the routed FFN's output on the evaluation text's dense activations.

    A quick proxy to compare routers without a full perplexity run: ||dense - routed|| / ||dense||, averaged.
    `compensate`: also with each skipped group's mean output on the calibration text added in its place (a
    per-layer bias a model could carry). `on="calibration"`: measured on the text the routers were fitted to
    (how much of a router's gap to the oracle is fit, how much generalisation).
    """
    reference = DenseReference(dense_dir)
    calibration = reference.mlp_inputs(reference.windows(CALIBRATION_TEXT.read_text()))
    measured = (
        calibration if on == "calibration" else reference.mlp_inputs(reference.windows(EVALUATION_TEXT.read_text()))
    )
    rows = []
    for index in layers:
        mlp = reference.layers[index].mlp
        groups, norms = layer_groups(mlp, calibration[index], experts, seed=index)
        down = np.array(mlp.down_proj.weight)
        outputs = group_outputs(neuron_activations(mlp, measured[index]), down, groups)
        mean = (
            group_outputs(neuron_activations(mlp, calibration[index]), down, groups).mean(axis=0) if compensate else 0
        )
        dense = outputs.sum(axis=1)
        row = {"layer": index}
        for router in routers:
            scorer = _scorer(router, calibration[index], norms, index)
            inputs = mx.array(measured[index])
            scores = np.linalg.norm(outputs, axis=-1) if scorer is None else np.array(scorer(inputs))
            kept = np.zeros_like(scores)
            np.put_along_axis(kept, np.argsort(-scores, axis=1)[:, :k], 1.0, axis=1)
            routed = (outputs * kept[..., None]).sum(axis=1)
            variants = {router: routed, f"{router}+mean": routed + ((1 - kept)[..., None] * mean).sum(axis=1)}
            for name, value in list(variants.items())[: 2 if compensate else 1]:
                row[name] = float(np.mean(np.linalg.norm(dense - value, axis=-1) / np.linalg.norm(dense, axis=-1)))
        say(
            "  ".join(
                f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}" for key, value in row.items()
            )
        )
        rows.append(row)
    return rows


def checkpoint_perplexity(dense_dir: Path, checkpoint: Path, ks: list[int], say=print) -> dict:
    """Perplexity of a built llama_moe checkpoint at each k (its experts' weights as stored, computed in
    float32), beside the dense model's: the study's figures checked on the model itself."""
    from mlx_lm.utils import load_model

    from nightshift.engine.models import get_classes
    from nightshift.engine.store.moefy import dequantize_float32

    reference = DenseReference(dense_dir)
    windows = reference.windows(EVALUATION_TEXT.read_text())
    dense = perplexity(reference.model, windows)
    model, config = load_model(checkpoint, get_model_classes=get_classes)
    dequantize_float32(model)
    rows = []
    for k in ks:
        for layer in model.model.layers:
            layer.mlp.num_experts_per_tok = k
        value = perplexity(model, windows)
        rows.append({"experts": config["num_experts"], "router": "checkpoint", "k": k, "perplexity": value,
                     "vs_dense": value / dense - 1})  # fmt: skip
        say(
            f"{checkpoint.name}: k {k:3d} of {config['num_experts']}  perplexity {value:10.3f}  ({value / dense - 1:+.1%})"
        )
    return {"dense": dense, "neurons": config["intermediate_size"], "evaluation_tokens": sum(w.shape[1] for w in windows),
            "rows": rows}  # fmt: skip


def markdown_table(results: dict) -> str:
    """One row per (experts, router): perplexity and its change from dense at each k."""
    lines = [
        f"dense perplexity: {results['dense']:.2f} ({results['evaluation_tokens']} tokens)",
        "",
        "| experts x neurons | router | k: perplexity (vs dense) |",
        "|---|---|---|",
    ]
    cells: dict[tuple[int, str], list[str]] = {}
    for row in results["rows"]:
        cell = f"{row['k']}: {row['perplexity']:.2f} ({row['vs_dense']:+.0%})"
        cells.setdefault((row["experts"], row["router"]), []).append(cell)
    for (experts, router), row_cells in cells.items():
        lines.append(f"| {experts} x {results['neurons'] // experts} | {router} | {'; '.join(row_cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dense", type=Path, help="dense llama model directory (e.g. the default model's)")
    parser.add_argument("--experts", type=int, nargs="+", default=[16], help="expert counts to try")
    parser.add_argument("--routers", nargs="+", choices=ROUTERS, default=list(ROUTERS), help="routers to try")
    parser.add_argument("--fractions", type=float, nargs="+", help="fractions of each FFN to keep active")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--ffn-error", type=int, nargs=2, metavar=("EXPERTS", "K"),
        help="instead of perplexity, the routed FFN's output error per layer at this split (quick router comparison)",
    )  # fmt: skip
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 5, 10, 15, 20, 25, 29], help="for --ffn-error")
    parser.add_argument(
        "--compensate", action="store_true", help="for --ffn-error: also with skipped groups' mean outputs added"
    )
    parser.add_argument(
        "--on", choices=("evaluation", "calibration"), default="evaluation", help="for --ffn-error: the text measured"
    )
    parser.add_argument("--checkpoint", type=Path, help="instead, the perplexity of this built llama_moe model")
    parser.add_argument("--ks", type=int, nargs="+", help="with --checkpoint: the k values (default: its own)")
    args = parser.parse_args(argv)
    if args.checkpoint:
        ks = args.ks or [json.loads((args.checkpoint / "config.json").read_text())["num_experts_per_tok"]]
        results = checkpoint_perplexity(args.dense, args.checkpoint, ks)
        print(markdown_table(results))
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return
    if args.ffn_error:
        rows = ffn_errors(args.dense, *args.ffn_error, args.routers, args.layers, args.compensate, args.on)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return
    results = study(args.dense, args.experts, args.routers, args.fractions)
    print(markdown_table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
