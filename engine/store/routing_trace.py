"""Routing traces: which experts a trained MoE model picks for every token of a text, layer by layer.

Recorded from a MoEfied llama (`llama_moe`, docs/moefication.md) reading texts whole (teacher forcing:
the routing of each token of the text as written, prompt and answer alike), and replayed by bench models
(engine/models/kimi_k3_replay.py) so that the drives see a trained network's locality at any size.

File format (`.npz`, numpy; `save` / `load`), for S sequences of T_s tokens each, N = sum T_s, over the
model's L MoE layers with E experts and k chosen per token:

- `tokens` (N,) int32: the token ids (the recorded model's tokenizer), sequences one after another;
- `offsets` (S + 1,) int64: sequence s is rows offsets[s]:offsets[s+1] of every per-token array;
- `prompt_tokens` (S,) int32: how many of a sequence's tokens were its prompt (the rest, its answer);
- `chosen` (N, L, k) int16: each token's experts per layer, highest router score first;
- `guessed` (N, L, k) int16: the next-layer guess for that layer, most confident first: layer l's router
  applied to layer l-1's MoE input (what nightshift's predictor does, engine/moe/prefetch.py);
- `guessed_next_norm`, `guessed_after` (N, L, k) int16: two other guesses, for comparison: layer l's
  router on layer l's own norm of the residual after layer l-1's attention (`next_norm`), and after
  layer l-1 whole (`after`: known later, once l-1's experts have run); for layer 0 all three guesses
  are its router on its own norm of the embeddings;
- `meta`: a JSON string: {"experts": E, "k": k, "model": ..., "names": [S sequence names], ...}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nightshift.engine.errors import ModelFormatError, NightshiftError

GUESSES = ("guessed", "guessed_next_norm", "guessed_after")


@dataclass
class RoutingTrace:
    """Per-token routing of S sequences through a model's MoE layers (see the module docstring)."""

    experts: int
    k: int
    tokens: np.ndarray
    offsets: np.ndarray
    prompt_tokens: np.ndarray
    chosen: np.ndarray
    guesses: dict[str, np.ndarray]
    meta: dict = field(default_factory=dict)

    @property
    def sequences(self) -> int:
        return len(self.offsets) - 1

    @property
    def layers(self) -> int:
        return self.chosen.shape[1]

    @property
    def lengths(self) -> list[int]:
        return np.diff(self.offsets).tolist()

    def rows(self, sequence: int) -> slice:
        return slice(int(self.offsets[sequence]), int(self.offsets[sequence + 1]))

    def names(self) -> list[str]:
        return self.meta.get("names", [f"sequence {s}" for s in range(self.sequences)])


