"""A tied output head's wider copy, made once at load and held, so no step makes it.

A family that ties its head to the token embedding (mlx-lm's `embed_tokens.as_linear(x)`) multiplies the
activations by the embedding's weight; where that is stored narrower than the activations (the Mixtral bench
export's bf16 embedding beside float32 norms) MLX promotes it, so every step casts the whole weight to a fresh
wider copy and frees it: 113 MB written and 56 MB read a token on moe128-mixtral. `hold_wide_heads` swaps such an
embedding for a `WideHead`: its lookup reads the stored weight as before (the first layer's input keeps its
dtype), and its `as_linear` multiplies a copy cast once at load. The cast is exact and the product the same GEMM
MLX's promotion runs, so the logits are mlx-lm's bit for bit (tests/test_wide_head.py).

Found from the model, not by family: an `nn.Embedding` of the config's vocabulary whose rows no other module's 2-D
weight outside the numbered layers has, so there is no output projection of its own and the head is the embedding
(another table, a longcat n-gram embedding say, is not a head). The activations' dtype is taken to be the model's
widest float parameter, as engine/moe/budget.py `trunk_bytes` takes it; where a step's activations turn out
narrower, `as_linear` multiplies the stored weight as mlx-lm does (the copy is then held for nothing).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from nightshift.engine.store.families import layer_of


class WideHead(nn.Embedding):
    """An embedding whose output projection multiplies a wider copy of its weight, held (not a parameter)."""

    def __init__(self, weight: mx.array, dtype: mx.Dtype):
        nn.Module.__init__(self)  # not nn.Embedding's: it draws a random weight of the vocabulary's size
        self.weight = weight
        self._wide_t = weight.T.astype(dtype)  # as MLX's promotion casts it: the transposed view, then the GEMM
        mx.eval(self._wide_t)

    def as_linear(self, x: mx.array) -> mx.array:
        if mx.result_type(x.dtype, self.weight.dtype) != self._wide_t.dtype:
            return super().as_linear(x)
        return x @ self._wide_t


def activation_dtype(model: nn.Module) -> mx.Dtype | None:
    """The model's widest float parameter's dtype (None where it holds no float)."""
    floats = [v.dtype for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)]
    return max(floats, key=lambda dtype: dtype.size, default=None)


def vocab_size(config: dict) -> int:
    """The vocabulary of a model's `config` (its text model's for a multimodal one; 0 where it names none)."""
    return int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size", 0))


def tied_embeddings(model: nn.Module, vocab: int) -> list[tuple[str, nn.Embedding]]:
    """The float embeddings of `model` of `vocab` rows that are its output head: no module outside the numbered
    layers (an output projection never sits in one) but an embedding has a 2-D weight of as many rows."""
    modules = model.named_modules()
    projected = any(
        not isinstance(m, (nn.Embedding, nn.QuantizedEmbedding))
        and layer_of(path + ".") is None
        and "weight" in m
        and m["weight"].ndim == 2
        and m["weight"].shape[0] == vocab
        for path, m in modules
    )
    return [] if projected else [(p, m) for p, m in modules if type(m) is nn.Embedding and m.weight.shape[0] == vocab]


def hold_wide_heads(model: nn.Module, config: dict) -> None:
    """Swap each tied embedding narrower than the activations for a `WideHead` (call once its weights are loaded)."""
    dtype = activation_dtype(model)
    wide = [
        (path, WideHead(m.weight, dtype))
        for path, m in tied_embeddings(model, vocab_size(config))
        if dtype is not None and m.weight.dtype.size < dtype.size
    ]
    if wide:
        model.update_modules(tree_unflatten(wide))
