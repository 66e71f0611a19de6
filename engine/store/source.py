"""A checkpoint as `mlx_lm.load` holds it, found where people keep models, and not yet read.

The import must give exactly the weights mlx-lm gives, so it does not re-implement
mlx-lm's loading: it runs mlx-lm's own `load_model` lazily. `mx.load` maps each
tensor to a read that happens only when the tensor is evaluated; the family's
`sanitize()` sees the whole checkpoint at once (families decide norm shifts, expert
stacking or fused splits from the set of names, which one layer at a time would
hide); quantized checkpoints (mlx-lm conversions, mxfp4, compressed-tensors, AWQ)
go through mlx-lm's own handling. The result is a dict of lazy arrays, one per
model parameter; evaluating one layer's arrays reads only that layer's tensors, so
a checkpoint never has to fit in memory.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import load_config, load_model

from nightshift.engine.errors import ModelFormatError, NightshiftError, UnsupportedModelError
from nightshift.engine.models import get_classes
from nightshift.engine.store.families import (
    build_model,
    layer_of,
    normalized_config,
    quantize_as_stored,
    switch_sites,
)
from nightshift.engine.store.safetensors_io import Checkpoint

WEIGHT_FILES = "model*.safetensors"  # what mlx-lm loads
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_source(src: str | Path) -> Path:
    """The checkpoint directory for `src`: a directory, or a repo id already in the local Hugging Face cache.

    Nothing is downloaded and nothing is copied: a cached repo is read in place, from its snapshot.
    """
    path = Path(src).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelFormatError(f"{path} is a file; give the checkpoint's directory (config.json, model*.safetensors)")
    if not REPO_ID.match(str(src)):
        raise ModelFormatError(f"{src}: no such directory")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(str(src), local_files_only=True))
    except LocalEntryNotFoundError as exc:
        raise ModelFormatError(
            f"{src}: no such directory, and no copy of the repo {src!r} in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); download it there first (nightshift never goes online), "
            "or give the checkpoint's directory"
        ) from exc


@dataclass
class LazyCheckpoint:
    """The model's parameters as `mlx_lm.load` would hold them, every one still unread."""

    root: Path
    config: dict  # config.json as read (quantization keys where mlx-lm looks for them)
    weights: dict[str, mx.array]  # model parameter name -> lazy array
    files: list[Path]

    def layer_names(self) -> dict[int | None, list[str]]:
        """Parameter names by decoder layer (None: embeddings, final norm, head and the like)."""
        groups: dict[int | None, list[str]] = {}
        for name in self.weights:
            groups.setdefault(layer_of(name), []).append(name)
        return groups


def open_checkpoint(src: Path) -> tuple[LazyCheckpoint, nn.Module]:
    """The checkpoint at `src`, loaded lazily by mlx-lm, and the model it builds (for its structure only).

    Drop the model as soon as its structure has been read: it references every lazy array,
    so a tensor evaluated through it would stay in memory until it goes.
    """
    src = Path(src)
    if not (src / "config.json").is_file():
        raise ModelFormatError(f"{src} is not a model checkpoint (config.json missing)")
    try:
        config = normalized_config(load_config(src))
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{src / 'config.json'}: {exc}") from exc
    checkpoint = Checkpoint(src, WEIGHT_FILES)  # headers checked: truncated or unreadable files named first
    _refuse_what_the_store_cannot_hold(config)
    seen: dict[str, tuple[int, ...]] = {}
    try:
        model, _ = load_model(src, lazy=True, strict=True, get_model_classes=_recording(seen))
    except NightshiftError:
        raise
    except TypeError as exc:  # ModelArgs refusing the config (a required field missing, a wrong type)
        raise UnsupportedModelError(
            f"{src / 'config.json'}: this {config.get('model_type')} config is not usable: {exc}"
        ) from exc
    except KeyError as exc:
        wanted = str(exc.args[0]) if exc.args else ""
        if "." not in wanted:  # a config key, not a tensor name
            raise UnsupportedModelError(
                f"{src / 'config.json'}: the {config.get('model_type')} family needs the config key {wanted!r}"
            ) from exc
        raise ModelFormatError(
            f"{_files_of_layer(checkpoint, layer_of(wanted))}: the {config.get('model_type')} family's sanitize() "
            f"looked for tensor {wanted} and the checkpoint does not have it; the checkpoint is incomplete or in a "
            "layout mlx-lm does not read"
        ) from exc
    except ValueError as exc:
        raise _explained(exc, checkpoint, config, seen) from exc
    weights = dict(tree_flatten(model.parameters()))
    _refuse_what_the_store_cannot_rebuild(model, config, weights)
    return LazyCheckpoint(src, config, weights, checkpoint.files), model


def _recording(seen: dict[str, tuple[int, ...]]) -> Callable[[dict], tuple[type, type]]:
    """`get_classes` whose models note what their sanitize() returned (names and shapes, never data).

    When mlx-lm then refuses the weights, the note says which tensor is missing or misshapen
    and so which file to blame.
    """

    def classes(config: dict) -> tuple[type, type]:
        try:
            model_class, args_class = get_classes(config)
        except ValueError as exc:
            raise UnsupportedModelError(f"model_type {config.get('model_type')!r}: {exc}") from exc
        original = getattr(model_class, "sanitize", None)
        if original is None:
            return model_class, args_class

        def sanitize(self, weights: dict) -> dict:
            out = original(self, weights)
            seen.update({k: tuple(v.shape) for k, v in out.items()})
            return out

        names = {"sanitize": sanitize, "__module__": model_class.__module__, "__qualname__": model_class.__qualname__}
        return type(model_class.__name__, (model_class,), names), args_class

    return classes


