"""Where a 16-bit model's greedy tokens part from a float32 reference of the same weights, and why.

bfloat16 keeps 8 bits, so a run in bfloat16 moves every router score from the float32 reference's by about a
bfloat16 rounding step (~1e-3 on sigmoid scores near 0.5). Where the reference's own k-th and (k+1)-th expert
scores are closer than that, the 16-bit run may take the other expert: a routing flip at a near-tie, after which
that token's hidden state differs by a whole expert's output, and so do later tokens' (through attention). The
final logits' top two can be as close. This module runs a model and its reference side by side on the same tokens
(teacher forcing), recording each MoE layer's router scores and chosen experts at every position, and can force
the reference's routing on the other model, to show that nothing but near-ties parts them. Used by
tests/test_float_experts.py and bench/routing_ties.py.

The routers read here are the sigmoid ones with a selection bias (`e_score_correction_bias`) of DeepSeek V3 and
MiniMax M2, the two families published with 16-bit experts; ROUTER_LOGITS says where each family's gate logits
come from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from bench.helpers.moe_families import PROMPT, write_checkpoint, write_fp8_checkpoint
from nightshift.engine.prefill import prefill

FORMS = ("fp8", "bf16")  # the two ways DeepSeek V3 and MiniMax M2 publish their experts

# family -> the gate logits of its MoE block for input x, as mlx-lm's model computes them (then sigmoid in float32
# plus the selection bias): DeepSeek V3's MoEGate multiplies in the activations' dtype; MiniMax's gate reads x in
# float32.
ROUTER_LOGITS: dict[str, Callable[[nn.Module, mx.array], mx.array]] = {
    "deepseek_v3": lambda block, x: x @ block.gate.weight.T,
    "minimax": lambda block, x: block.gate(x.astype(mx.float32)),
}
# Added to the forced experts' selection scores (sigmoid scores are below 1 and the bias is small): they win the top-k.
FORCE = 1e3


def write_float_experts(family: str, form: str, out: Path) -> Path:
    """A tiny `family` release checkpoint with 16-bit experts: `form` "fp8" (block-scaled e4m3, as DeepSeek V3 and
    MiniMax M2 publish) or "bf16"."""
    if form == "fp8":
        return write_fp8_checkpoint(family, out)
    return write_checkpoint(family, out, "release", dtype=mx.bfloat16)


def moe_blocks(model: nn.Module) -> dict[int, tuple[nn.Module, str]]:
    """layer index -> (the layer, the attribute naming its MoE block): the modules holding a `switch_mlp`."""
    found = {}
    for index, layer in enumerate(model.layers):
        for name, child in layer.children().items():
            if isinstance(child, nn.Module) and "switch_mlp" in child:
                found[index] = (layer, name)
    return found


def _bias_holder(block: nn.Module) -> nn.Module:
    """The module holding the router's selection bias: the gate (DeepSeek V3) or the block (MiniMax)."""
    return block.gate if "e_score_correction_bias" in block.gate else block


@dataclass
class Run:
    """One model's pass over PROMPT and then given tokens: per step, the log-probabilities its token is picked
    from; per MoE layer and position, the router's selection scores and the experts the layer took."""

    logprobs: np.ndarray  # (steps, vocab)
    scores: dict[int, np.ndarray]  # layer -> (positions, experts), float32
    chosen: dict[int, np.ndarray]  # layer -> (positions, k)

    @property
    def picks(self) -> list[int]:
        """The greedy token of each step."""
        return self.logprobs.argmax(-1).tolist()


class _Choices(nn.Module):
    """Wraps a block's `switch_mlp`; keeps the experts it is called with."""

    def __init__(self, inner: nn.Module, sink: list):
        super().__init__()
        self.inner = inner
        self.sink = sink

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        self.sink.append(indices)
        return self.inner(x, indices)


class _Router(nn.Module):
    """Wraps a MoE block; keeps its router's selection scores per call and, with `forced` (experts per position),
    makes the block take those experts (their selection scores raised by FORCE; the weights stay the model's)."""

    def __init__(self, inner: nn.Module, family: str, sink: list, forced: np.ndarray | None):
        super().__init__()
        self.inner = inner
        self.family = family
        self.sink = sink
        self.forced = forced
        self.position = 0

    def __call__(self, x: mx.array) -> mx.array:
        holder = _bias_holder(self.inner)
        bias = holder["e_score_correction_bias"]
        self.sink.append(mx.sigmoid(ROUTER_LOGITS[self.family](self.inner, x).astype(mx.float32)) + bias)
        rows = x.shape[1]
        if self.forced is None:
            return self.inner(x)
        boost = np.zeros((rows, bias.shape[-1]), np.float32)
        np.put_along_axis(boost, self.forced[self.position : self.position + rows], FORCE, axis=-1)
        self.position += rows
        holder["e_score_correction_bias"] = bias.astype(mx.float32) + mx.array(boost)
        try:
            return self.inner(x)
        finally:
            holder["e_score_correction_bias"] = bias


