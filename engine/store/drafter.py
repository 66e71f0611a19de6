"""A drafter cut from a store: its embedding, first decoder layers (or all of them), final norm and head.

Speculative decoding needs a small resident model that shares the target's tokenizer. For a
store with no smaller sibling (a synthetic bench model) the drafter is cut from the target:
- `layers=N`: a store whose config has the first N layers, whose trunk holds only their tensors
  plus embedding, norm and head, and whose routed experts (if any of those layers has them) are
  the target's own files, referenced on the target's drives and loaded into RAM when opened;
- `routed=False`: every layer, but no routed experts at all (attention, shared experts and
  dense layers only): the whole trunk, nothing read from the drives.
Nothing is converted or re-quantized.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from nightshift.engine.errors import NightshiftError
from nightshift.engine.store.families import layer_of, module_at, switch_sites
from nightshift.engine.store.gguf_import import sha256_of
from nightshift.engine.store.manifest import TRUNK, read_manifest, write_manifest
from nightshift.engine.store.safetensors_io import copied_tensor, read_header, write_safetensors

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "generation_config.json",
)


def drafter_config(config: dict, layers: int) -> dict:
    """`config` cut to its first `layers` decoder layers (per-layer lists cut with them)."""
    total = config["num_hidden_layers"]
    out = {**config, "num_hidden_layers": layers}
    for key, value in config.items():
        if isinstance(value, list) and len(value) == total and key != "eos_token_id":
            out[key] = value[:layers]
    return out


class NoRoutedExperts(nn.Module):
    """Stands in for the routed experts of a trunk-only drafter: they add nothing to the residual stream."""

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        return mx.zeros((*indices.shape, x.shape[-1]), dtype=x.dtype)


def drop_routed_experts(model: nn.Module) -> None:
    """Replace every routed-expert module of `model` with `NoRoutedExperts`."""
    for site in switch_sites(model):
        parent_path, name = site.path.rsplit(".", 1)
        setattr(module_at(model, parent_path), name, NoRoutedExperts())


def routed_dropped(source: dict) -> bool:
    """Whether a store's manifest `source` says it is a trunk-only drafter."""
    return source.get("routed_experts") == "dropped"


def make_drafter(store: Path, out: Path, layers: int | None = None, routed: bool = True) -> Path:
    """Write a drafter store at `out` from the store at `store`: its first `layers` layers (None: all),
    with their routed experts or (`routed=False`) without any."""
    store, out = Path(store), Path(out)
    manifest = read_manifest(store)
    total = manifest.config.get("num_hidden_layers")
    layers = total if layers is None else layers
    if not isinstance(total, int) or not 0 <= layers <= total or (routed and layers == total):
        raise NightshiftError(
            f"--layers {layers}: give 0 to {(total or 1) - 1} (the model has {total} layers), "
            "or --no-routed-experts to keep every layer without its routed experts"
        )
    if out.exists() and any(out.iterdir()):
        raise NightshiftError(f"{out} already exists and is not empty; pick a new directory")
    out.mkdir(parents=True, exist_ok=True)
    kept = [
        e for e in read_header(store / manifest.trunk["file"]) if (layer := layer_of(e.name)) is None or layer < layers
    ]
    write_safetensors(out / TRUNK, [copied_tensor(e) for e in kept])
    for name in TOKENIZER_FILES:
        if (store / name).is_file():
            shutil.copy2(store / name, out / name)
    moe_layers = [layer for layer in manifest.layers if layer.layer < layers and routed]
    drafter = replace(
        manifest,
        name=manifest.name,  # expert files are found by the target store's name under each drive
        config=drafter_config(manifest.config, layers),
        trunk={**manifest.trunk, "file": TRUNK, "sha256": sha256_of(out / TRUNK)},
        layers=moe_layers,
        experts={layer.layer: manifest.experts[layer.layer] for layer in moe_layers},
        source={"drafter_of": str(store), "layers": layers, "routed_experts": "kept" if routed else "dropped"},
        routing={},
    )
    write_manifest(out, drafter)
    return out
