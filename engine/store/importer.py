"""`model import`: a safetensors MoE checkpoint into the store, one layer at a time.

Planning reads only headers: the family's `sanitize()` runs on lazy placeholders
(never evaluated), which gives every tensor's final name, shape and dtype; the
model's own parameter tree then says what is missing, extra or misshapen, and
the expert layouts fix every file's size, so drives without room are refused
before anything is written. The copy then goes layer by layer: read that layer's
tensors, sanitize, write each expert's file (temp + rename) and the layer's trunk
tensors into a staging shard, then record the layer as done. Peak memory is about
one layer's tensors. An interrupted import resumes at the first layer not done;
`manifest.json`, written last, is what makes the store complete.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import load_config

from nightshift.engine.errors import ModelFormatError, NightshiftError, NoSpaceError
from nightshift.engine.io.drives import Drive
from nightshift.engine.store.families import (
    SwitchSite,
    build_model,
    expert_quantization,
    layer_of,
    normalized_config,
    quantize_as_stored,
    sanitize_layer,
    switch_sites,
)
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
    Checkpoint,
    copied_tensor,
    out_tensor,
    read_header,
    to_bytes,
    write_safetensors,
)

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


@dataclass(frozen=True)
class ImportOptions:
    trunk_bits: int = 8  # 16: trunk kept as the checkpoint stores it; 8 or 4: affine, group size 64
    quantize_experts: bool = False  # unquantized experts -> affine 4-bit, group size 64

    def __post_init__(self):
        if self.trunk_bits not in (16, 8, 4):
            raise NightshiftError(f"--trunk-bits must be 16, 8 or 4, not {self.trunk_bits}")


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
    """What an import will write, worked out from the checkpoint's headers alone."""

    config: dict
    checkpoint: Checkpoint
    model: nn.Module
    groups: dict[int | None, list[str]]  # layer -> checkpoint tensor names
    sites: list[SwitchSite]
    layers: list[MoeLayer]
    trunk_quantized: dict[str, dict]  # module path -> {"bits", "group_size"} quantized on import

    def group_bytes(self, layer: int | None) -> int:
        return sum(self.checkpoint.entries[n].nbytes for n in self.groups[layer])


def plan_import(src: Path, options: ImportOptions) -> Plan:
    """Check the checkpoint at `src` against its family's model and lay out the store."""
    src = Path(src)
    if not (src / "config.json").is_file():
        raise ModelFormatError(f"{src} is not a model checkpoint (config.json missing)")
    try:
        config = normalized_config(load_config(src))
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{src / 'config.json'}: {exc}") from exc
    checkpoint = Checkpoint(src, "model*.safetensors")
    model = build_model(config)
    model_type = config.get("model_type", "")
    groups: dict[int | None, list[str]] = {}
    for name in checkpoint.entries:
        groups.setdefault(layer_of(name), []).append(name)

    planned: dict[str, mx.array] = {}
    origin: dict[str, int | None] = {}
    for layer, names in groups.items():
        try:
            sanitized = sanitize_layer(model, model_type, layer, {n: checkpoint.placeholder(n) for n in names})
        except (KeyError, ValueError) as exc:
            raise ModelFormatError(
                f"{_files_of(checkpoint, names)}: the {model_type} tensors of {_which(layer)} are incomplete "
                f"({exc!r} is missing or wrong)"
            ) from exc
        for name, value in sanitized.items():
            planned[name] = value
            origin[name] = layer

    sites = switch_sites(model)
    if options.quantize_experts:
        planned = _quantized_experts(planned, sites)
    quantize_as_stored(model, planned)
    _check_tensors(model, planned, origin, groups, checkpoint)
    trunk_quantized = _trunk_quantization(model, planned, sites, options)
    layers = []
    for site in sites:
        tensors = []
        for name in sorted(n for n in planned if n.startswith(site.path + ".")):
            value = planned[name]
            per_expert = value.nbytes // site.num_experts
            tensors.append((name[len(site.path) + 1 :], NAME_OF[value.dtype], tuple(value.shape[1:]), per_expert))
        layers.append(
            MoeLayer.laid_out(site.layer, site.path, site.num_experts, tensors, expert_quantization(model, site))
        )
    return Plan(config, checkpoint, model, groups, sites, layers, trunk_quantized)


def _which(layer: int | None) -> str:
    return f"layer {layer}" if layer is not None else "the embeddings and head"


def _files_of(checkpoint: Checkpoint, names: list[str]) -> str:
    return ", ".join(sorted({str(checkpoint.entries[n].file) for n in names}))


