"""A llama whose feed-forward layers are split into routed experts (a MoEfied dense llama).

Each layer's SwiGLU neurons are partitioned into `num_experts` groups; expert e
holds the rows of gate/up and the columns of down of its group. A router scores
the groups for each token, the top `num_experts_per_tok` run, and their outputs
are added with weight 1, so with every expert active the layer computes exactly
the dense FFN (see engine/store/moefy.py, which builds these checkpoints).

Attention, norms and embeddings are mlx-lm's llama; the experts are mlx-lm's
`SwitchGLU`, which is how the store importer and the streaming layer find them.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.switch_layers import SwitchGLU


@dataclass
class ModelArgs(llama.ModelArgs):
    num_experts: int = 16
    num_experts_per_tok: int = 16

    def __post_init__(self):
        super().__post_init__()
        if self.intermediate_size % self.num_experts:
            raise ValueError(
                f"intermediate_size {self.intermediate_size} does not split into {self.num_experts} equal experts"
            )
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok must be in 1..{self.num_experts}, got {self.num_experts_per_tok}")


class SparseMLP(nn.Module):
    """Router + experts: the top-k experts of each token, summed with weight 1."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.num_experts_per_tok = args.num_experts_per_tok
        self.router = nn.Linear(args.hidden_size, args.num_experts)
        self.switch_mlp = SwitchGLU(args.hidden_size, args.intermediate_size // args.num_experts, args.num_experts)

    def __call__(self, x: mx.array) -> mx.array:
        k = self.num_experts_per_tok
        scores = self.router(x)
        indices = mx.argpartition(-scores, kth=k - 1, axis=-1)[..., :k]
        return self.switch_mlp(x, indices).sum(axis=-2)


class TransformerBlock(llama.TransformerBlock):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.mlp = SparseMLP(args)


class LlamaMoeModel(llama.LlamaModel):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.layers = [TransformerBlock(args) for _ in range(args.num_hidden_layers)]


class Model(llama.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.model = LlamaMoeModel(args)
