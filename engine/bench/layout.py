"""Benchmark layouts: every expert on every drive, so one store serves the whole drive ladder.

The ladder compares 1, 2, ... n drives on the same layout; with a replica of every expert on
each drive, `use_drives` picks the drives and nothing else changes. Files are copied (temp +
rename) and the manifest, rewritten last and atomically, lists each new replica only once
its file is complete, so an interrupted copy leaves a valid store.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from nightshift.engine.errors import NoSpaceError
from nightshift.engine.io.drives import Drive
from nightshift.engine.store.manifest import expert_relpath, read_manifest, write_manifest
from nightshift.engine.store.placement import free_bytes


def replicate_everywhere(store: Path) -> int:
    """Copy each expert to every drive of the store that lacks it; returns the bytes copied."""
    store = Path(store)
    manifest = read_manifest(store)
    missing: dict[str, int] = {}
    for layer in manifest.layers:
        for expert in range(layer.num_experts):
            for drive in set(manifest.drives) - set(manifest.experts[layer.layer][expert]["replicas"]):
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
            for drive in [d for d in manifest.drives if d not in entry["replicas"]]:
                target = Path(manifest.drives[drive]) / expert_relpath(manifest.name, layer.layer, expert)
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(target.name + ".partial")
                shutil.copyfile(source, partial)
                os.replace(partial, target)
                entry["replicas"].append(drive)
                copied += layer.file_bytes
        write_manifest(store, manifest)  # a layer at a time: what is listed is complete
    return copied
