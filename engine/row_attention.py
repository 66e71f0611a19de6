"""Attention one row at a time inside a many-row pass, so each row computes exactly as a decode step would.

A decoder layer is per-row everywhere except attention, and some attention computes one row by
another formula than many (mlx-lm's Kimi K3: MLA's absorbed projection when L == 1; delta attention's
recurrent step), which in bfloat16 moves logits by up to ~0.04 and can flip a near-tie. A speculative
verify (and the replay that rewinds a recurrent cache) runs its rows through attention one by one
under `attention_row_by_row`; the rest of the layer, the routed experts included, still sees all rows
at once, so each MoE layer still reads the union of the rows' experts once. Greedy output is then the
same as plain decoding's, whatever the model's dtype.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn

ATTENTION_NAMES = ("self_attn", "linear_attn", "attn")  # the attention child of a decoder layer, by family


class RowByRow(nn.Module):
    """Calls the wrapped attention once per row, with no mask, as a one-token decode step calls it."""

    def __init__(self, attention: nn.Module):
        super().__init__()
        object.__setattr__(self, "inner", attention)  # not a child: the wrapper adds no parameters

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None, *args, **kwargs) -> mx.array:
        if x.shape[1] == 1:
            return self.inner(x, mask, cache, *args, **kwargs)
        rows = [self.inner(x[:, i : i + 1], None, cache, *args, **kwargs) for i in range(x.shape[1])]
        return mx.concatenate(rows, axis=1)


def _attention_sites(model: nn.Module) -> list[tuple[nn.Module, str]]:
    return [
        (layer, name)
        for layer in model.layers
        if layer is not None
        for name in ATTENTION_NAMES
        if isinstance(layer.get(name), nn.Module)
    ]


@contextmanager
def attention_row_by_row(model: nn.Module) -> Iterator[None]:
    """Within the block, every decoder layer of `model` runs its attention one row at a time."""
    sites = _attention_sites(model)
    originals = [getattr(layer, name) for layer, name in sites]
    for (layer, name), attention in zip(sites, originals):
        setattr(layer, name, RowByRow(attention))
    try:
        yield
    finally:
        for (layer, name), attention in zip(sites, originals):
            setattr(layer, name, attention)
