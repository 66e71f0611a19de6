"""One rank of a pipeline: which layers it runs, which trunk tensors and experts it keeps.

The split follows mlx-lm's pipeline convention (`PipelineMixin.pipeline`, also used by `sharded_load`):
rank 0 runs the *last* layers and rank size-1 the first; activations go from rank r+1 to rank r with
`mx.distributed.send`/`recv`, and every rank ends a forward pass with an `all_gather` of the last hidden
state, so every rank computes the same logits and samples the same token. The family's own
`model.model.pipeline(group[, split])` cuts the layers; nothing here re-implements the transport.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from nightshift.engine.distributed.hosts import PipelineError
from nightshift.engine.store.families import build_model
from nightshift.engine.store.manifest import Manifest

LAYER_NUMBER = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # mlx-lm's sharded_load matches tensors to layers so


def even_split(layers: int, ranks: int) -> list[int]:
    """Layers per rank as mlx-lm splits them when no split is given: even, the low ranks get the extra ones."""
    base, extra = divmod(layers, ranks)
    return [base + (1 if r < extra else 0) for r in range(ranks)]


def layer_ranges(split: list[int]) -> list[tuple[int, int]]:
    """(start, end) per rank for `split` (layers per rank): rank r runs the layers after ranks r+1 ... size-1."""
    return [(sum(split[r + 1 :]), sum(split[r + 1 :]) + split[r]) for r in range(len(split))]


def takes_split(model: nn.Module) -> bool:
    """Whether the family's pipeline accepts an uneven split (mlx-lm's PipelineMixin does; kimi_k3's does not)."""
    return "split" in inspect.signature(pipelined(model).pipeline).parameters


def pipelined(model: nn.Module) -> nn.Module:
    """The inner model that holds the layers and the family's `pipeline` method (mlx-lm: `model.model`)."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "pipeline"):
        raise PipelineError(
            f"{type(model).__module__} has no pipeline in mlx-lm, so its layers cannot be spread over hosts; "
            "run it on one host"
        )
    return inner


@dataclass(frozen=True)
class PipelineStage:
    """This process's share of a pipeline: rank `rank` of `split` (layers per rank, mlx-lm's order)."""

    group: mx.distributed.Group
    split: tuple[int, ...]

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def layers(self) -> tuple[int, int]:
        """(start, end) of the layers this rank runs."""
        return layer_ranges(list(self.split))[self.rank]

    def keeps(self, tensor: str) -> bool:
        """Whether a trunk tensor belongs to this rank: its own layers' and every unnumbered one (embeddings,
        final norm, head: every rank computes the logits)."""
        match = LAYER_NUMBER.search(tensor)
        start, end = self.layers
        return match is None or start <= int(match.group(1)) < end

    def manifest(self, manifest: Manifest) -> Manifest:
        """The store as this rank sees it: its layers' experts only, on the drives that hold them."""
        start, end = self.layers
        layers = [layer for layer in manifest.layers if start <= layer.layer < end]
        if not layers:
            raise PipelineError(
                f"rank {self.rank} runs layers {start}-{end - 1}, which have no routed experts; "
                "give every host at least one MoE layer (fewer hosts, or another split)"
            )
        experts = {layer.layer: manifest.experts[layer.layer] for layer in layers}
        used = {d for per_layer in experts.values() for e in per_layer for d in e["replicas"]}
        return dataclasses.replace(
            manifest,
            layers=layers,
            experts=experts,
            drives={name: root for name, root in manifest.drives.items() if name in used},
            routing={k: v for k, v in manifest.routing.items() if int(k) in experts},
        )

    def apply(self, model: nn.Module) -> None:
        """Cut `model` to this rank's layers with the family's own pipeline."""
        inner = pipelined(model)
        total = len(inner.layers)
        if sum(self.split) != total or len(self.split) != self.group.size():
            raise PipelineError(
                f"split {list(self.split)} does not cover the model's {total} layers over {self.group.size()} ranks"
            )
        if takes_split(model):
            inner.pipeline(self.group, split=list(self.split))
        else:
            inner.pipeline(self.group)
        if (inner.start_idx, inner.end_idx) != self.layers:
            raise PipelineError(
                f"{type(model).__module__}'s pipeline in mlx-lm splits layers only its own way (rank {self.rank}: "
                f"layers {inner.start_idx}-{inner.end_idx - 1}), not {list(self.split)} per rank; "
                "place the store again with `nightshift model place --hosts`"
            )


@dataclass(frozen=True)
class RankOf:
    """A stand-in for a group of `size` ranks seen from `rank`: all a family's `pipeline` asks of a group."""

    at: int
    of: int

    def rank(self) -> int:
        return self.at

    def size(self) -> int:
        return self.of


def family_split(config: dict, ranks: int) -> list[int] | None:
    """Layers per rank as the family's own pipeline cuts them, or None when it takes any split (mlx-lm's
    PipelineMixin). Asked of fresh, lazy copies of the model: nothing is allocated."""
    if takes_split(build_model(config)):
        return None
    split = []
    for rank in range(ranks):
        inner = pipelined(build_model(config))
        inner.pipeline(RankOf(rank, ranks))
        split.append(inner.end_idx - inner.start_idx)
    return split
