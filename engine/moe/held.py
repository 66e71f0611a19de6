"""What an expert takes in RAM once read: what the expert cache, its budget and its simulators count.

The cache holds an expert's tensors as one row of a slab (engine/moe/slab.py), copied out of the 4 KiB-aligned
read buffer, so neither the file's padding nor an MLX array per tensor is kept: its tensors' bytes. Counting
the file instead (18.5 % over the tensors' bytes on moe128-mixtral's bf16 experts, 58 % on its 4-bit copy) left 11 %
and 26 % of the budget unused (docs/results.md, "The expert cache counts what it holds"); held as arrays of their
own, the experts took ~0.7 KB more a tensor (9 an expert on the 4-bit copy).
"""

from __future__ import annotations

from collections.abc import Iterable

from nightshift.engine.store.manifest import Manifest, MoeLayer


def held_bytes(layer: MoeLayer) -> int:
    """What one expert of `layer` holds in RAM once read: its tensors' bytes (a row of a slab)."""
    return sum(slot.nbytes for slot in layer.tensors)


def held_sizes(layers: Iterable[MoeLayer]) -> dict[int, int]:
    """`held_bytes` of one expert per layer: the sizes the cache and its simulators count."""
    return {layer.layer: held_bytes(layer) for layer in layers}


def held_expert_bytes(manifest: Manifest) -> int:
    """Every expert of the store held in RAM, one copy: the cache budget that holds them all."""
    return sum(held_bytes(layer) * layer.num_experts for layer in manifest.layers)
