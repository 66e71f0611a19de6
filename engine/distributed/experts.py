"""Expert parallelism, the other shape: every rank runs every layer and holds a share of each layer's experts.

Rank r of n owns the routed experts e with e % n == r, on its own drives. Every rank computes the same
attention and router (the same input, the whole trunk); at each MoE layer a rank computes the slots whose
expert it owns, leaves the others zero, and one `mx.distributed.all_sum` of the per-slot outputs gives
every rank all of them; the family's own block then weighs and sums the slots as in one process. Each
slot comes from exactly one rank and adds zeros elsewhere, so the sum is exact.

The stream of a rank knows only its experts (the others' entries are kept, without replicas, so expert
numbers stay the manifest's); guesses read ahead (prefetch, warm start) would name the other ranks'
experts, so they are off in this shape (`share_settings`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nightshift.engine.distributed.hosts import PipelineError
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.streaming import StreamingSwitch
from nightshift.engine.store.manifest import Manifest


def owner(expert: int, ranks: int) -> int:
    """The rank that holds `expert` (round robin: hot and cold experts spread over every rank)."""
    return expert % ranks


def share_settings(settings: StreamSettings) -> StreamSettings:
    """`settings` without the reads ahead that would name other ranks' experts."""
    return dataclasses.replace(settings, prefetch=False, prefill_prefetch=False, warm_start=False)


@dataclass(frozen=True)
class ExpertShare:
    """This process's share: every layer, the routed experts `owner` gives rank `group.rank()`."""

    group: mx.distributed.Group

    def keeps(self, tensor: str) -> bool:
        """Every trunk tensor: every rank runs every layer."""
        return True

    def manifest(self, manifest: Manifest) -> Manifest:
        """The store as this rank sees it: other ranks' experts listed without replicas, only its drives."""
        rank, size = self.group.rank(), self.group.size()
        experts = {
            layer: [e if owner(i, size) == rank else {**e, "replicas": []} for i, e in enumerate(per_layer)]
            for layer, per_layer in manifest.experts.items()
        }
        used = {d for per_layer in experts.values() for e in per_layer for d in e["replicas"]}
        if not used:
            raise PipelineError(f"rank {rank} owns no expert of this store; use fewer hosts")
        return dataclasses.replace(
            manifest, experts=experts, drives={name: root for name, root in manifest.drives.items() if name in used}
        )

    def apply(self, model: nn.Module) -> None:
        """Nothing to cut: the experts are shared out when the streaming layers are in place (`share`)."""

    def share(self, model: nn.Module) -> int:
        """Put every streaming expert layer of `model` behind a `SharedSwitch`; the number of layers."""
        sites = [(path, m) for path, m in model.named_modules() if isinstance(m, StreamingSwitch)]
        for path, switch in sites:
            parent_path, name = path.rsplit(".", 1)
            parent = model
            for part in parent_path.split("."):
                parent = parent[int(part)] if part.isdigit() else getattr(parent, part)
            setattr(parent, name, SharedSwitch(switch, self.group))
        return len(sites)


class SharedSwitch(nn.Module):
    """One layer's routed experts over the ranks: this rank's slots computed, all slots summed over ranks."""

    def __init__(self, inner: StreamingSwitch, group: mx.distributed.Group):
        super().__init__()
        object.__setattr__(self, "_inner", inner)  # not a child: its experts are no parameters
        object.__setattr__(self, "_group", group)

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        rank, size = self._group.rank(), self._group.size()
        k = indices.shape[-1]
        hidden = x.shape[-1]
        flat = np.array(indices.reshape(-1))  # the router's picks on the host (the stream reads them anyway)
        own = np.nonzero(flat % size == rank)[0]
        rows = x.reshape(-1, hidden)
        out = mx.zeros((flat.size, hidden), dtype=x.dtype)
        if own.size:
            picked = mx.array(own // k)
            mine = self._inner(rows[picked], mx.array(flat[own].reshape(-1, 1)).astype(indices.dtype))
            out[mx.array(own)] = mine.reshape(-1, hidden).astype(x.dtype)
        out = mx.distributed.all_sum(out, group=self._group, stream=mx.cpu)
        return out.reshape(*indices.shape, hidden)