@contextmanager
def _tapped(model: nn.Module, family: str, forced: dict[int, np.ndarray] | None) -> Iterator[tuple[dict, dict]]:
    """`model` with every MoE block and its switch_mlp wrapped (restored after): (scores, chosen) sinks by layer."""
    scores: dict[int, list] = {}
    chosen: dict[int, list] = {}
    blocks = moe_blocks(model)
    for index, (layer, name) in blocks.items():
        block = layer[name]
        scores[index], chosen[index] = [], []
        block.switch_mlp = _Choices(block.switch_mlp, chosen[index])
        setattr(layer, name, _Router(block, family, scores[index], None if forced is None else forced[index]))
    try:
        yield scores, chosen
    finally:
        for layer, name in blocks.values():
            block = layer[name].inner
            setattr(layer, name, block)
            block.switch_mlp = block.switch_mlp.inner


def teacher_forced(
    model: nn.Module, family: str, tokens: list[int], forced: dict[int, np.ndarray] | None = None
) -> Run:
    """`model` reads PROMPT as nightshift's prefill does, then `tokens[:-1]` one at a time as its decode loop does
    (whatever it would have picked): a Run of `len(tokens)` steps. `forced` (layer -> experts per position, e.g.
    another Run's `chosen`): each MoE layer takes those experts instead of its own top-k.

    Raises AssertionError where the scores recomputed by ROUTER_LOGITS do not pick what the model took (mlx-lm
    changed the family's router): the recorded scores would not be the model's."""
    with _tapped(model, family, forced) as (scores, chosen):
        cache = make_prompt_cache(model)
        logprobs = [prefill(model, PROMPT, cache)]
        for token in tokens[:-1]:
            logits = model(mx.array([[token]]), cache=cache)[:, -1, :]
            logprobs.append((logits - mx.logsumexp(logits, keepdims=True)).squeeze(0))
            mx.eval(logprobs[-1])
    run = Run(
        np.stack([np.array(step.astype(mx.float32)) for step in logprobs]),
        {layer: np.array(mx.concatenate(calls, axis=1)[0]) for layer, calls in scores.items()},
        {layer: np.array(mx.concatenate(calls, axis=1)[0]) for layer, calls in chosen.items()},
    )
    if forced is None:
        _check_recomputed(run)
    return run


def _check_recomputed(run: Run) -> None:
    for layer, scores in run.scores.items():
        k = run.chosen[layer].shape[-1]
        order = np.sort(scores, axis=-1)[:, ::-1]
        decided = order[:, k - 1] - order[:, k] > 1e-6  # an exact tie may fall either way
        top = np.sort(np.argsort(-scores, axis=-1)[:, :k], axis=-1)
        taken = np.sort(run.chosen[layer], axis=-1)
        if not (top == taken)[decided].all():
            raise AssertionError(f"layer {layer}: the recomputed router scores do not pick the experts it took")


@dataclass(frozen=True)
class Flip:
    """A position where two runs' routers took different experts, at the first layer that did."""

    position: int  # into PROMPT + the tokens
    layer: int
    reference: tuple[int, ...]  # the experts the reference took
    other: tuple[int, ...]
    gap: float  # the reference's k-th minus its (k+1)-th selection score
    shift: float  # the largest |difference| between the two runs' selection scores at this layer and position


def flips(reference: Run, other: Run) -> list[Flip]:
    """Every position where the two runs' expert sets differ, in order, each at its first such layer."""
    found = []
    for position in range(len(next(iter(reference.chosen.values())))):
        for layer in sorted(reference.chosen):
            want, got = reference.chosen[layer][position], other.chosen[layer][position]
            if set(want.tolist()) != set(got.tolist()):
                scores = reference.scores[layer][position]
                order = np.sort(scores)[::-1]
                shift = np.abs(other.scores[layer][position] - scores).max()
                k = len(want)
                found.append(
                    Flip(
                        position,
                        layer,
                        tuple(sorted(want.tolist())),
                        tuple(sorted(got.tolist())),
                        float(order[k - 1] - order[k]),
                        float(shift),
                    )
                )
                break
    return found


def position_of(step: int) -> int:
    """The position whose logits pick step `step`'s token (PROMPT's last token picks step 0's)."""
    return len(PROMPT) - 1 + step


def final_gap(run: Run, step: int) -> float:
    """The run's top-two log-probability gap at `step`."""
    top = np.sort(run.logprobs[step])[::-1]
    return float(top[0] - top[1])


def logprob_shift(reference: Run, other: Run, step: int) -> float:
    """The largest |difference| between the two runs' log-probabilities at `step`."""
    return float(np.abs(other.logprobs[step] - reference.logprobs[step]).max())


def shift_before(reference: Run, other: Run, position: int) -> float:
    """The largest score shift between the two runs at any MoE layer over the positions before `position`."""
    return max(
        float(np.abs(other.scores[layer][:position] - s[:position]).max(initial=0.0))
        for layer, s in reference.scores.items()
    )


def routing_spread(reference: Run, other: Run) -> tuple[float, float]:
    """Over every MoE layer and position: the median of the reference's k-th to (k+1)-th score gap, and the median
    score shift between the two runs (what a near-tie is measured against)."""
    gaps, shifts = [], []
    for layer, scores in reference.scores.items():
        k = reference.chosen[layer].shape[-1]
        order = np.sort(scores, axis=-1)[:, ::-1]
        gaps.append(order[:, k - 1] - order[:, k])
        shifts.append(np.abs(other.scores[layer] - scores).max(-1))
    return float(np.median(np.concatenate(gaps))), float(np.median(np.concatenate(shifts)))
