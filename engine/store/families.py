"""What the store needs to know about a model family, found from the instantiated mlx-lm model.

Routed experts are whatever `SwitchGLU` / `SwitchMLP` modules the model holds,
wherever they sit (`mlp.switch_mlp`, `block_sparse_moe.switch_mlp`,
`mlp.experts`, ...). Checkpoint names are mapped by the family's own `sanitize()`,
run by mlx-lm over the whole checkpoint (engine/store/source.py). nightshift holds
no per-family knowledge: what a family needs, its mlx-lm module says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchGLU, SwitchLinear, SwitchMLP
from mlx_lm.utils import infer_quant_config

from nightshift.engine.errors import ModelFormatError, UnsupportedModelError
from nightshift.engine.models import get_classes

SWITCH_TYPES = (SwitchGLU, SwitchMLP)
SWITCH_LINEAR_TYPES = (SwitchLinear, QuantizedSwitchLinear)
# The first numbered part of a name is its block: `model.layers.3.`, `transformer.h.3.`, `backbone.layers.3.`.
LAYER = re.compile(r"(?:^|\.)(\d+)\.")


def layer_of(name: str) -> int | None:
    """The decoder layer (block) a tensor name belongs to, or None for embeddings, final norm, head."""
    match = LAYER.search(name)
    return int(match.group(1)) if match else None


def normalized_config(config: dict) -> dict:
    """`config` with the quantization settings where mlx-lm looks for them (text_config too)."""
    config = dict(config)
    text = config.get("text_config")
    if "quantization_config" not in config and isinstance(text, dict) and "quantization_config" in text:
        config["quantization_config"] = text["quantization_config"]
    return config


def build_model(config: dict) -> nn.Module:
    """The family's model for `config`, unquantized; parameters stay lazy (nothing is allocated)."""
    try:
        model_class, args_class = get_classes(config)
    except ValueError as exc:
        raise UnsupportedModelError(f"model_type {config.get('model_type')!r}: {exc}") from exc
    try:
        return model_class(args_class.from_dict(config))
    except (TypeError, ValueError, KeyError) as exc:
        raise UnsupportedModelError(
            f"the config of this {config.get('model_type')} model is not usable: {exc}"
        ) from exc


@dataclass(frozen=True)
class SwitchSite:
    """One routed-expert module: its path in the model, its layer and its expert projections."""

    path: str
    layer: int
    num_experts: int
    projections: tuple[str, ...]

    def holds(self, name: str) -> bool:
        """Whether parameter `name` is one of these experts' tensors (stacked over experts).

        Other modules a family hangs under its switch (a norm, say) are not: they belong to the trunk.
        """
        return any(name.startswith(f"{self.path}.{p}.") for p in self.projections)


def switch_sites(model: nn.Module) -> list[SwitchSite]:
    """Every routed-expert module of `model`, in layer order."""
    sites = []
    for path, module in model.named_modules():
        if not isinstance(module, SWITCH_TYPES):
            continue
        layer = layer_of(path + ".")
        if layer is None:
            raise UnsupportedModelError(f"routed experts at {path} are not inside a numbered layer")
        projections = tuple(sorted(n for n, c in module.children().items() if isinstance(c, SWITCH_LINEAR_TYPES)))
        num_experts = getattr(module, projections[0]).num_experts
        sites.append(SwitchSite(path, layer, num_experts, projections))
    layers = [s.layer for s in sites]
    if len(set(layers)) != len(layers):
        raise UnsupportedModelError(
            f"{type(model).__module__} has two routed-expert modules in one numbered block "
            f"({', '.join(s.path for s in sites)}); the store keeps one per layer"
        )
    if not sites:
        raise UnsupportedModelError(
            f"{type(model).__module__} has no routed experts (no SwitchGLU/SwitchMLP); "
            "only Mixture-of-Experts models go into the store; `nightshift model moefy` makes one from a dense model"
        )
    return sorted(sites, key=lambda s: s.layer)


def module_at(model: nn.Module, path: str) -> nn.Module:
    """The submodule of `model` at a dotted `path` (list items by index)."""
    module = model
    for part in path.split("."):
        module = module[int(part)] if isinstance(module, list) else getattr(module, part)
    return module


def quantize_as_stored(model: nn.Module, weights: dict[str, mx.array]) -> None:
    """Quantize the modules of `model` whose weights come quantized (they carry `scales`).

    Bits, group size and mode are read off the stored shapes and dtypes, as mlx-lm does.
    """

    def predicate(path: str, module: nn.Module):
        if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
            return False
        try:
            return infer_quant_config(path, module, weights)
        except ValueError as exc:
            raise ModelFormatError(f"tensor {path}.weight: {exc}") from exc

    nn.quantize(model, class_predicate=predicate)


def expert_quantization(model: nn.Module, site: SwitchSite) -> dict[str, dict]:
    """How each projection of the experts at `site` is quantized ({} for unquantized)."""
    module = module_at(model, site.path)
    info = {}
    for name in site.projections:
        proj = getattr(module, name)
        if isinstance(proj, QuantizedSwitchLinear):
            info[name] = {"mode": proj.mode, "bits": proj.bits, "group_size": proj.group_size}
    return info