def _explained(exc: ValueError, checkpoint: Checkpoint, config: dict, seen: dict) -> NightshiftError:
    """mlx-lm's refusal of the weights, said with the checkpoint files that hold the bad layer."""
    if "model_file" in config:
        return UnsupportedModelError(
            f"{checkpoint.root}: this checkpoint builds its model by running its own code "
            f"({config['model_file']}); nightshift never runs code from a checkpoint"
        )
    if not seen:
        return UnsupportedModelError(f"{checkpoint.root}: mlx-lm cannot build this {config.get('model_type')}: {exc}")
    model = build_model(config)
    quantize_as_stored(model, {k: mx.zeros(v) for k, v in seen.items()})
    expected = {k: tuple(v.shape) for k, v in tree_flatten(model.parameters())}
    missing = sorted(set(expected) - set(seen))
    extra = sorted(set(seen) - set(expected))
    if missing:
        what = f"missing tensor(s) {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} ({len(missing)} in all)"
        culprit = missing[0]
        hint = _nearest(culprit, extra)
        what += f"; the checkpoint has {hint} instead" if hint else "; the checkpoint is incomplete"
    elif extra:
        what, culprit = f"tensor(s) the model does not have: {', '.join(extra[:5])}", extra[0]
    else:
        culprit = next((k for k in expected if expected[k] != seen[k]), "")
        if not culprit:
            return ModelFormatError(f"{checkpoint.root}: mlx-lm refuses these weights: {exc}")
        what = f"tensor {culprit} has shape {list(seen[culprit])}, the model needs {list(expected[culprit])}"
    return ModelFormatError(f"{_files_of_layer(checkpoint, layer_of(culprit))}: {what}")


def _nearest(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.8)
    return close[0] if close else ""


def _files_of_layer(checkpoint: Checkpoint, layer: int | None) -> str:
    files = sorted({str(e.file) for name, e in checkpoint.entries.items() if layer_of(name) == layer})
    where = f"layer {layer}" if layer is not None else "the embeddings and head"
    return (", ".join(files) or str(checkpoint.root)) + f" ({where})"


def _refuse_what_the_store_cannot_hold(config: dict) -> None:
    """Options mlx-lm loads but whose weights the store cannot rebuild exactly: refused by name, before any work."""
    family = config.get("model_type")
    if config.get("quantize_activations"):
        raise UnsupportedModelError(
            f"this {family} checkpoint quantizes activations (quantize_activations: true); the store keeps "
            "weight quantization only, so it cannot hold this model exactly"
        )
    method = (config.get("quantization_config") or {}).get("quant_method")
    if method == "bitnet":
        raise UnsupportedModelError(
            f"this {family} checkpoint is BitNet-quantized (quant_method: bitnet); the store cannot hold BitLinear "
            "layers exactly. Import an unquantized or mlx-lm-quantized release instead"
        )


def _declares_experts(config: dict) -> bool:
    """Whether a config asks for more than one expert anywhere (`num_experts`, `ffn_config.moe_num_experts`, ...)."""
    for key, value in config.items():
        if isinstance(value, dict) and _declares_experts(value):
            return True
        if "expert" in key and isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return True
    return False


def _refuse_what_the_store_cannot_rebuild(model: nn.Module, config: dict, weights: dict[str, mx.array]) -> None:
    """The store rebuilds a model from its config and its tensors alone; refuse when that is not this model.

    Routed experts must sit in mlx-lm's SwitchGLU/SwitchMLP (what the streaming layer replaces); every
    other module must come back as the same kind of module with the same tensors.
    """
    try:
        switch_sites(model)
    except UnsupportedModelError as exc:
        if _declares_experts(config):
            raise UnsupportedModelError(
                f"{config.get('model_type')}: mlx-lm builds this family's experts as its own modules, not as the "
                "SwitchGLU/SwitchMLP that nightshift streams, so it cannot be imported exactly"
            ) from exc
        raise UnsupportedModelError(f"{config.get('model_type')}: {exc}") from exc
    rebuilt = build_model({k: v for k, v in config.items() if k not in ("quantization", "quantization_config")})
    quantize_as_stored(rebuilt, weights)
    kinds = {path: type(m).__name__ for path, m in model.named_modules()}
    for path, module in rebuilt.named_modules():
        if kinds.get(path, type(module).__name__) != type(module).__name__:
            raise UnsupportedModelError(
                f"{config.get('model_type')}: module {path} loads as {kinds[path]} but the store would rebuild it "
                f"as {type(module).__name__}; this checkpoint's format cannot be stored exactly"
            )
    names = {k: tuple(v.shape) for k, v in tree_flatten(rebuilt.parameters())}
    loaded = {k: tuple(v.shape) for k, v in weights.items()}
    if names != loaded:
        diff = sorted(set(names) ^ set(loaded)) or sorted(k for k in names if names[k] != loaded[k])
        raise UnsupportedModelError(
            f"{config.get('model_type')}: the store would rebuild this model with other tensors "
            f"({', '.join(diff[:3])}); this checkpoint's format cannot be stored exactly"
        )
