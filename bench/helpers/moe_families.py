"""Every Mixture-of-Experts family the installed mlx-lm ships, as tiny random checkpoints in the layouts people
download: mlx-lm's converted names and the upstream release names.

Nothing here lists families by hand: `moe_families()` reads the `mlx_lm.models` package (and nightshift's own
families), `tiny_config()` sizes a family from its own `ModelArgs` field names, and the release layout is found
by proposing inverse renames of the model's tensors and keeping the one the family's own `sanitize()` maps back
to exactly the model's parameters. A family a future mlx-lm adds is picked up by itself. Used by
tests/test_family_conformance.py and bench/family_table.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model

from bench.helpers.reference import greedy_tokens
from nightshift.engine.errors import NightshiftError
from nightshift.engine.io.drives import Drive
from nightshift.engine.models import get_classes
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import open_model
from nightshift.engine.store.importer import ImportOptions, import_checkpoint
from nightshift.engine.store.loader import load_store

# Sizes of every tiny model: small enough to build ~50 families in seconds, big enough that routing, grouped
# attention and the family's layer kinds are all exercised.
HIDDEN, HEAD_DIM, HEADS, KV_HEADS = 64, 16, 4, 2
LAYERS, EXPERTS, ACTIVE, VOCAB = 4, 8, 2, 256
# Expert width 64: a multiple of mlx-lm's default group size, so its convert quantizes the experts too.
INTERMEDIATE, EXPERT_INTERMEDIATE = 128, 64
LAYOUTS = ("mlx", "release")
GRID = 2**16


class FamilyError(Exception):
    """A family this module cannot build a tiny checkpoint for, and why (shown by the suite as such)."""


def _mentions_experts(name: str, sources: dict[str, str], seen: frozenset[str] = frozenset()) -> bool:
    """Whether a model module, or a sibling module it imports (a VL wrapper's text model), mentions experts."""
    text = sources[name]
    if re.search("expert", text, re.IGNORECASE):
        return True
    return any(
        _mentions_experts(i, sources, seen | {name}) for i in _siblings_in(text) if i in sources and i not in seen
    )


def _siblings_in(source: str) -> list[str]:
    """The sibling modules of mlx_lm.models a module's source imports."""
    return re.findall(r"^from \.(\w+) import", source, re.M) + re.findall(r"^from \. import (\w+)", source, re.M)


@cache
def moe_families() -> list[str]:
    """Every model_type of the installed mlx-lm (and nightshift's own families) whose model can hold routed experts.

    A module is a family when it defines `Model` and `ModelArgs`; it is a MoE family when it (or the text
    model it wraps) mentions experts. Whether its tiny model really builds SwitchGLU/SwitchMLP is left to the
    suite, so a family that mentions experts but builds none shows up there (refused by the importer).
    """
    import mlx_lm.models

    from nightshift.engine.models import FAMILIES

    root = Path(mlx_lm.models.__file__).parent
    sources = {path.stem: path.read_text() for path in root.glob("*.py")}
    found = [
        name
        for name, text in sources.items()
        if re.search(r"^class Model\b", text, re.M)
        and re.search(r"^class ModelArgs\b", text, re.M)
        and _mentions_experts(name, sources)
    ]
    own = [name for name, module in FAMILIES.items() if _own_family_has_experts(module)]
    return sorted(found, key=str.lower) + sorted(own)


def _own_family_has_experts(module: str) -> bool:
    return "expert" in Path(importlib.import_module(f"nightshift.engine.models.{module}").__file__).read_text().lower()


def model_classes(model_type: str) -> tuple[type, type]:
    """(Model, ModelArgs) of a family, the way every nightshift loader finds them."""
    from nightshift.engine.models import get_classes

    return get_classes({"model_type": model_type})


# Field names of the model's widths and depth (bench/family_table.py scales a family by them).
HIDDEN_FIELDS = ("hidden_size", "d_model", "model_dim", "hidden_size_per_layer_input")
INTERMEDIATE_FIELDS = ("intermediate_size", "ffn_hidden_size", "dense_intermediate_size")
EXPERT_FIELDS = (
    "moe_intermediate_size",
    "expert_ffn_hidden_size",
    "shared_expert_intermediate_size",
    "moe_shared_expert_intermediate_size",
    "shared_intermediate_size",
    "share_expert_dim",
)
LAYER_FIELDS = ("num_hidden_layers", "n_layers", "num_layers")

# The generic rule: a ModelArgs field's tiny value, by its name. Names outside the table keep their default
# (a required one without a rule makes the family fail loudly, naming the field).
RULE: dict[str, object] = {
    **dict.fromkeys(("vocab_size", "num_vocab", "vocab_size_per_layer_input"), VOCAB),
    **dict.fromkeys(HIDDEN_FIELDS, HIDDEN),
    **dict.fromkeys(INTERMEDIATE_FIELDS, INTERMEDIATE),
    **dict.fromkeys(EXPERT_FIELDS, EXPERT_INTERMEDIATE),
    **dict.fromkeys(LAYER_FIELDS, LAYERS),
    **dict.fromkeys(("num_attention_heads", "n_heads", "num_heads", "swa_num_attention_heads"), HEADS),
    **dict.fromkeys(
        ("num_key_value_heads", "num_attention_groups", "swa_num_key_value_heads", "num_global_key_value_heads"),
        KV_HEADS,
    ),
    **dict.fromkeys(("head_dim", "swa_head_dim", "v_head_dim", "swa_v_head_dim", "global_head_dim"), HEAD_DIM),
    **dict.fromkeys(
        ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"),
        EXPERTS,
    ),
    **dict.fromkeys(
        ("num_experts_per_tok", "moe_topk", "moe_k", "moe_top_k", "top_k_experts", "num_experts_per_token"), ACTIVE
    ),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts", "num_shared_expert", "moe_num_shared_experts"), 1),
    # One dense layer first where the family has the option, so both kinds of layer are exercised.
    **dict.fromkeys(("first_k_dense_replace", "num_dense_layers", "moe_layer_start_index"), 1),
    "mlp_only_layers": [0],
    **dict.fromkeys(("decoder_sparse_step", "moe_layer_freq", "moe_layer_interval", "expert_layer_period"), 1),
    "expert_layer_offset": 0,
    "full_attention_interval": 2,
    "attn_layer_period": 2,
    "attn_layer_offset": 1,
    **dict.fromkeys(("rms_norm_eps", "norm_eps", "layer_norm_epsilon", "layernorm_epsilon"), 1e-5),
    **dict.fromkeys(("rope_theta", "swa_rope_theta"), 10000.0),
    **dict.fromkeys(("max_position_embeddings", "model_max_length"), 1024),
    **dict.fromkeys(("sliding_window", "sliding_window_size"), 4),
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "rotary_dim": 8,
    "partial_rotary_factor": 0.5,
    **dict.fromkeys(("n_group", "topk_group", "num_expert_group"), 1),
    **dict.fromkeys(("routed_scaling_factor", "moe_routed_scaling_factor", "moe_router_scaling_factor"), 1.0),
    **dict.fromkeys(("attention_bias", "use_bias", "mlp_bias", "use_cla", "mamba_proj_bias", "use_expert_bias"), False),
    **dict.fromkeys(("norm_topk_prob", "use_qk_norm", "use_mixed_mlp_moe", "conv_bias", "use_conv_bias"), True),
    "tie_word_embeddings": False,
    "rope_scaling": None,
    "cla_share_factor": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    # Linear-attention and state-space sizes.
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    **dict.fromkeys(("linear_key_head_dim", "linear_value_head_dim", "mamba_head_dim", "mamba_d_head"), HEAD_DIM),
    **dict.fromkeys(("linear_conv_kernel_dim", "conv_kernel", "mamba_d_conv", "short_conv_kernel_size"), 4),
    "conv_L_cache": 3,
    **dict.fromkeys(("mamba_num_heads", "mamba_n_heads"), 8),
    **dict.fromkeys(("ssm_state_size", "mamba_d_state"), 16),
    **dict.fromkeys(("n_groups", "mamba_n_groups"), 1),
    "mamba_expand": 2,
    "layer_group_size": 2,
    "group_norm_size": 1,
    # MLA indexers (deepseek_v32-likes).
    "index_head_dim": 16,
    "index_n_heads": 2,
    "index_topk": 4,
    # Logit and embedding multipliers of the granite families.
    **dict.fromkeys(("logits_scaling", "attention_multiplier", "embedding_multiplier", "residual_multiplier"), 1.0),
}


def tiny_config(model_type: str, options: bool = False) -> dict:
    """config.json of a tiny random model of `model_type`: the generic rule on its ModelArgs, then overrides.

    `options`: also every boolean option of the family that is off by default (tied embeddings, norm_head,
    biases, qk norms, ...) switched on, each kept only if the model still builds and runs with it.
    Raises FamilyError naming the family and what could not be built.
    """
    return json.loads(json.dumps(_options_config(model_type) if options else _base_config(model_type)))


@cache
def _base_config(model_type: str) -> dict:
    config = _tiny_args(model_type)
    override = OVERRIDES.get(model_type)
    if override:
        _merge(config, override[0])
    _, args_class = model_classes(model_type)
    _check_required(model_type, args_class, config)
    if "text_config" in config:
        _check_required(model_type, _text_args_class(model_type), config["text_config"])
    return config


def option_flags(model_type: str) -> list[str]:
    """The boolean options of the family that are off in its tiny config and that it builds and runs with on
    (a text model's as `text_config.<name>`)."""
    return list(_options(model_type))


@cache
def _options(model_type: str) -> dict[str, dict]:
    """option name -> the config update that switches it on, for each option the family runs with."""
    base = _base_config(model_type)
    _, args_class = model_classes(model_type)
    places = [("", args_class, base)]
    if "text_config" in base:
        places.append(("text_config.", _text_args_class(model_type), base["text_config"]))
    found = {}
    for prefix, args, config in places:
        for field in dataclasses.fields(args):
            default = field.default if field.default is not dataclasses.MISSING else None
            if field.type not in (bool, "bool") or config.get(field.name, default) is not False:
                continue
            update = {"text_config": {field.name: True}} if prefix else {field.name: True}
            if _runs(model_type, _updated(base, update)):
                found[prefix + field.name] = update
    return found


def _updated(config: dict, update: dict) -> dict:
    out = json.loads(json.dumps(config))
    _merge(out, update)
    return out


def _runs(model_type: str, config: dict) -> bool:
    """Whether the family's model builds from `config`, computes a forward pass, and its sanitize() accepts its
    own parameters (so mlx-lm loads a checkpoint of it)."""
    try:
        model = build(model_type, config)
        mx.eval(model(mx.array([[1, 2, 3]])))
        params = dict(tree_flatten(model.parameters()))
        return _same_layout(sanitized(model, params), params)
    except Exception:  # any family may reject an option in its own way; such an option is left off
        return False


@cache
def _options_config(model_type: str) -> dict:
    """The base config with every working option on, one at a time, each kept only if all so far still run."""
    config = _base_config(model_type)
    for update in _options(model_type).values():
        candidate = _updated(config, update)
        if _runs(model_type, candidate):
            config = candidate
    return config


def _check_required(model_type: str, args_class: type, config: dict) -> None:
    """FamilyError naming the required ModelArgs fields neither the rule nor an override gives a value."""
    missing = [
        f.name
        for f in dataclasses.fields(args_class)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in config
    ]
    if missing:
        raise FamilyError(
            f"{model_type}: no tiny value for required {args_class.__name__} field(s) {', '.join(missing)}; "
            "give them a rule in RULE or an entry in OVERRIDES"
        )


def _merge(config: dict, update: dict) -> None:
    """`update` into `config`, nested dicts (text_config) merged key by key."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict) and key == "text_config":
            _merge(config[key], value)
        else:
            config[key] = value


def _rule(args_class: type) -> dict:
    return {f.name: RULE[f.name] for f in dataclasses.fields(args_class) if f.name in RULE}


def _tiny_args(model_type: str) -> dict:
    _, args_class = model_classes(model_type)
    config: dict[str, object] = {"model_type": model_type, **_rule(args_class)}
    if any(f.name == "text_config" for f in dataclasses.fields(args_class)):
        config["text_config"] = {"model_type": model_type, **_rule(_text_args_class(model_type))}
    return config


def _text_args_class(model_type: str) -> type:
    """The ModelArgs of the text model a wrapper family (VL, multimodal) holds in its text_config.

    The module's own text-args dataclass (TextArgs, TextModelArgs, TextConfig), else the ModelArgs of the
    sibling family it imports.
    """
    from mlx_lm.models.base import BaseModelArgs

    model_class, args_class = model_classes(model_type)
    module = importlib.import_module(model_class.__module__)
    siblings = [
        importlib.import_module(f"mlx_lm.models.{name}") for name in _siblings_in(Path(module.__file__).read_text())
    ]
    for candidate in (module, *siblings):
        for name, value in vars(candidate).items():
            if (
                "Text" in name
                and isinstance(value, type)
                and issubclass(value, BaseModelArgs)
                and dataclasses.is_dataclass(value)
                and value is not args_class
            ):
                return value
    for sibling in siblings:
        inner = getattr(sibling, "ModelArgs", None)
        if inner is not None and not any(f.name == "text_config" for f in dataclasses.fields(inner)):
            return inner
    raise FamilyError(f"{model_type}: has a text_config but no text model arguments could be found for it")


def _cycle(*kinds) -> list:
    """A per-layer list cycling through `kinds` (the family names its layer kinds itself)."""
    return [kinds[i % len(kinds)] for i in range(LAYERS)]


ROPE_PARAMETERS = {"rope_type": "default", "rope_theta": 10000.0}
GEMMA4_TEXT = {"enable_moe_block": True, "sliding_window_pattern": 2, "num_kv_shared_layers": 2}
KIMI_LINEAR_ATTENTION = {"kda_layers": [1, 3], "num_heads": HEADS, "head_dim": HEAD_DIM, "short_conv_kernel_size": 4}

# model_type -> (what the generic rule gets wrong or cannot say, why). Layer-kind lists name the family's own
# layer kinds, which no field name reveals.
OVERRIDES: dict[str, tuple[dict, str]] = {
    "afmoe": ({"layer_types": _cycle("sliding_attention", "full_attention")}, "layer kinds by name"),
    "dbrx": (
        {
            "ffn_config": {"ffn_hidden_size": EXPERT_INTERMEDIATE, "moe_num_experts": EXPERTS, "moe_top_k": ACTIVE},
            "attn_config": {"kv_n_heads": KV_HEADS, "clip_qkv": 8.0, "rope_theta": 10000.0},
        },
        "sizes nested in ffn_config/attn_config",
    ),
    "deepseek_v2": (
        {"rope_scaling": {"type": "yarn", "factor": 1.0, "original_max_position_embeddings": 1024}},
        "its attention reads rope_scaling unconditionally",
    ),
    "exaone_moe": (
        {"layer_types": _cycle("sliding_attention", "full_attention"), "is_moe_layer": [False] + [True] * 3},
        "layer kinds and MoE layers as lists",
    ),
    "gemma4_text": (GEMMA4_TEXT, "experts are an opt-in block; default kv sharing needs more layers than 4"),
    "gemma4": ({"text_config": GEMMA4_TEXT}, "as gemma4_text, in text_config"),
    "glm_moe_dsa": ({"rope_parameters": ROPE_PARAMETERS}, "rope settings only in rope_parameters"),
    "granitemoehybrid": ({"layer_types": _cycle("mamba", "attention")}, "layer kinds by name"),
    "hunyuan": ({"rope_scaling": {"alpha": 1.0, "factor": 1.0, "type": "dynamic"}}, "reads rope_scaling alpha"),
    "kimi_linear": ({"linear_attn_config": KIMI_LINEAR_ATTENTION}, "linear-attention layers in a nested dict"),
    "kimi_k3": ({"text_config": {"linear_attn_config": KIMI_LINEAR_ATTENTION}}, "as kimi_linear, in text_config"),
    "kimi_k3_replay": (
        {"text_config": {"linear_attn_config": KIMI_LINEAR_ATTENTION, "replay_lengths": [40, 24]}},
        "as kimi_k3; the lengths of the recorded sequences its gates replay",
    ),
    "lfm2_moe": ({"layer_types": _cycle("conv", "full_attention")}, "layer kinds by name"),
    "llama4": (
        {
            "text_config": {
                "num_experts_per_tok": 1,
                "attention_chunk_size": 8,
                "interleave_moe_layer_step": 2,
                "intermediate_size_mlp": 128,
            }
        },
        "one routed expert per token only; chunked attention and the MoE interval have no generic name",
    ),
    "longcat_flash": (
        {"attention_method": "MLA", "zero_expert_type": "identity", "zero_expert_num": 2}
        | {"mla_scale_q_lora": True, "mla_scale_kv_lora": True},
        "zero (identity) experts and MLA scaling are longcat's own options",
    ),
    "longcat_flash_ngram": (
        {"zero_expert_num": 2, "mla_scale_q_lora": True, "mla_scale_kv_lora": True},
        "as longcat_flash",
    ),
    "mellum": (
        {
            "layer_types": _cycle("sliding_attention", "full_attention"),
            "rope_parameters": {"sliding_attention": ROPE_PARAMETERS, "full_attention": ROPE_PARAMETERS},
        },
        "layer kinds by name, rope settings per kind",
    ),
    "minimax_m3_vl": ({"text_config": {"moe_layer_freq": [0] + [1] * 3}}, "MoE layers as a 0/1 list"),
    "mimo_v2_flash": (
        {"hybrid_layer_pattern": _cycle(0, 1), "moe_layer_freq": [0] + [1] * 3}
        | {"add_swa_attention_sink_bias": True, "add_full_attention_sink_bias": False},
        "sliding/full and dense/MoE layers as 0/1 lists",
    ),
    "mistral4": (
        {"rope_parameters": ROPE_PARAMETERS | {"llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 1024}},
        "reads llama-4 scaling from rope_parameters",
    ),
    "muse_spark": (
        {
            "text_config": {
                "layer_types": _cycle("sliding_attention", "full_attention"),
                "layer_rope_theta": _cycle(10000.0, 0.0),
                "rope_parameters": ROPE_PARAMETERS,
                "post_norm_eps": 1e-5,
                "final_logit_softcapping": 30.0,
                "output_multiplier": 1.0,
                "moe_hidden_size": EXPERT_INTERMEDIATE,
                "num_shared_experts": 0,
            }
        },
        "per-layer rope thetas, softcapping, a compressed MoE width of its own; no shared experts supported",
    ),
    "nemotron_h": ({"hybrid_override_pattern": ["M", "E", "*", "E"]}, "layer kinds as pattern letters"),
}


def build(model_type: str, config: dict | None = None) -> nn.Module:
    """The family's model for `config` (default: its tiny config), parameters as the Model class initialises them."""
    model_class, args_class = model_classes(model_type)
    config = config or tiny_config(model_type)
    try:
        return model_class(args_class.from_dict(config))
    except Exception as exc:  # any family's constructor may reject a config in its own way
        raise FamilyError(f"{model_type}: its Model does not build from the tiny config: {exc!r}") from exc


def switch_sites(model: nn.Module) -> dict[str, nn.Module]:
    """path -> SwitchGLU/SwitchMLP module: the routed experts of `model` (empty for a model without any)."""
    from mlx_lm.models.switch_layers import SwitchGLU, SwitchMLP

    return {path: module for path, module in model.named_modules() if isinstance(module, (SwitchGLU, SwitchMLP))}


def random_weights(model_type: str, seed: int = 0, config: dict | None = None, dtype: mx.Dtype = mx.float32) -> dict:
    """The tiny model's parameters under its own names (mlx-lm's converted layout), seeded.

    The Model's own initialisation (scaled like a real one) plus small noise on every float tensor, so norms,
    biases and router corrections are not all ones and zeros (a tensor mapped to the wrong place shows).
    """
    mx.random.seed(seed)
    model = build(model_type, config)
    out = {}
    for name, value in tree_flatten(model.parameters()):
        if mx.issubdtype(value.dtype, mx.floating):
            # On a 2^-16 grid: a constant offset sanitize adds (norms stored as w - 1) is then undone exactly.
            value = (mx.round((value + 0.02 * mx.random.normal(value.shape)) * GRID) / GRID).astype(dtype)
        out[name] = value
    mx.eval(out)
    return out


def sanitized(model: nn.Module, weights: dict) -> dict:
    """What the family's own sanitize() makes of `weights` (a copy: sanitize may change its argument)."""
    return model.sanitize(dict(weights)) if hasattr(model, "sanitize") else dict(weights)


def _maps_back(model: nn.Module, candidate: dict, target: dict) -> bool:
    """Whether sanitize() turns `candidate` into exactly the names, shapes and dtypes of `target`."""
    try:
        return _same_layout(sanitized(model, candidate), target)
    except (KeyError, ValueError, IndexError, TypeError):  # a sanitize() that expects another naming entirely
        return False


def _same_layout(got: dict, want: dict) -> bool:
    return set(got) == set(want) and all(
        tuple(got[k].shape) == tuple(want[k].shape) and got[k].dtype == want[k].dtype for k in want
    )


# Release names of the SwitchGLU/SwitchMLP projections in the upstream checkpoints' conventions.
PROJECTION_NAMES: tuple[dict[str, str], ...] = (
    {},
    {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"},
    {"fc1": "up_proj", "fc2": "down_proj"},
)
# Where releases keep a layer's experts, relative to the expert module or one of its two parents.
CONTAINERS = ("", ".experts", ".mlp", ".moe", ".block_sparse_moe.experts", ".mlp.experts", ".feed_forward.experts")


def _site_tensors(weights: dict, site: str) -> dict[tuple[str, str], mx.array]:
    """(projection, tensor kind) -> stacked tensor of one expert site."""
    out = {}
    for name, value in weights.items():
        if name.startswith(site + "."):
            projection, kind = name[len(site) + 1 :].split(".", 1)
            out[(projection, kind)] = value
    return out


def _prefixes(site: str) -> list[Callable[[str], str]]:
    """Candidate release prefixes of an expert site: the site, its parent or grandparent, plus a container."""
    return [
        (lambda s, up=up, container=container: s.rsplit(".", up)[0] + container if up else s + container)
        for up in (0, 1, 2)
        for container in CONTAINERS
    ]


def _per_expert(where: Callable[[str], str], names: dict[str, str]) -> Callable[[str, dict], dict]:
    """Each expert its own tensors: `<prefix>.<e>.<projection>.<kind>` (most HF releases)."""

    def rename(site: str, tensors: dict) -> dict:
        return {
            f"{where(site)}.{e}.{names.get(projection, projection)}.{kind}": value[e]
            for (projection, kind), value in tensors.items()
            for e in range(value.shape[0])
        }

    return rename


def _stacked(where: Callable[[str], str], names: dict[str, str]) -> Callable[[str, dict], dict]:
    """All experts of a projection stacked, under the release's own prefix: `<prefix>.<projection>.<kind>`."""

    def rename(site: str, tensors: dict) -> dict:
        return {f"{where(site)}.{names.get(p, p)}.{kind}": value for (p, kind), value in tensors.items()}

    return rename


def _fused_gate_up(
    where: Callable[[str], str], transposed: bool, interleaved: bool, suffix: str
) -> Callable[[str, dict], dict]:
    """All experts stacked, gate and up in one `gate_up_proj` (transformers' fused MoE form)."""

    def rename(site: str, tensors: dict) -> dict:
        if ("gate_proj", "weight") not in tensors:
            return {}
        prefix, out = where(site), {}
        for kind in ("weight", "bias"):
            if ("gate_proj", kind) not in tensors:
                continue
            gate, up, down = (tensors[(p, kind)] for p in ("gate_proj", "up_proj", "down_proj"))
            if interleaved:
                joined = mx.stack([gate, up], axis=2).reshape(gate.shape[0], -1, *gate.shape[2:])
            else:
                joined = mx.concatenate([gate, up], axis=1)
            if kind == "weight" and transposed:
                joined, down = joined.swapaxes(1, 2), down.swapaxes(1, 2)
            end = suffix if kind == "weight" else "_bias"
            out[f"{prefix}.gate_up_proj{end}"] = joined
            out[f"{prefix}.down_proj{end}"] = down
        return out

    return rename


def _input_output_linear(site: str, tensors: dict) -> dict:
    """granite's form: stacked `input_linear` (gate then up) and `output_linear` beside the router."""
    if ("gate_proj", "weight") not in tensors:
        return {}
    parent = site.rsplit(".", 1)[0]
    return {
        f"{parent}.input_linear.weight": mx.concatenate(
            [tensors[("gate_proj", "weight")], tensors[("up_proj", "weight")]], axis=1
        ),
        f"{parent}.output_linear.weight": tensors[("down_proj", "weight")],
    }


def _expert_forms(site: str) -> Iterator[tuple[str, Callable[[str, dict], dict]]]:
    """(description, rename) of every candidate release form of the experts, most common first."""
    described = {}
    for where in _prefixes(site):
        described.setdefault(where(site), where)  # one candidate per distinct prefix
    for kind in ("per-expert", "fused", "stacked"):
        for shown, where in described.items():
            if kind == "per-expert":
                for names in PROJECTION_NAMES:
                    yield f"per-expert {shown}.E.{'/'.join(names.values()) or 'proj'}", _per_expert(where, names)
            elif kind == "fused":
                for t in (False, True):
                    for i in (False, True):
                        for suffix in ("", ".weight"):
                            shape = f"{' transposed' if t else ''}{' interleaved' if i else ''}"
                            yield f"stacked {shown}.gate_up_proj{suffix}{shape}", _fused_gate_up(where, t, i, suffix)
            else:
                for names in PROJECTION_NAMES:
                    if shown != site or names:
                        yield f"stacked {shown}.{'/'.join(names.values()) or 'proj'}", _stacked(where, names)
    yield "stacked input_linear/output_linear", _input_output_linear


def _with_experts(
    weights: dict, sites: list[str], form: Callable[[str, dict], dict], weights_only: bool = False
) -> dict | None:
    """`weights` with every site's stacked experts renamed by `form` (None where the form does not fit);
    `weights_only`: the experts' other tensors (biases) keep mlx-lm's stacked names."""
    out = {k: v for k, v in weights.items() if not any(k.startswith(s + ".") for s in sites)}
    for site in sites:
        tensors = _site_tensors(weights, site)
        if weights_only:
            out.update({f"{site}.{p}.{kind}": v for (p, kind), v in tensors.items() if kind != "weight"})
            tensors = {key: v for key, v in tensors.items() if key[1] == "weight"}
        renamed = form(site, tensors)
        if not renamed:
            return None
        out.update(renamed)
    return out


def _joined_mla(weights: dict) -> dict:
    """MLA attention as released: one `kv_b_proj` (per head: key rows, then value rows) where mlx-lm splits it."""
    out = {}
    for name, value in weights.items():
        if name.endswith("self_attn.unembed_out.weight"):
            continue
        if name.endswith("self_attn.embed_q.weight"):
            values = weights[name.replace("embed_q", "unembed_out")]
            joined = mx.concatenate([value.swapaxes(-1, -2), values], axis=1)
            out[name.replace("embed_q", "kv_b_proj")] = joined.reshape(-1, joined.shape[-1])
            continue
        out[name] = value
    return out


def _channels_first_convs(weights: dict) -> dict:
    """Depthwise conv kernels as PyTorch stores them, (channels, 1, width), where mlx keeps (channels, width, 1)."""
    return {k: v.swapaxes(1, 2) if "conv" in k and v.ndim == 3 and v.shape[-1] == 1 else v for k, v in weights.items()}


TRUNK_FORMS: tuple[Callable[[dict], dict], ...] = (_joined_mla, _channels_first_convs)


@dataclasses.dataclass
class Release:
    """A family's release layout as found: the tensors, how experts are named, and what sanitize changes."""

    tensors: dict
    expert_form: str
    trunk_forms: list[str]
    transformed: list[str]  # tensors sanitize changes in value (not undone here): the layouts differ there


def release_weights(
    model_type: str, seed: int = 0, config: dict | None = None, dtype: mx.Dtype = mx.float32
) -> Release:
    """The tiny model's weights in the upstream release naming, found with the family's sanitize() as the oracle.

    Each candidate renames the stacked experts (and optionally the trunk's MLA and conv tensors); a candidate is
    kept only when sanitize() turns it into exactly the model's parameter names, shapes and dtypes. Constant
    offsets sanitize adds (zero-centred norms stored as `w - 1`) are undone so both layouts hold the same model.
    Raises FamilyError when no candidate fits.
    """
    target = random_weights(model_type, seed, config, dtype)
    model = build(model_type, config)
    if not hasattr(model, "sanitize"):
        raise FamilyError(f"{model_type}: no sanitize(), so its checkpoints carry the model's own names only")
    sites = sorted(switch_sites(model))
    if not sites:
        raise FamilyError(f"{model_type}: the tiny model has no routed experts, so it has no release expert layout")
    tried, first = 0, None
    # Whole experts first; then weights only, for a family whose sanitize() stacks no expert biases.
    forms = [(d, f, False) for d, f in _expert_forms(sites[0])]
    if any(not k.endswith(".weight") for k in target if any(k.startswith(s + ".") for s in sites)):
        forms += [
            (f"{d} (biases in mlx-lm's names: sanitize stacks none)", f, True) for d, f in _expert_forms(sites[0])
        ]
    for description, form, weights_only in forms:
        tried += 1
        candidate = _with_experts(target, sites, form, weights_only)
        if candidate is None or set(candidate) == set(target) or not _maps_back(model, candidate, target):
            continue
        trunk_forms = []
        for trunk in TRUNK_FORMS:
            changed = trunk(candidate)
            differs = set(changed) != set(candidate) or any(changed[k] is not candidate[k] for k in candidate)
            if differs and _maps_back(model, changed, target):
                candidate, trunk_forms = changed, [*trunk_forms, trunk.__name__.strip("_")]
        candidate = _undo_offsets(model, candidate, target)
        got = sanitized(model, candidate)
        transformed = sorted(k for k in target if not mx.array_equal(got[k], target[k]).item())
        found = Release(candidate, description, trunk_forms, transformed)
        if not transformed:
            return found
        first = first or found  # a form sanitize maps back by name only: kept unless one maps values too
    if first:
        return first
    raise FamilyError(
        f"{model_type}: no release layout found: none of {tried} expert namings (per-expert, fused gate_up, "
        "stacked, under the expert module or its parents) is mapped back to the model by its sanitize()"
    )


def _undo_offsets(model: nn.Module, candidate: dict, target: dict) -> dict:
    """Where sanitize adds a constant to a tensor it keeps by name (norms stored zero-centred), store it less."""
    got = sanitized(model, candidate)
    out = dict(candidate)
    for name, value in target.items():
        if name not in candidate or mx.array_equal(got[name], value).item():
            continue
        offset = (got[name].astype(mx.float32) - candidate[name].astype(mx.float32)).reshape(-1)
        if offset.size and mx.all(offset == offset[0]).item():
            out[name] = (value.astype(mx.float32) - offset[0]).astype(value.dtype)
    return out


def _shards(tensors: dict, count: int) -> list[dict]:
    """`tensors` in name order (layers numerically) cut into `count` shards of about equal bytes."""
    key = lambda name: [int(part) if part.isdigit() else part for part in name.split(".")]  # noqa: E731
    names = sorted(tensors, key=key)
    total = sum(tensors[n].nbytes for n in names)
    shards: list[dict] = [{} for _ in range(count)]
    done = 0
    for name in names:
        shards[min(count - 1, done * count // max(total, 1))][name] = tensors[name]
        done += tensors[name].nbytes
    return [shard for shard in shards if shard]


def write_tensors(out_dir: Path, config: dict, tensors: dict, shards: int = 3) -> Path:
    """config.json and `tensors` as sharded model-0000X-of-0000N.safetensors with their index, in `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = _shards(tensors, shards)
    weight_map = {}
    for number, part in enumerate(parts, 1):
        name = f"model-{number:05d}-of-{len(parts):05d}.safetensors"
        mx.save_safetensors(str(out_dir / name), part, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    index = {"metadata": {"total_size": sum(v.nbytes for v in tensors.values())}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
    return out_dir


def write_checkpoint(
    model_type: str, out_dir: Path, layout: str, seed: int = 0, config: dict | None = None, dtype: mx.Dtype = mx.float32
) -> Path:
    """A tiny random checkpoint of `model_type` in `layout` ("mlx": mlx-lm's converted names; "release": the
    upstream naming sanitize() maps back), written to `out_dir` with a byte-level tokenizer (mlx-lm's convert
    needs one). Both layouts of one seed hold the same model. Raises FamilyError where it cannot be made."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    config = config or tiny_config(model_type)
    if layout == "mlx":
        tensors = random_weights(model_type, seed, config, dtype)
    else:
        tensors = release_weights(model_type, seed, config, dtype).tensors
    out = write_tensors(out_dir, config, tensors)
    _write_tokenizer(out, config)
    return out


def _write_tokenizer(out: Path, config: dict) -> None:
    from nightshift.engine.store.synth import write_tokenizer

    vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or VOCAB
    write_tokenizer(out, vocab)


# Quantizations the suite checks, by name: mlx-lm's convert settings (its default group size for each mode), with
# `dtype` as `convert --dtype` (the non-quantized parameters and the affine scales; None: the checkpoint's float32).
# The hub's MLX checkpoints are mostly the bfloat16 ones: converted from bf16 releases.
QUANTIZATIONS: dict[str, dict] = {
    "4bit": {"bits": 4, "mode": "affine", "group_size": 64},
    "4bit bf16": {"bits": 4, "mode": "affine", "group_size": 64, "dtype": "bfloat16"},
    "4bit f16": {"bits": 4, "mode": "affine", "group_size": 64, "dtype": "float16"},
    "8bit bf16": {"bits": 8, "mode": "affine", "group_size": 64, "dtype": "bfloat16"},
    "mxfp4": {"bits": 4, "mode": "mxfp4", "group_size": 32},
    "mxfp8": {"bits": 8, "mode": "mxfp8", "group_size": 32},
    "nvfp4": {"bits": 4, "mode": "nvfp4", "group_size": 16},
    "mixed_3_6": {"bits": 3, "mode": "affine", "group_size": 64, "predicate": "mixed_3_6"},
    "mixed_3_6 bf16": {"bits": 3, "mode": "affine", "group_size": 64, "predicate": "mixed_3_6", "dtype": "bfloat16"},
}


def quantized_checkpoint(
    src: Path,
    out_dir: Path,
    bits: int = 4,
    mode: str = "affine",
    group_size: int = 64,
    dtype: str | None = None,
    predicate: str | None = None,
) -> Path:
    """`src` converted by mlx-lm's own `convert` (offline: `src` is a local directory), quantized as asked, its
    float parameters cast to `dtype` first (`convert --dtype`).

    A nightshift family, which `convert` cannot look up, goes through the same mlx-lm functions `convert`
    calls (load_model with nightshift's classes, a cast of every float parameter, quantize_model, save_model,
    save_config). Raises FamilyError, naming the family, where mlx-lm cannot quantize it so.
    """
    import contextlib
    import io

    from mlx_lm.convert import convert, mixed_quant_predicate_builder
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    from nightshift.engine.models import FAMILIES, get_classes

    family = json.loads((Path(src) / "config.json").read_text()).get("model_type")
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # convert prints its progress
            if family not in FAMILIES:
                convert(
                    str(src),
                    mlx_path=str(out_dir),
                    quantize=True,
                    q_bits=bits,
                    q_mode=mode,
                    q_group_size=group_size,
                    dtype=dtype,
                    quant_predicate=predicate,
                )
                return Path(out_dir)
            model, config = load_model(Path(src), lazy=True, get_model_classes=get_classes)
            if dtype is not None:
                cast = getattr(mx, dtype)
                model.update(
                    tree_map(lambda v: v.astype(cast) if mx.issubdtype(v.dtype, mx.floating) else v, model.parameters())
                )
            recipe = predicate and mixed_quant_predicate_builder(predicate, model, group_size)
            model, config = quantize_model(model, config, group_size, bits, mode=mode, quant_predicate=recipe)
            save_model(out_dir, model)
            save_config(config, Path(out_dir) / "config.json")
    except Exception as exc:  # convert (and transformers' config checks in it) fail in many ways; each is reported
        raise FamilyError(
            f"{family}: mlx-lm's convert cannot quantize it ({mode}, {bits} bits, {dtype or 'as stored'}): {exc}"
        ) from exc
    for tokenizer_file in Path(src).glob("tokenizer*.json"):
        shutil.copy(tokenizer_file, out_dir)
    return Path(out_dir)


# Conformance: a family's checkpoint imported and compared with what mlx-lm holds and generates for it
# (tests/test_family_conformance.py; bench/family_table.py prints the table). The prompt is longer than
# bench/helpers/reference.py's, so that nightshift's CPU prefill would take its GEMM path (cpu_prefill.MIN_ROWS rows;
# experts: rows x top-k products).
PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, *range(100, 140)]
STEPS = 24


def nightshift_tokens(store: Path, streamed: bool, steps: int = STEPS) -> tuple[list[int], bool]:
    """The first `steps` greedy tokens after PROMPT from nightshift's own runtime (open_model, its CPU prefill,
    its prompt split and decode loop), the store's experts streamed or in RAM; and whether an end token ended them
    early (mlx-lm's `generate` stops there too)."""
    model = open_model(store, stream=StreamSettings() if streamed else None)
    try:
        chunks = list(model.generate_tokens(PROMPT, max_tokens=steps))
    finally:
        model.close()
    return [chunk.token for chunk in chunks], chunks[-1].stats.finish_reason == "stop"


@dataclass
class Outcome:
    """What importing one checkpoint gave: `refused` (the importer's reason), or the differences found."""

    refused: str | None = None
    differences: list[str] | None = None
    tokens_unchecked: str | None = None  # why greedy tokens could not be compared (mlx-lm cannot run it here)

    @property
    def passed(self) -> bool:
        return self.refused is None and not self.differences


def tensor_differences(store_model, reference) -> list[str]:
    """Every parameter where the store's model and mlx-lm's differ: missing, extra, dtype, shape or values."""
    got, want = dict(tree_flatten(store_model.parameters())), dict(tree_flatten(reference.parameters()))
    out = [f"missing {name}" for name in sorted(set(want) - set(got))]
    out += [f"extra {name}" for name in sorted(set(got) - set(want))]
    for name in sorted(set(got) & set(want)):
        a, b = got[name], want[name]
        if a.dtype != b.dtype:
            out.append(f"{name}: dtype {a.dtype} vs mlx-lm's {b.dtype}")
        elif a.shape != b.shape:
            out.append(f"{name}: shape {list(a.shape)} vs mlx-lm's {list(b.shape)}")
        elif not mx.array_equal(a, b).item():
            delta = mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max().item()
            out.append(f"{name}: values differ (max |diff| {delta:.3g})")
    return out


def check_import(src: Path, work: Path, options: ImportOptions | None = None) -> Outcome:
    """Import `src` into a store under `work` and compare it with `mlx_lm.load` of `src`, tensors and tokens.

    A refusal must be a NightshiftError that leaves neither the store nor its drive behind. mlx-lm must load
    `src` either way (else the checkpoint, not the importer, is wrong: that raises).
    """
    store, drive = work / "store", work / "drive"
    reference, _ = load_model(src, get_model_classes=get_classes)
    try:
        import_checkpoint(src, store, [Drive("d0", drive)], options or ImportOptions())
    except NightshiftError as exc:
        assert not store.exists() and not drive.exists(), f"refused after writing: {exc}"
        return Outcome(refused=f"{type(exc).__name__}: {exc}")
    in_ram, _ = load_store(store)
    differences = tensor_differences(in_ram, reference)
    try:
        expected = greedy_tokens(reference, STEPS, PROMPT)
    except RuntimeError as exc:  # e.g. a family whose mlx-lm code needs a Metal kernel, on another backend
        return Outcome(differences=differences, tokens_unchecked=f"mlx-lm cannot run it here: {exc}")
    for how, streamed in (("in RAM", False), ("streamed", True)):
        tokens, stopped = nightshift_tokens(store, streamed)
        if tokens != (expected[: len(tokens)] if stopped else expected):
            first = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), len(tokens))
            differences.append(f"greedy tokens {how} differ from mlx-lm's from step {first}")
    return Outcome(differences=differences)


# DeepSeek V3's FP8 release: its linear weights as float8 e4m3 in 128x128 blocks, each block's float32 scale in
# `<name>_scale_inv` (dequantized = fp8 value x scale). mlx-lm's deepseek_v3 sanitize() dequantizes them to bf16.
FP8_BLOCK = 128
FP8_LINEARS = re.compile(
    r"\.(q_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj|gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$"
)


def write_fp8_checkpoint(model_type: str, out_dir: Path, seed: int = 0) -> Path:
    """A tiny random `model_type` release checkpoint with its linear weights in FP8 (F8_E4M3 with per-block
    `weight_scale_inv`, `quantization_config` fp8) and the rest in bfloat16, as DeepSeek V3 and MiniMax M2 publish."""
    config = {
        **tiny_config(model_type),
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [FP8_BLOCK] * 2},
    }
    tensors = {}
    for name, value in release_weights(model_type, seed, tiny_config(model_type), mx.bfloat16).tensors.items():
        if value.ndim != 2 or not FP8_LINEARS.search(name):
            tensors[name] = value
            continue
        rows, cols = value.shape
        blocks = (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
        scale = (2.0 ** mx.random.randint(-9, -6, blocks)).astype(mx.float32)  # powers of two: e4m3's range
        per_element = mx.repeat(mx.repeat(scale, FP8_BLOCK, 0), FP8_BLOCK, 1)[:rows, :cols]
        tensors[name] = mx.to_fp8(value.astype(mx.float32) / per_element)
        tensors[name.replace(".weight", ".weight_scale_inv")] = scale
    out = write_tensors(out_dir, config, tensors)
    _label_fp8(out, {name for name, value in tensors.items() if value.dtype == mx.uint8})
    _write_tokenizer(out, config)
    return out


def _label_fp8(out: Path, names: set[str]) -> None:
    """Relabel `names` (written as U8 bytes: MLX has no fp8 dtype to save) F8_E4M3 in every shard's header."""
    for shard in out.glob("*.safetensors"):
        data = shard.read_bytes()
        length = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + length])
        for name in names & set(header):
            header[name]["dtype"] = "F8_E4M3"
        text = json.dumps(header).encode()
        shard.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length :])


def float32_reference(src: Path) -> nn.Module:
    """mlx-lm's model of `src` (its own loader: FP8 dequantized by its sanitize) with every float parameter cast to
    float32: the reference for checkpoints whose 16-bit experts mlx-lm cannot run on a CPU."""
    model, _ = load_model(src, get_model_classes=get_classes)
    model.update(_cast_floats(model.parameters(), mx.float32))
    return model


def _cast_floats(parameters: dict, dtype: mx.Dtype) -> dict:
    return tree_map(lambda v: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v, parameters)


def greedy_steps(model, steps: int = STEPS) -> list[tuple[int, mx.array]]:
    """mlx-lm's greedy tokens after PROMPT with the log-probabilities each was picked from."""
    tokens = generate_step(mx.array(PROMPT), model, max_tokens=steps, sampler=lambda logits: mx.argmax(logits, -1))
    return [(int(token), logprobs) for token, logprobs in tokens]
