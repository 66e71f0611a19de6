"""Kimi K3 whose routers replay recorded routing: a bench model with the locality of a trained network.

The synthetic bench model (engine/store/synth.py) has random routers, so its experts are picked like dice
and nothing can predict them: the worst case for a cache and for read-ahead. This family is mlx-lm's
Kimi K3 with one change: every MoE layer picks the experts that a trained model (the MoEfied default
model, docs/moefication.md) picked at the same position of a recorded text, scaled to this model's
expert count (engine/store/routing_trace.py records and scales them; `nightshift model synth --routing`
writes such a checkpoint). Attention, the shared expert and the routed experts are Kimi K3's, so the
experts stream through the store like any Kimi K3's; only which of them a token asks for is replayed.

The recorded routing travels in the checkpoint as the gates' tensors: `chosen` (sequences x positions x
k), each position's experts, and `guessed`, what the trained model's next-layer guess was there (layer
L's router applied to layer L-1's input, as the engine's predictor does). Each sequence being decoded
(a batch row) carries a `ReplayCursor` in its cache: which recorded sequence it replays and how many
tokens it has seen. A fresh cache takes the recorded sequences in turn, counted from the model's load
(`restart_replay` starts the count over); a copied cursor (a batch's shared prompt prefix copied for
each prompt) continues as the next sequence from the same position, so different prompts replay
different texts. Past a sequence's recorded length the replay starts that sequence over.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import kimi_k3
from mlx_lm.models.cache import ArraysCache

# Logit given to a position's guessed experts (most confident highest); every other expert gets 0.
GUESS_LOGIT = 1.0


@dataclass
class TextArgs(kimi_k3.TextArgs):
    # Lengths (tokens) of the recorded sequences; their count and longest size the gates' tensors.
    replay_lengths: list[int] = field(default_factory=lambda: [1])

    def __post_init__(self):
        super().__post_init__()
        if not self.replay_lengths or min(self.replay_lengths) < 1:
            raise ValueError(
                f"replay_lengths must name at least one sequence of a token or more: {self.replay_lengths}"
            )


@dataclass
class ModelArgs(kimi_k3.ModelArgs):
    model_type: str = "kimi_k3_replay"

    def __post_init__(self):
        if isinstance(self.text_config, dict):
            self.text_config = TextArgs.from_dict(self.text_config)


class ReplayClock:
    """Where each row of the current forward pass is: its recorded sequence and its positions in it.

    Set by the model before its layers run and read by every gate; not a module (it holds no weights).
    """

    def __init__(self, lengths: list[int]):
        self.lengths = mx.array(lengths, dtype=mx.int32)
        self.longest = max(lengths)
        self.rows: mx.array | None = None  # (B, L): row index into a gate's (sequences x positions) table

    def set(self, sequences: mx.array, start: mx.array, length: int) -> None:
        """Rows replay `sequences` (B,) from positions `start` (B,) for `length` tokens (wrapping each sequence)."""
        positions = (start[:, None] + mx.arange(length)[None]) % self.lengths[sequences][:, None]
        self.rows = sequences[:, None] * self.longest + positions


class ReplayRouter(nn.Linear):
    """A Kimi K3 gate whose choices are recorded ones.

    It keeps the gate's weight, so the checkpoint has the family's tensors and the engine's next-layer
    predictor finds it as it finds any router (a Linear with one row per expert); its output is the
    replay's. Called as a router (by that predictor, on the previous layer's input) it returns the
    trained model's guess at this position; the block takes its own experts from `choose`.
    """

    def __init__(self, hidden: int, experts: int, k: int, sequences: int, longest: int, clock: ReplayClock):
        super().__init__(hidden, experts, bias=False)
        dtype = mx.uint8 if experts <= 256 else mx.uint16
        self.chosen = mx.zeros((sequences, longest, k), dtype=dtype)
        self.guessed = mx.zeros((sequences, longest, k), dtype=dtype)
        object.__setattr__(self, "clock", clock)  # shared by every gate; not a child module

    def _at(self, table: mx.array) -> mx.array:
        rows = self.clock.rows
        flat = table.reshape(-1, table.shape[-1])
        return flat[rows.reshape(-1)].reshape(*rows.shape, table.shape[-1]).astype(mx.uint32)

    def choose(self) -> mx.array:
        """(B, L, k) experts the recorded model chose at each row's positions, highest score first."""
        return self._at(self.chosen)

    def __call__(self, x: mx.array) -> mx.array:
        guess = self._at(self.guessed)
        k = guess.shape[-1]
        ranks = mx.broadcast_to(GUESS_LOGIT * (k - mx.arange(k, dtype=mx.float32)) / k, guess.shape)
        logits = mx.zeros((*guess.shape[:-1], self.weight.shape[0]), dtype=mx.float32)
        return mx.put_along_axis(logits, guess, ranks, axis=-1).reshape(*x.shape[:-1], -1)


