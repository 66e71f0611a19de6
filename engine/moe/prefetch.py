"""Next-layer prediction: layer L+1's router applied to layer L's hidden state.

The hidden state changes little from one layer to the next (the residual stream),
so the next router's top-k on it is a cheap guess at the experts L+1 will ask for;
the guess is read ahead while L computes. Recall (the share of experts a layer
needed that had been predicted) is counted per layer, so prefetch can be turned
off where it does not pay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

Router = Callable[[mx.array], mx.array]  # hidden state (..., D) -> expert logits (..., E)


def router_of(block: nn.Module, num_experts: int, input_dims: int) -> Router | None:
    """The router inside an MoE block: a child whose 2-D weight has one row per expert.

    A Linear (quantized or not) is called as is; a gate with its own call convention
    (e.g. DeepSeek's `MoEGate`) contributes its weight matrix only. None when no
    child fits or its input is not the switch's input (e.g. a latent projection sits between).
    """
    for child in block.children().values():
        if not isinstance(child, nn.Module) or "weight" not in child:
            continue
        weight = child["weight"]
        if weight.ndim != 2 or weight.shape[0] != num_experts:
            continue
        if isinstance(child, nn.QuantizedLinear):
            if weight.shape[1] * 32 // child.bits == input_dims:
                return child
        elif weight.shape[1] == input_dims:
            return child if isinstance(child, nn.Linear) else (lambda x, w=weight: x @ w.T)
    return None


def router_logits(router: Router, x: mx.array) -> mx.array:
    """`router(x)`, rows of float32 expert logits, queued (`async_eval`): computed while the caller goes on."""
    logits = router(x)
    logits = logits.reshape(-1, logits.shape[-1]).astype(mx.float32)
    mx.async_eval(logits)
    return logits


def top_experts(logits: mx.array, k: int) -> list[int]:
    """Union over rows of the top-k experts of `logits` (`router_logits`), most confident first (by best logit over
    rows)."""
    logits = np.array(logits)
    top = np.argpartition(-logits, k - 1, axis=-1)[:, :k]
    union = np.sort(top[0]) if len(top) == 1 else np.unique(top)  # one row (a decode step): no repeats to drop
    best = logits[:, union].max(axis=0)
    return union[np.argsort(-best, kind="stable")].tolist()


@dataclass
class Recall:
    """Per layer, over decode steps: experts needed, how many of them the guess had named, and how many of those
    had been read ahead (the caps read part of a guess)."""

    needed: int = 0
    predicted_hits: int = 0
    read_ahead_hits: int = 0

    @property
    def recall(self) -> float:
        return self.predicted_hits / self.needed if self.needed else 0.0
