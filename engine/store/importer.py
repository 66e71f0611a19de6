"""`model import`: a safetensors MoE checkpoint into the store, one layer at a time, exactly as mlx-lm loads it.

Planning reads no tensor: mlx-lm loads the checkpoint lazily (engine/store/source.py),
so the family's `sanitize()` and quantization handling run on the whole checkpoint
and every parameter's final name, shape and dtype is known; the expert layouts fix
every file's size, so drives without room are refused before anything is written.
The copy then goes layer by layer: evaluate that layer's parameters (which reads
only its tensors), write each expert's file (temp + rename) and the layer's trunk
tensors into a staging shard, then record the layer as done. Peak memory is about
one layer's tensors. An interrupted import resumes at the first layer not done;
`manifest.json`, written last, is what makes the store complete. The trunk keeps
the checkpoint's precision unless told otherwise, so the store is weight-exact.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from nightshift.engine.errors import MemoryFitError, NightshiftError, NoSpaceError
from nightshift.engine.io.drives import Drive
from nightshift.engine.store.families import SwitchSite, expert_quantization, switch_sites
from nightshift.engine.store.gguf_import import sha256_of
from nightshift.engine.store.manifest import (
    IMPORT_STATE,
    MANIFEST,
    TRUNK,
    Manifest,
    MoeLayer,
    expert_relpath,
    human_size,
    sha256_bytes,
    write_json_atomic,
    write_manifest,
)
from nightshift.engine.store.placement import check_free_space, plan_placement, rooms
from nightshift.engine.store.safetensors_io import (
    NAME_OF,
    copied_tensor,
    out_tensor,
    read_header,
    to_bytes,
    write_safetensors,
)
from nightshift.engine.store.source import LazyCheckpoint, open_checkpoint

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
)
STAGING = ".import"
TRUNK_GROUP_SIZE = 64
EXPERT_BITS, EXPERT_GROUP_SIZE = 4, 64
# The trunk stays resident while experts stream; as released it may take this share of the RAM available.
TRUNK_RAM_SHARE = 0.75


@dataclass(frozen=True)
class ImportOptions:
    # None (or 16): the trunk as the checkpoint has it, weight-exact; 8 or 4: affine, group size 64.
    trunk_bits: int | None = None
    quantize_experts: bool = False  # unquantized experts -> affine 4-bit, group size 64 (not weight-exact)

    def __post_init__(self):
        if self.trunk_bits not in (None, 16, 8, 4):
            raise NightshiftError(f"--trunk-bits must be 16, 8 or 4, not {self.trunk_bits}")
        if self.trunk_bits == 16:
            object.__setattr__(self, "trunk_bits", None)


@dataclass
class Progress:
    """How far an import is: bytes of the checkpoint processed, of the total."""

    done_bytes: int
    total_bytes: int
    elapsed: float

    @property
    def eta(self) -> float | None:
        if self.done_bytes <= 0 or self.elapsed <= 0:
            return None
        return (self.total_bytes - self.done_bytes) * self.elapsed / self.done_bytes

    def describe(self) -> str:
        """One status line: bytes done of total, percent, rate, time left."""
        eta = self.eta
        left = f"{int(eta // 60)}:{int(eta % 60):02d}" if eta is not None else "?"
        rate = human_size(self.done_bytes / self.elapsed) + "/s" if self.elapsed > 0 else "?"
        percent = 100 * self.done_bytes / max(self.total_bytes, 1)
        return (
            f"imported {human_size(self.done_bytes)} of {human_size(self.total_bytes)} ({percent:.0f} %), "
            f"{rate}, ETA {left}"
        )


@dataclass
class Plan:
    """What an import will write, worked out without reading a tensor."""

    config: dict
    source: LazyCheckpoint
    groups: dict[int | None, list[str]]  # layer -> parameter names (mlx-lm's, after sanitize)
    sites: list[SwitchSite]
    layers: list[MoeLayer]
    trunk_quantized: dict[str, dict]  # module path -> {"bits", "group_size"} quantized on import
    trunk_bytes: int  # of the trunk as the checkpoint has it
    experts_quantized: bool  # some experts quantized on import (--quantize-experts)
    sizes: dict[int | None, int] = field(init=False)  # layer -> bytes of its parameters (kept as they are written)

    def __post_init__(self):
        self.sizes = {g: sum(self.source.weights[n].nbytes for n in names) for g, names in self.groups.items()}

    def group_bytes(self, layer: int | None) -> int:
        return self.sizes[layer]

    @property
    def weight_exact(self) -> bool:
        """The store holds exactly the weights `mlx_lm.load` holds for the checkpoint."""
        return not self.trunk_quantized and not self.experts_quantized


def plan_import(src: Path, options: ImportOptions, available_ram: int | None = None) -> Plan:
    """Load the checkpoint at `src` lazily as mlx-lm does, check it fits the store, and lay the store out.

    `available_ram` (bytes; default: what psutil says now) decides whether the trunk may keep its precision.
    """
    source, model = open_checkpoint(Path(src))
    weights = source.weights
    sites = switch_sites(model)
    expert_names = {n for s in sites for n in weights if s.holds(n)}
    trunk_bytes = sum(v.nbytes for n, v in weights.items() if n not in expert_names)
    _check_trunk_fits(trunk_bytes, options, available_ram)
    trunk_quantized = _trunk_quantization(model, weights, sites, options)
    layers, experts_quantized = [], False
    for site in sites:
        stacked = {n[len(site.path) + 1 :]: weights[n] for n in weights if site.holds(n)}
        released = expert_quantization(model, site)
        if options.quantize_experts:
            stacked = _quantized_experts(stacked, site.projections)
        tensors = [
            (name, NAME_OF[v.dtype], tuple(v.shape[1:]), v.nbytes // site.num_experts)
            for name, v in sorted(stacked.items())
        ]
        quantization = dict(released)
        if options.quantize_experts:
            added = {"mode": "affine", "bits": EXPERT_BITS, "group_size": EXPERT_GROUP_SIZE}
            quantization = {p: released.get(p, added) for p in site.projections}
            experts_quantized |= quantization != released
        layers.append(MoeLayer.laid_out(site.layer, site.path, site.num_experts, tensors, quantization))
    del model  # it holds every lazy array: evaluated through it, they would all stay in memory
    groups = source.layer_names()
    return Plan(source.config, source, groups, sites, layers, trunk_quantized, trunk_bytes, experts_quantized)


def _check_trunk_fits(trunk_bytes: int, options: ImportOptions, available_ram: int | None) -> None:
    """Keep the trunk as released unless it cannot be resident; then quantize only when told."""
    if options.trunk_bits is not None:
        return
    if available_ram is None:
        import psutil

        available_ram = psutil.virtual_memory().available
    if trunk_bytes > TRUNK_RAM_SHARE * available_ram:
        raise MemoryFitError(
            f"the trunk (every weight but the routed experts) is {human_size(trunk_bytes)} as released, more than "
            f"{TRUNK_RAM_SHARE:.0%} of the {human_size(available_ram)} of RAM available, and it must stay resident. "
            "Import with --trunk-bits 8 (about half the size; not weight-exact: its agreement with the released "
            "model is measured in docs/results.md, 'What the trunk's precision does') or on a machine with more RAM"
        )


def _quantized_experts(stacked: dict[str, mx.array], projections: tuple[str, ...]) -> dict[str, mx.array]:
    """Unquantized expert weights replaced by their (lazy) affine 4-bit quantization."""
    out = dict(stacked)
    for proj in projections:
        if f"{proj}.scales" in out:
            continue
        weight, scales, biases = mx.quantize(out[f"{proj}.weight"], EXPERT_GROUP_SIZE, EXPERT_BITS)
        out[f"{proj}.weight"], out[f"{proj}.scales"], out[f"{proj}.biases"] = weight, scales, biases
    return out


def _trunk_quantization(model: nn.Module, planned: dict, sites: list[SwitchSite], options: ImportOptions) -> dict:
    """Trunk modules quantized on import: unquantized Linear/Embedding layers the family allows."""
    if options.trunk_bits is None:
        return {}
    family_rule = getattr(model, "quant_predicate", None)
    chosen = {}
    for path, module in model.named_modules():
        if not path or not hasattr(module, "to_quantized") or f"{path}.scales" in planned:
            continue
        if any(path == s.path or path.startswith(s.path + ".") for s in sites) or f"{path}.weight" not in planned:
            continue
        settings = {"bits": options.trunk_bits, "group_size": TRUNK_GROUP_SIZE}
        rule = family_rule(path, module) if family_rule else True
        if rule is False:
            continue
        if isinstance(rule, dict):
            settings.update({k: rule[k] for k in ("bits", "group_size") if k in rule})
        if planned[f"{path}.weight"].shape[-1] % settings["group_size"]:
            continue
        chosen[path] = settings
    return chosen


def _fingerprint(src: Path, plan: Plan, options: ImportOptions, placement: dict) -> dict:
    files = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in plan.source.files]
    return {
        "source": str(src.resolve()),
        "files": files,
        "trunk_bits": options.trunk_bits,
        "quantize_experts": options.quantize_experts,
        "placement": {f"{k[0]}/{k[1]}": v for k, v in sorted(placement.items())},
    }


def import_checkpoint(
    src: Path,
    store: Path,
    drives: list[Drive],
    options: ImportOptions = ImportOptions(),
    progress: Callable[[Progress], None] | None = None,
) -> Manifest:
    """Import the checkpoint at `src` into the store directory `store`; resumes an unfinished import."""
    src, store = Path(src), Path(store)
    if (store / MANIFEST).exists():
        raise NightshiftError(f"{store} already holds an imported model; pick another name or remove it first")
    plan = plan_import(src, options)
    name = store.name
    sizes = {(layer.layer, e): layer.file_bytes for layer in plan.layers for e in range(layer.num_experts)}
    state_path = store / IMPORT_STATE
    state = json.loads(state_path.read_text()) if state_path.is_file() else None
    if state is None:
        placement = plan_placement(sizes, rooms(drives), replicate=False)
    else:
        placement = {tuple(map(int, k.split("/"))): v for k, v in state["placement"].items()}
    fingerprint = _fingerprint(src, plan, options, placement)
    if state is not None and state != fingerprint:
        raise NightshiftError(
            f"{store} holds an unfinished import of another source or with other options; "
            "run the same command again to resume it, or remove the directory to start over"
        )
    by_drive = {d.name: d for d in drives}
    if unknown := {n for names in placement.values() for n in names} - set(by_drive):
        raise NightshiftError(
            f"the unfinished import into {store} used drives {sorted(unknown)}, not in the drives given"
        )

    # Room: count only files not yet written, then refuse before writing anything.
    needed: dict[str, int] = {}
    for key, names in placement.items():
        path = by_drive[names[0]].root / expert_relpath(name, *key)
        if not path.is_file():
            needed[names[0]] = needed.get(names[0], 0) + sizes[key]
    for drive in drives:
        budget = drive.budget_bytes
        if budget is not None and needed.get(drive.name, 0) > budget:
            raise NoSpaceError(
                f"drive {drive.name} would need {human_size(needed[drive.name])}, over its budget of "
                f"{human_size(budget)}; raise budget_gb in the drives file or add a drive"
            )
    trunk_estimate = sum(plan.group_bytes(g) for g in plan.groups) - sum(sizes.values())
    check_free_space(
        [*drives, Drive("(store directory)", store)], {**needed, "(store directory)": max(trunk_estimate, 0)}
    )

    staging = store / STAGING
    staging.mkdir(parents=True, exist_ok=True)
    if state is None:
        write_json_atomic(state_path, fingerprint)

    order = sorted(g for g in plan.groups if g is not None) + ([None] if None in plan.groups else [])
    total = sum(plan.group_bytes(g) for g in order)
    done_bytes, start = 0, time.perf_counter()
    checksums: dict[int, list[str]] = {}
    errors: dict[str, float] = {}  # quantized trunk module -> relative RMS error of its weight
    for group in order:
        done_file = staging / f"{_group_id(group)}.done.json"
        if not done_file.is_file():
            sums, errs = _import_group(plan, group, staging, name, placement, by_drive, options)
            _sync_experts(name, placement, by_drive, sums)
            write_json_atomic(done_file, {"experts": {str(k): v for k, v in sums.items()}, "trunk_error": errs})
        done = json.loads(done_file.read_text())
        checksums.update({int(k): v for k, v in done["experts"].items()})
        errors.update(done["trunk_error"])
        done_bytes += plan.group_bytes(group)
        if progress:
            progress(Progress(done_bytes, total, time.perf_counter() - start))

    trunk_sha = _merge_trunk(staging, order, store / TRUNK)
    for file in TOKENIZER_FILES:
        if (src / file).is_file():
            shutil.copyfile(src / file, store / file)
    config = {k: v for k, v in plan.config.items() if k not in ("quantization", "quantization_config")}
    write_json_atomic(store / "config.json", config)
    manifest = Manifest(
        name=name,
        config=config,
        trunk={
            "file": TRUNK,
            "sha256": trunk_sha,
            "bits": options.trunk_bits or "as released",
            "quantized": plan.trunk_quantized,
            "error": _error_summary(errors),
        },
        drives={d.name: str(d.root) for d in drives},
        layers=plan.layers,
        experts={
            layer.layer: [
                {"sha256": checksums[layer.layer][e], "replicas": placement[(layer.layer, e)]}
                for e in range(layer.num_experts)
            ]
            for layer in plan.layers
        },
        source={
            "path": str(src.resolve()),
            "quantize_experts": options.quantize_experts,
            "weight_exact": plan.weight_exact,
        },
    )
    write_manifest(store, manifest)
    state_path.unlink()
    shutil.rmtree(staging)
    return manifest


def _sync_experts(name: str, placement: dict, by_drive: dict, checksums: dict[int, list[str]]) -> None:
    """Flush a layer's expert files to their drives before the layer is recorded as done.

    Synced after the whole layer is written rather than file by file, so writeback overlaps.
    """
    for layer, sums in checksums.items():
        for expert in range(len(sums)):
            for drive in placement[(layer, expert)]:
                fd = os.open(by_drive[drive].root / expert_relpath(name, layer, expert), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)


def _group_id(group: int | None) -> str:
    return f"layer-{group:04d}" if group is not None else "rest"


def _import_group(
    plan: Plan, group: int | None, staging: Path, name: str, placement: dict, by_drive: dict, options: ImportOptions
) -> tuple[dict[int, list[str]], dict[str, float]]:
    """Read one layer (its tensors are evaluated now), write its expert files and its trunk shard.

    Each array is taken out of the plan as it is written, so nothing of the layer stays in memory after.
    Returns the experts' checksums and, for each trunk module quantized here, the relative RMS error
    of its weight (what quantizing cost, measured on the weights themselves).
    """
    weights = {n: plan.source.weights.pop(n) for n in plan.groups[group]}
    checksums = {}
    for site in (s for s in plan.sites if s.layer == group):
        layer = next(layer for layer in plan.layers if layer.module == site.path)
        stacked = {n[len(site.path) + 1 :]: weights.pop(n) for n in list(weights) if site.holds(n)}
        if options.quantize_experts:
            stacked = _quantized_experts(stacked, site.projections)
        mx.eval(list(stacked.values()))
        checksums[layer.layer] = [
            _write_expert(layer, stacked, e, name, [by_drive[d] for d in placement[(layer.layer, e)]])
            for e in range(layer.num_experts)
        ]
        del stacked
    trunk, errors = [], {}
    for key in sorted(weights):
        module, _, leaf = key.rpartition(".")
        settings = plan.trunk_quantized.get(module)
        if settings and leaf == "weight":
            w, scales, biases = mx.quantize(weights[key], settings["group_size"], settings["bits"])
            trunk += [(key, w), (f"{module}.scales", scales), (f"{module}.biases", biases)]
            errors[module] = _relative_error(weights[key], w, scales, biases, settings)
        else:
            trunk.append((key, weights[key]))
    mx.eval([v for _, v in trunk])
    write_safetensors(staging / f"{_group_id(group)}.safetensors", [out_tensor(k, v) for k, v in trunk])
    del weights, trunk
    mx.clear_cache()
    return checksums, errors


def _relative_error(weight: mx.array, w: mx.array, scales: mx.array, biases: mx.array, settings: dict) -> float:
    """||W - dequantize(quantize(W))|| / ||W||, in float32."""
    back = mx.dequantize(w, scales, biases, settings["group_size"], settings["bits"]).astype(mx.float32)
    weight = weight.astype(mx.float32)
    norm = mx.sqrt(mx.sum(weight * weight)).item()
    return mx.sqrt(mx.sum((weight - back) ** 2)).item() / norm if norm else 0.0


def _error_summary(errors: dict[str, float]) -> dict:
    """The quantized trunk's weight error: mean and worst module (empty when nothing was quantized)."""
    if not errors:
        return {}
    worst = max(errors, key=errors.__getitem__)
    return {"mean": sum(errors.values()) / len(errors), "worst": errors[worst], "worst_module": worst}


def _write_expert(layer: MoeLayer, stacked: dict[str, mx.array], expert: int, name: str, drives: list[Drive]) -> str:
    """Write one expert's file on each of its drives (temp + rename); returns its sha256."""
    data = bytearray(layer.file_bytes)
    for slot in layer.tensors:
        data[slot.offset : slot.offset + slot.nbytes] = to_bytes(stacked[slot.name][expert])
    for drive in drives:
        path = drive.root / expert_relpath(name, layer.layer, expert)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        with open(tmp, "wb") as f:
            f.write(data)
        tmp.replace(path)
    return sha256_bytes(data)


def _merge_trunk(staging: Path, order: list, target: Path) -> str:
    """The staged per-layer trunk shards streamed into one trunk.safetensors; returns its sha256."""
    entries = [e for g in order for e in read_header(staging / f"{_group_id(g)}.safetensors")]
    write_safetensors(target, [copied_tensor(e) for e in entries])
    return sha256_of(target)