class ReplayMoE(kimi_k3.KimiK3SparseMoE):
    """Kimi K3's MoE block with the replayed experts, each weighted 1/k (Kimi renormalizes its top-k)."""

    def __init__(self, args: TextArgs, clock: ReplayClock):
        super().__init__(args)
        lengths = args.replay_lengths
        self.gate = ReplayRouter(
            args.hidden_size, args.num_experts, args.num_experts_per_token, len(lengths), max(lengths), clock
        )

    def __call__(self, x: mx.array) -> mx.array:
        inds = self.gate.choose()
        weights = mx.full(inds.shape, self.args.routed_scaling_factor / inds.shape[-1], dtype=x.dtype)
        y = self.switch_mlp(x, inds)
        y = (y * weights[..., None]).sum(axis=-2)
        return y + self.shared_experts(x) if self.shared_experts is not None else y


class ReplayCursor(ArraysCache):
    """A cache entry per sequence: [recorded sequence (B,), tokens seen (B,)]; batches merge and filter it."""

    def __init__(self, size: int = 2, left_padding: list[int] | None = None):
        super().__init__(size, left_padding)

    def __deepcopy__(self, memo: dict) -> ReplayCursor:
        """A copy continues as the next recorded sequence from the same position (see the module docstring)."""
        twin = ReplayCursor()
        twin.cache = [None, copy.deepcopy(self.cache[1], memo)]
        return twin


class Model(kimi_k3.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        text = args.text_config
        self.clock = ReplayClock(text.replay_lengths)
        self.next_sequence = 0
        for layer in self.language_model.model.layers:
            if isinstance(layer.mlp, kimi_k3.KimiK3SparseMoE):
                layer.mlp = ReplayMoE(text, self.clock)

    def restart_replay(self, first: int = 0) -> None:
        """The next fresh sequence replays recorded sequence `first` (then the ones after it, in turn)."""
        self.next_sequence = first

    def _take(self, rows: int) -> mx.array:
        count = self.clock.lengths.size
        taken = [(self.next_sequence + i) % count for i in range(rows)]
        self.next_sequence = (self.next_sequence + rows) % count
        return mx.array(taken, dtype=mx.int32)

    def __call__(self, inputs: mx.array, cache: list | None = None) -> mx.array:
        rows, length = inputs.shape
        if cache is None:  # a pass without a cache: row b replays sequence b from its start
            self.clock.set(mx.arange(rows, dtype=mx.int32) % self.clock.lengths.size, mx.zeros(rows, mx.int32), length)
            return self.language_model(inputs, None)
        cursor = cache[-1]
        if cursor[0] is None:
            cursor[0] = self._take(rows)
        if cursor[1] is None:
            cursor[1] = mx.zeros(rows, dtype=mx.int32)
        self.clock.set(cursor[0], cursor[1], length)
        cursor[1] = cursor[1] + length
        return self.language_model(inputs, cache[:-1])

    def make_cache(self) -> list:
        return [*self.language_model.make_cache(), ReplayCursor()]

    @property
    def quant_predicate(self):
        """Kimi K3's, but a replaying gate stays as written: quantizing would replace it by a plain Linear."""
        family = self.language_model.quant_predicate

        def predicate(path: str, module: nn.Module):
            return False if isinstance(module, ReplayRouter) else family(path, module)

        return predicate
