"""Load a store with every expert read into RAM.

The simple path: trunk from `trunk.safetensors`, each layer's experts read from
the first replica that is present and intact (size and checksum), stacked back
into the layout mlx-lm's `SwitchGLU` expects. The streaming engine replaces the
expert half of this; the trunk half stays.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nightshift.engine.errors import ModelFormatError
from nightshift.engine.store.drafter import drop_routed_experts, routed_dropped
from nightshift.engine.store.families import build_model, quantize_as_stored
from nightshift.engine.store.head import hold_wide_heads
from nightshift.engine.store.manifest import Manifest, MoeLayer, read_manifest, sha256_bytes
from nightshift.engine.store.safetensors_io import DTYPES, read_header, read_tensor


def read_expert(manifest: Manifest, layer: int, expert: int) -> bytes:
    """The bytes of one expert file from its first good replica; errors name every bad file."""
    size = manifest.layer(layer).file_bytes
    expected = manifest.experts[layer][expert]["sha256"]
    problems = []
    for drive, path in manifest.replica_paths(layer, expert):
        try:
            data = path.read_bytes()
        except OSError as exc:
            problems.append(f"{path} (drive {drive}): {exc.strerror or exc}")
            continue
        if len(data) != size:
            problems.append(f"{path} (drive {drive}): {len(data)} bytes, expected {size}")
        elif sha256_bytes(data) != expected:
            problems.append(f"{path} (drive {drive}): checksum mismatch")
        else:
            return data
    raise ModelFormatError(
        f"expert {expert} of layer {layer} has no good replica: {'; '.join(problems)}; "
        "run `nightshift model verify` and import the model again if no replica is intact"
    )


def layer_experts(manifest: Manifest, layer: MoeLayer) -> dict[str, mx.array]:
    """All experts of one layer, stacked per tensor: name -> array of shape (experts, *shape)."""
    stacks = {slot.name: np.empty((layer.num_experts, slot.nbytes), dtype=np.uint8) for slot in layer.tensors}
    for expert in range(layer.num_experts):
        data = np.frombuffer(read_expert(manifest, layer.layer, expert), dtype=np.uint8)
        for slot in layer.tensors:
            stacks[slot.name][expert] = data[slot.offset : slot.offset + slot.nbytes]
    out = {}
    for slot in layer.tensors:
        dtype, itemsize = DTYPES[slot.dtype]
        raw = stacks.pop(slot.name).view(np.dtype(f"<u{itemsize}")).reshape(layer.num_experts, *slot.shape)
        out[f"{layer.module}.{slot.name}"] = mx.array(raw).view(dtype)
    return out


def load_store(store: Path) -> tuple[nn.Module, dict]:
    """The model of the store at `store`, every expert in RAM, and its config."""
    store = Path(store)
    manifest = read_manifest(store)
    trunk_path = store / manifest.trunk["file"]
    if not trunk_path.is_file():
        raise ModelFormatError(f"{trunk_path} is missing; import the model again")
    weights = {entry.name: read_tensor(entry) for entry in read_header(trunk_path)}
    for layer in manifest.layers:
        weights.update(layer_experts(manifest, layer))
    model = build_model(manifest.config)
    if routed_dropped(manifest.source):
        drop_routed_experts(model)
    quantize_as_stored(model, weights)
    model.eval()
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelFormatError(f"the store at {store} does not match its model: {exc}") from exc
    mx.eval(model.parameters())
    hold_wide_heads(model, manifest.config)
    return model, manifest.config