def _quantized_experts(planned: dict[str, mx.array], sites: list[SwitchSite]) -> dict[str, mx.array]:
    """Unquantized expert weights replaced by their (lazy) affine 4-bit quantization."""
    out = dict(planned)
    for site in sites:
        for proj in site.projections:
            key = f"{site.path}.{proj}"
            if f"{key}.scales" in out:
                continue
            weight, scales, biases = mx.quantize(out[f"{key}.weight"], EXPERT_GROUP_SIZE, EXPERT_BITS)
            out[f"{key}.weight"], out[f"{key}.scales"], out[f"{key}.biases"] = weight, scales, biases
    return out


def _check_tensors(model: nn.Module, planned: dict, origin: dict, groups: dict, checkpoint: Checkpoint) -> None:
    """Every parameter present with its shape, nothing left over; errors name the source files."""
    expected = dict(tree_flatten(model.parameters()))
    missing = sorted(set(expected) - set(planned))
    if missing:
        layer = layer_of(missing[0])
        files = _files_of(checkpoint, groups.get(layer, [])) or str(checkpoint.root)
        raise ModelFormatError(
            f"{files}: missing tensor(s) {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} "
            f"({len(missing)} in all); the checkpoint is incomplete"
        )
    extra = sorted(set(planned) - set(expected))
    if extra:
        files = _files_of(checkpoint, groups[origin[extra[0]]])
        raise ModelFormatError(f"{files}: tensor(s) the model does not have: {', '.join(extra[:5])}")
    for name, value in expected.items():
        if tuple(planned[name].shape) != tuple(value.shape):
            files = _files_of(checkpoint, groups[origin[name]])
            raise ModelFormatError(
                f"{files}: tensor {name} has shape {list(planned[name].shape)}, the model needs {list(value.shape)}"
            )


def _trunk_quantization(model: nn.Module, planned: dict, sites: list[SwitchSite], options: ImportOptions) -> dict:
    """Trunk modules quantized on import: unquantized Linear/Embedding layers the family allows."""
    if options.trunk_bits == 16:
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
    files = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in plan.checkpoint.files]
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
    for group in order:
        done_file = staging / f"{_group_id(group)}.done.json"
        if done_file.is_file():
            checksums.update({int(k): v for k, v in json.loads(done_file.read_text()).items()})
        else:
            sums = _import_group(plan, group, staging, name, placement, by_drive, options)
            _sync_experts(name, placement, by_drive, sums)
            write_json_atomic(done_file, {str(k): v for k, v in sums.items()})
            checksums.update(sums)
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
        trunk={"file": TRUNK, "sha256": trunk_sha, "bits": options.trunk_bits, "quantized": plan.trunk_quantized},
        drives={d.name: str(d.root) for d in drives},
        layers=plan.layers,
        experts={
            layer.layer: [
                {"sha256": checksums[layer.layer][e], "replicas": placement[(layer.layer, e)]}
                for e in range(layer.num_experts)
            ]
            for layer in plan.layers
        },
        source={"path": str(src.resolve()), "quantize_experts": options.quantize_experts},
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
) -> dict[int, list[str]]:
    """Read, sanitize and write one layer: its expert files and its trunk shard. Returns expert checksums."""
    names = plan.groups[group]
    weights = sanitize_layer(
        plan.model, plan.config.get("model_type", ""), group, {n: plan.checkpoint.read(n) for n in names}
    )
    sites = [s for s in plan.sites if any(k.startswith(s.path + ".") for k in weights)]
    if options.quantize_experts:
        weights = _quantized_experts(weights, sites)
    checksums = {}
    for site in sites:
        layer = next(layer for layer in plan.layers if layer.module == site.path)
        stacked = {slot.name: weights.pop(f"{site.path}.{slot.name}") for slot in layer.tensors}
        mx.eval(list(stacked.values()))
        checksums[layer.layer] = [
            _write_expert(layer, stacked, e, name, [by_drive[d] for d in placement[(layer.layer, e)]])
            for e in range(layer.num_experts)
        ]
        del stacked
    trunk = []
    for key in sorted(weights):
        module, _, leaf = key.rpartition(".")
        settings = plan.trunk_quantized.get(module)
        if settings and leaf == "weight":
            w, scales, biases = mx.quantize(weights[key], settings["group_size"], settings["bits"])
            trunk += [(key, w), (f"{module}.scales", scales), (f"{module}.biases", biases)]
        else:
            trunk.append((key, weights[key]))
    mx.eval([v for _, v in trunk])
    write_safetensors(staging / f"{_group_id(group)}.safetensors", [out_tensor(k, v) for k, v in trunk])
    del weights, trunk
    mx.clear_cache()
    return checksums


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
