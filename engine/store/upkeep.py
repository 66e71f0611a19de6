"""Keeping a store sound after import: verify every replica, measure routing, re-plan and move files.

Re-placement never leaves the manifest pointing at a file that is not there:
new replicas are copied and checked first, the manifest is replaced atomically,
and only then are replicas that left the plan deleted.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from nightshift.engine.errors import ModelFormatError
from nightshift.engine.io.drives import Drive
from nightshift.engine.store.families import SWITCH_TYPES
from nightshift.engine.store.gguf_import import sha256_of
from nightshift.engine.store.manifest import Manifest, expert_relpath, read_manifest, write_manifest
from nightshift.engine.store.placement import Key, check_free_space, plan_placement, rooms
from nightshift.engine.store.synth import CALIBRATION_TEXT


@dataclass(frozen=True)
class BadFile:
    path: Path
    drive: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path} (drive {self.drive}): {self.problem}"


def verify_store(store: Path) -> list[BadFile]:
    """Every replica of every expert, and the trunk, checked for presence, size and checksum."""
    store = Path(store)
    manifest = read_manifest(store)
    bad = []
    trunk = store / manifest.trunk["file"]
    if not trunk.is_file():
        bad.append(BadFile(trunk, "store", "missing"))
    elif sha256_of(trunk) != manifest.trunk["sha256"]:
        bad.append(BadFile(trunk, "store", "checksum mismatch"))
    for layer in manifest.layers:
        for expert, entry in enumerate(manifest.experts[layer.layer]):
            for drive, path in manifest.replica_paths(layer.layer, expert):
                if not path.is_file():
                    bad.append(BadFile(path, drive, "missing"))
                elif path.stat().st_size != layer.file_bytes:
                    bad.append(BadFile(path, drive, f"{path.stat().st_size} bytes, expected {layer.file_bytes}"))
                elif sha256_of(path) != entry["sha256"]:
                    bad.append(BadFile(path, drive, "checksum mismatch"))
    return bad


class RoutingCounter(nn.Module):
    """Wraps a routed-expert module and counts which experts the router picks."""

    def __init__(self, inner: nn.Module, num_experts: int):
        super().__init__()
        self.inner = inner
        self.counts = np.zeros(num_experts, dtype=np.int64)

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        np.add.at(self.counts, np.array(indices).ravel(), 1)
        return self.inner(x, indices)


def measure_routing(model: nn.Module, token_batches: list[list[int]]) -> dict[str, np.ndarray]:
    """Per routed-expert module: how often each expert was picked over the prompts."""
    counters = {
        path: RoutingCounter(module, _num_experts(module))
        for path, module in model.named_modules()
        if isinstance(module, SWITCH_TYPES)
    }
    for path, counter in counters.items():
        _replace(model, path, counter)
    try:
        for tokens in token_batches:
            mx.eval(model(mx.array([tokens])))
    finally:
        for path, counter in counters.items():
            _replace(model, path, counter.inner)
    return {path: counter.counts for path, counter in counters.items()}


def _num_experts(module: nn.Module) -> int:
    return next(v for _, v in tree_flatten(module.parameters()) if v.ndim >= 2).shape[0]


def _replace(model: nn.Module, path: str, module: nn.Module) -> None:
    *parents, leaf = path.split(".")
    parent = model
    for part in parents:
        parent = parent[int(part)] if isinstance(parent, list) else getattr(parent, part)
    setattr(parent, leaf, module)


def calibration_prompts(tokenizer, text: str | None = None, length: int = 128) -> list[list[int]]:
    """Calibration text (nightshift's own by default) cut into prompts of `length` tokens."""
    ids = tokenizer.encode(text if text is not None else CALIBRATION_TEXT.read_text())
    return [ids[i : i + length] for i in range(0, len(ids), length) if len(ids[i : i + length]) > 1]


def place_store(
    store: Path,
    drives: list[Drive],
    routing: dict[int, list[int]] | None = None,
    replicate: bool = True,
    planner: Callable[..., dict[Key, list[str]]] = plan_placement,
) -> tuple[Manifest, dict[str, int]]:
    """Re-plan the store over `drives` (by `routing` counts if given) and move files to match.

    `planner` takes plan_placement's arguments (placement by host plans each host's layers on its own drives).
    Returns the new manifest and the bytes copied per drive.
    """
    store = Path(store)
    manifest = read_manifest(store)
    if routing is not None:
        manifest.routing = {layer: list(map(int, counts)) for layer, counts in routing.items()}
    sizes = {(layer.layer, e): layer.file_bytes for layer in manifest.layers for e in range(layer.num_experts)}
    frequency = {}
    for layer, counts in manifest.routing.items():
        total = sum(counts) or 1
        frequency.update({(layer, e): c / total for e, c in enumerate(counts)})
    held: dict[str, int] = {}
    for key, size in sizes.items():
        for drive in manifest.experts[key[0]][key[1]]["replicas"]:
            held[drive] = held.get(drive, 0) + size
    plan = planner(sizes, rooms(drives, held), frequency, replicate)
    by_drive = {d.name: d for d in drives}
    old_roots = {**manifest.drives}

    needed: dict[str, int] = {}
    for key, names in plan.items():
        for name in names:
            if not _holds(manifest, old_roots, key, name, by_drive[name]):
                needed[name] = needed.get(name, 0) + sizes[key]
    check_free_space(drives, needed)

    copied: dict[str, int] = {}
    for key, names in plan.items():
        for name in names:
            if _holds(manifest, old_roots, key, name, by_drive[name]):
                continue
            _copy_expert(manifest, key, by_drive[name])
            copied[name] = copied.get(name, 0) + sizes[key]
    old_paths = {p for key in sizes for _, p in manifest.replica_paths(*key)}
    manifest.drives = {d.name: str(d.root) for d in drives}
    for (layer, expert), names in plan.items():
        manifest.experts[layer][expert]["replicas"] = names
    write_manifest(store, manifest)
    new_paths = {p for key in sizes for _, p in manifest.replica_paths(*key)}
    for path in old_paths - new_paths:
        path.unlink(missing_ok=True)
        for parent in (path.parent, path.parent.parent):  # the layer's and the store's directory, once empty
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
    return manifest, copied


def _holds(manifest: Manifest, old_roots: dict[str, str], key: Key, name: str, drive: Drive) -> bool:
    """Whether the drive already holds a replica of `key` at the same root."""
    return name in manifest.experts[key[0]][key[1]]["replicas"] and Path(old_roots.get(name, "")) == drive.root


def _copy_expert(manifest: Manifest, key: Key, drive: Drive) -> None:
    """Copy one expert from a good replica onto `drive`, checked against its checksum."""
    layer, expert = key
    target = drive.root / expert_relpath(manifest.name, layer, expert)
    target.parent.mkdir(parents=True, exist_ok=True)
    expected = manifest.experts[layer][expert]["sha256"]
    for _, source in manifest.replica_paths(layer, expert):
        if not source.is_file():
            continue
        tmp = target.with_name(target.name + ".partial")
        shutil.copyfile(source, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if sha256_of(tmp) == expected:
            tmp.replace(target)
            return
        tmp.unlink()
    raise ModelFormatError(
        f"expert {expert} of layer {layer} has no intact replica to copy from; run `nightshift model verify`"
    )
