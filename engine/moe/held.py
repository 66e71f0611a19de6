"""What an expert takes in RAM once read: what the expert cache, its budget and its simulators count.

The reader copies each tensor out of the 4 KiB-aligned read buffer (engine/moe/reads.py `decode`), so the file's
padding is not kept: a cached expert holds its tensors' bytes, and per tensor an MLX array and the allocation
around it. Counting the file instead (18.5 % over the tensors' bytes on moe128-mixtral's bf16 experts, 58 % on its
4-bit copy) left 11 % and 26 % of the budget unused (docs/results.md, "The expert cache counts what it holds").
"""

from __future__ import annotations

from collections.abc import Iterable

from nightshift.engine.store.manifest import Manifest, MoeLayer

# RSS per cached expert less its tensors' bytes, per tensor, measured on Linux (`bench.cache_held`): 781-821 B on
# moe128-mixtral's bf16 experts (3 tensors of 13.8 KB), 702-722 B on its 4-bit copy (9 of 2.3-9.2 KB).
TENSOR_OVERHEAD = 768


def held_bytes(layer: MoeLayer) -> int:
    """What one expert of `layer` holds in RAM once read: its tensors' bytes and each tensor's overhead."""
    return tensor_bytes(layer) + TENSOR_OVERHEAD * len(layer.tensors)


def tensor_bytes(layer: MoeLayer) -> int:
    """One expert of `layer`'s tensors' bytes: what MLX counts of it (its active memory)."""
    return sum(slot.nbytes for slot in layer.tensors)


def held_sizes(layers: Iterable[MoeLayer]) -> dict[int, int]:
    """`held_bytes` of one expert per layer: the sizes the cache and its simulators count."""
    return {layer.layer: held_bytes(layer) for layer in layers}


def held_expert_bytes(manifest: Manifest) -> int:
    """Every expert of the store held in RAM, one copy: the cache budget that holds them all."""
    return sum(held_bytes(layer) * layer.num_experts for layer in manifest.layers)
