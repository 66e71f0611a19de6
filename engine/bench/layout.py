"""Benchmark layouts: every expert on every drive, so one store serves the whole drive ladder.

The ladder compares 1, 2, ... n drives on the same layout; with a replica of every expert on
each drive, `use_drives` picks the drives and nothing else changes. With `copies`, each expert
gets that many replicas instead (the drives after its first one, in the store's drive order),
so a layout between one replica and every drive can be measured. Files are copied (temp +
rename) and the manifest, rewritten last and atomically, lists each new replica only once
its file is complete, so an interrupted copy leaves a valid store.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from nightshift.engine.errors import NoSpaceError, SettingError
from nightshift.engine.io.drives import Drive
from nightshift.engine.store.manifest import expert_relpath, read_manifest, write_manifest
from nightshift.engine.store.placement import free_bytes


def new_replicas(replicas: list[str], drives: list[str], copies: int | None) -> list[str]:
    """The drives an expert held on `replicas` is copied to: every drive it lacks, or (`copies`) the drives after
    its first replica in `drives`' order until it has `copies` (none if it has as many already)."""
    first = drives.index(replicas[0])
    missing = [d for d in drives[first:] + drives[:first] if d not in replicas]
    return missing if copies is None else missing[: max(0, copies - len(replicas))]


def replicate_everywhere(store: Path, copies: int | None = None) -> int:
    """Copy each expert to every drive of the store that lacks it, or until it has `copies` replicas; returns
    the bytes copied."""
    store = Path(store)
    manifest = read_manifest(store)
    drives = list(manifest.drives)
    if copies is not None and not 1 <= copies <= len(drives):
        raise SettingError(f"--replicas {copies}: the store has {len(drives)} drives; give 1 to {len(drives)}")
    missing: dict[str, int] = {}
    for layer in manifest.layers:
        for expert in range(layer.num_experts):
            for drive in new_replicas(manifest.experts[layer.layer][expert]["replicas"], drives, copies):
                missing[drive] = missing.get(drive, 0) + layer.file_bytes
    for drive, need in missing.items():
        free = free_bytes(Drive(drive, Path(manifest.drives[drive])))
        if need > free:
            raise NoSpaceError(
                f"drive {drive} needs {need / 1e9:.2f} GB for a replica of every expert and has "
                f"{free / 1e9:.2f} GB free; use larger drives or fewer experts"
            )
    copied = 0
    for layer in manifest.layers:
        for expert in range(layer.num_experts):
            entry = manifest.experts[layer.layer][expert]
            source = manifest.replica_paths(layer.layer, expert)[0][1]
            for drive in new_replicas(entry["replicas"], drives, copies):
                target = Path(manifest.drives[drive]) / expert_relpath(manifest.name, layer.layer, expert)
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(target.name + ".partial")
                shutil.copyfile(source, partial)
                os.replace(partial, target)
                entry["replicas"].append(drive)
                copied += layer.file_bytes
        write_manifest(store, manifest)  # a layer at a time: what is listed is complete
    return copied
