"""A process's share of a store when one model runs over several processes (engine/distributed).

`moe.load.load_streaming` opens a store through a share: which trunk tensors to keep, which experts the
manifest lists for this process, and how the built model is cut. `distributed.stage.PipelineStage` (a range
of layers) and `distributed.experts.ExpertShare` (every layer, some experts) are the two shapes; the engine
below them knows only this contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import mlx.nn as nn

    from nightshift.engine.store.manifest import Manifest


class StoreShare(Protocol):
    """What one process of a model spread over several holds of its store."""

    def keeps(self, tensor: str) -> bool:
        """Whether the trunk tensor named `tensor` is loaded in this process."""
        ...

    def manifest(self, manifest: Manifest) -> Manifest:
        """The store as this process sees it: only the experts (and drives) it reads."""
        ...

    def apply(self, model: nn.Module) -> None:
        """Cut the freshly built `model` to this process's part (before its weights are loaded)."""
        ...