def save(trace: RoutingTrace, path: Path) -> Path:
    """Write `trace` to `path` (.npz), written aside and renamed so no half file is left."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial.npz")
    meta = {**trace.meta, "experts": trace.experts, "k": trace.k}
    np.savez_compressed(
        partial, tokens=trace.tokens.astype(np.int32), offsets=trace.offsets.astype(np.int64),
        prompt_tokens=trace.prompt_tokens.astype(np.int32), chosen=trace.chosen.astype(np.int16),
        **{name: guess.astype(np.int16) for name, guess in trace.guesses.items()}, meta=np.array(json.dumps(meta)),
    )  # fmt: skip
    partial.rename(path)
    return path


def load(path: Path) -> RoutingTrace:
    """Read a trace written by `save`; a clear error when `path` is not one."""
    try:
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
            parts = {name: data[name] for name in data.files}
    except (OSError, ValueError, KeyError) as exc:
        raise ModelFormatError(f"{path} is not a routing trace (.npz written by nightshift): {exc}") from exc
    if parts["chosen"].ndim != 3 or parts["offsets"][-1] != parts["chosen"].shape[0]:
        raise ModelFormatError(f"{path}: its routing arrays do not match its sequence offsets")
    return RoutingTrace(
        meta["experts"], meta["k"], parts["tokens"], parts["offsets"], parts["prompt_tokens"], parts["chosen"],
        {name: parts[name] for name in GUESSES if name in parts}, meta,
    )  # fmt: skip


class _Tap(nn.Module):
    """Wraps a module; keeps each input it is called with."""

    def __init__(self, inner: nn.Module, sink: list):
        super().__init__()
        self.inner = inner
        self.sink = sink

    def __call__(self, x: mx.array, *args, **kwargs) -> mx.array:
        self.sink.append(x)
        return self.inner(x, *args, **kwargs)


def _top(scores: mx.array, k: int) -> np.ndarray:
    """(T, k) the k highest-scoring experts of each row, highest first."""
    return np.array(mx.argsort(-scores, axis=-1)[:, :k]).astype(np.int16)


def record_sequence(model: nn.Module, tokens: list[int], k: int) -> dict[str, np.ndarray]:
    """The routing of one token sequence through a llama_moe `model` (mlx-lm's llama with `mlp.router`).

    One forward pass over the whole sequence (causal, no cache), as a prompt is read. Returns `chosen` and
    the guesses, each (T, L, k). The model's top-k picks the same set as `chosen` (its argpartition takes
    the k highest; only an exact tie of scores could differ).
    """
    layers = model.model.layers
    mid: list[list] = [[] for _ in layers]  # residual after attention (post_attention_layernorm's input)
    entering: list[list] = [[] for _ in layers]  # residual entering the layer (input_layernorm's input)
    originals = [(layer.input_layernorm, layer.post_attention_layernorm) for layer in layers]
    for layer, before, after in zip(layers, entering, mid):
        layer.input_layernorm = _Tap(layer.input_layernorm, before)
        layer.post_attention_layernorm = _Tap(layer.post_attention_layernorm, after)
    try:
        hidden = model.model(mx.array(tokens)[None])
        mx.eval(hidden, [sink for sink in mid], [sink for sink in entering])
    finally:
        for layer, (before, after) in zip(layers, originals):
            layer.input_layernorm, layer.post_attention_layernorm = before, after
    out = {name: [] for name in ("chosen", *GUESSES)}
    moe_input = None  # the previous layer's MoE input
    for index, layer in enumerate(layers):
        norm, router = layer.post_attention_layernorm, layer.mlp.router
        x = norm(mid[index][0][0])
        out["chosen"].append(_top(router(x), k))
        own = router(norm(entering[index][0][0]))  # layer l's router on its own norm of the residual entering l
        if moe_input is None:
            for name in GUESSES:
                out[name].append(_top(own, k))
        else:
            out["guessed"].append(_top(router(moe_input), k))
            out["guessed_next_norm"].append(_top(router(norm(mid[index - 1][0][0])), k))
            out["guessed_after"].append(_top(own, k))
        moe_input = x
    return {name: np.stack(parts, axis=1) for name, parts in out.items()}


def record(
    model: nn.Module, sequences: list[tuple[str, list[int], int]], meta: dict, k: int | None = None
) -> RoutingTrace:
    """A trace of `sequences` (name, tokens, prompt tokens) through a loaded llama_moe `model`.

    `k`: experts recorded per token (default: the model's own k). The model runs as it is set: with more
    experts active than `k` (all of them: the dense FFN), the trace is what the routers pick on that stream.
    """
    experts, k = model.args.num_experts, k or model.args.num_experts_per_tok
    parts = [record_sequence(model, tokens, k) for _, tokens, _ in sequences]
    lengths = [len(tokens) for _, tokens, _ in sequences]
    return RoutingTrace(
        experts, k, np.concatenate([np.array(tokens, np.int32) for _, tokens, _ in sequences]),
        np.concatenate([[0], np.cumsum(lengths)]), np.array([p for _, _, p in sequences], np.int32),
        np.concatenate([p["chosen"] for p in parts]),
        {name: np.concatenate([p[name] for p in parts]) for name in GUESSES},
        {**meta, "names": [name for name, _, _ in sequences]},
    )  # fmt: skip


@dataclass(frozen=True)
class Scaled:
    """A trace mapped onto a model of `experts` experts and `layers` MoE layers (see `scale`)."""

    chosen: np.ndarray  # (N, layers, k x factor)
    guessed: np.ndarray  # (N, layers, k x factor)
    offsets: np.ndarray
    source_layers: list[int]  # the trace layer each model layer replays
    factor: int  # model experts per trace expert


def layer_map(trace_layers: int, layers: int) -> list[int]:
    """Which trace layer each of `layers` model layers replays: consecutive layers, centred in the trace (so
    that each layer's next-layer guess is the trained model's own), wrapping round when the model has more."""
    first = max(0, (trace_layers - layers) // 2)
    return [(first + j) % trace_layers for j in range(layers)]


def scale(trace: RoutingTrace, experts: int, layers: int) -> Scaled:
    """The trace's routing for a model with `experts` experts per layer and `layers` MoE layers.

    Experts: `experts` must be a multiple m of the trace's E; trace expert e becomes model experts
    e*m .. e*m+m-1 (a trained expert split m ways, every part taken together), so k becomes k*m and
    every set's overlap with every other (the locality) is the trace's. Layers: `layer_map`.
    """
    if experts % trace.experts:
        raise NightshiftError(
            f"a model of {experts} experts per layer cannot replay a trace of {trace.experts}: give a multiple of "
            f"{trace.experts} (each recorded expert becomes that many)"
        )
    factor = experts // trace.experts
    source = layer_map(trace.layers, layers)

    def spread(ids: np.ndarray) -> np.ndarray:
        wide = ids[:, source, :, None].astype(np.int32) * factor + np.arange(factor)
        return wide.reshape(*wide.shape[:2], -1)

    return Scaled(spread(trace.chosen), spread(trace.guesses["guessed"]), trace.offsets, source, factor)


def padded(values: np.ndarray, offsets: np.ndarray, layer: int) -> np.ndarray:
    """(S, longest, width) table of one layer's per-token rows, shorter sequences padded with zeros (never
    replayed: a replay wraps round at its sequence's length)."""
    lengths = np.diff(offsets)
    table = np.zeros((len(lengths), int(lengths.max()), values.shape[-1]), dtype=values.dtype)
    for s, (start, length) in enumerate(zip(offsets[:-1], lengths)):
        table[s, :length] = values[start : start + length, layer]
    return table
