"""Synthetic MoE checkpoints with seeded random weights, for tests and benchmarks.

A synthetic checkpoint is a real one as far as loaders are concerned: config.json,
sharded `model-*.safetensors` with an index, a byte-level BPE tokenizer. Routed
experts are written in the family's Hugging Face per-expert layout (Kimi K3's
packed MXFP4 `weight_packed`/`weight_scale` included) and MLA attention as one
`kv_b_proj`, so importing one goes through the family's `sanitize()` as a released
checkpoint does; the rest of the weights carry the names mlx-lm gives them (which
`sanitize()` keeps).
Written as a stream, one layer's shard at a time, each expert's bytes drawn as the shard is written, so a
checkpoint larger than RAM (the bench preset with `experts` raised) never sits in memory.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from nightshift.engine.errors import NightshiftError, UnsupportedModelError, did_you_mean
from nightshift.engine.store import routing_trace
from nightshift.engine.store.families import build_model, layer_of, switch_sites
from nightshift.engine.store.safetensors_io import NAME_OF, OutTensor, out_tensor, to_bytes, write_safetensors
from nightshift.engine.store.synth_families import FAMILIES, PRESETS, ExpertLayout

CALIBRATION_TEXT = Path(__file__).with_name("data") / "routing_prompts.txt"
EOS = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE trained on the calibration text shipped with nightshift."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([CALIBRATION_TEXT.read_text()], trainer)
    return tokenizer


def write_tokenizer(out: Path, vocab_size: int) -> int:
    """tokenizer.json and tokenizer_config.json in `out`; returns the eos token id."""
    tokenizer = build_tokenizer(vocab_size)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "bos_token": None,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tokenizer.token_to_id(EOS)


def mxfp4_shapes(shape: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """Shapes of the packed MXFP4 codes (two per byte) and E8M0 scales (one per 32) of a (rows, cols) weight."""
    rows, cols = shape
    return (rows, cols // 2), (rows, cols // 32)


def mxfp4_scales(shape: tuple[int, int]) -> np.ndarray:
    """E8M0 scales sized for unit-variance outputs: uniform FP4 codes have an RMS of ~2.9; aim for weights of
    RMS 1/sqrt(cols)."""
    exponent = 127 + round(math.log2(1 / (2.93 * math.sqrt(shape[1]))))
    return np.full(mxfp4_shapes(shape)[1], exponent, dtype=np.uint8)


def random_mxfp4(rng: np.random.Generator, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Random MXFP4 codes (two per byte) and E8M0 scales sized for unit-variance outputs."""
    return rng.integers(0, 256, size=mxfp4_shapes(shape)[0], dtype=np.uint8), mxfp4_scales(shape)


def _cast(array: mx.array, dtype: mx.Dtype) -> mx.array:
    return array.astype(dtype) if mx.issubdtype(array.dtype, mx.floating) else array


def check_synthesis(
    arch: str, preset: str, out: Path, skew: float = 0.0, routing: Path | None = None, experts: int | None = None
) -> None:
    """Refuse what `synthesize` cannot do, before anything is said or written."""
    if arch not in FAMILIES:
        raise UnsupportedModelError(f"no synthetic preset for {arch!r}{did_you_mean(arch, FAMILIES)} "
                                    f"(choose one of {', '.join(sorted(FAMILIES))})")  # fmt: skip
    if preset not in PRESETS:
        raise NightshiftError(
            f"unknown preset {preset!r}{did_you_mean(preset, PRESETS)} (choose one of {', '.join(PRESETS)})"
        )
    if skew < 0:
        raise NightshiftError("--skew must be 0 or more")
    active = PRESETS[preset][3]
    if experts is not None and experts < active:
        raise NightshiftError(f"--experts must be at least the {active} experts a token uses in preset {preset!r}")
    if routing is not None and (arch != "kimi_k3" or skew):
        raise NightshiftError("--routing replays a trace in a kimi_k3 model: give --arch kimi_k3 and no --skew")
    if Path(out).exists() and any(Path(out).iterdir()):
        raise NightshiftError(f"{out} already exists and is not empty; pick a new directory")


def synthesize(
    arch: str,
    preset: str,
    out: Path,
    seed: int = 0,
    skew: float = 0.0,
    layers: int | None = None,
    routing: Path | None = None,
    experts: int | None = None,
) -> Path:
    """Write a synthetic checkpoint of family `arch` at `preset` size into `out` (a new directory).

    `layers` overrides the preset's number of layers (the first is dense in families that have one).
    `routing`: a routing trace (engine/store/routing_trace.py) the model's routers replay instead of
    routing at random: a `kimi_k3_replay` checkpoint (kimi_k3 only), its k the trace's scaled to the preset.
    `experts` overrides the preset's routed experts per MoE layer; the experts a token uses stay the preset's,
    so the bytes a token reads stay the same while the checkpoint grows (a size ladder, a model larger than RAM).
    """
    check_synthesis(arch, preset, out, skew, routing, experts)
    out = Path(out)
    family = FAMILIES[arch]
    hidden, preset_layers, preset_experts, active, expert_hidden, vocab = PRESETS[preset]
    config = family.config(hidden, layers or preset_layers, experts or preset_experts, active, expert_hidden, vocab)
    replay = _replay(config, routing) if routing is not None else None
    mx.random.seed(seed)
    model = build_model(config)
    sites = {site.path: site for site in switch_sites(model)}
    cast = getattr(model, "cast_predicate", lambda path: True)
    rng = np.random.default_rng(seed)

    # Group the trunk's tensors by layer; experts are generated per layer.
    trunk: dict[int | None, list[tuple[str, mx.array]]] = {}
    for name, value in tree_flatten(model.parameters()):
        if not any(name.startswith(path + ".") for path in sites):
            trunk.setdefault(layer_of(name), []).append((name, value))
    layers = [*sorted(k for k in trunk if k is not None), None]
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    weight_map = {}
    for number, layer in enumerate(layers, 1):
        tensors: list[OutTensor] = []
        layer_sites = [s for s in sites.values() if s.layer == layer]
        hot = {s.path: _hot_rows(rng, s.num_experts, skew) for s in layer_sites}
        for name, value in _released_names(trunk[layer]):
            value = _skewed(name, value, hot)
            value = replay.tensor(name, value) if replay is not None else value
            value = _cast(value, family.dtype) if cast(name) else value
            mx.eval(value)
            tensors.append(out_tensor(name, value))
        for site in layer_sites:
            tensors += _expert_tensors(model, site, family, rng)
        shard = f"model-{number:05d}-of-{len(layers):05d}.safetensors"
        write_safetensors(staging / shard, tensors, metadata={"format": "pt"})
        weight_map.update({t.name: shard for t in tensors})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (staging / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    config["eos_token_id"] = write_tokenizer(staging, config["vocab_size"])
    (staging / "config.json").write_text(json.dumps(config, indent=2))
    if out.exists():
        out.rmdir()
    staging.rename(out)
    return out


@dataclass(frozen=True)
class _Replay:
    """A trace scaled to a kimi_k3_replay model: the gates' `chosen`/`guessed` tables, by MoE layer."""

    scaled: routing_trace.Scaled
    moe_layers: list[int]  # decoder layers with routed experts, in order

    def tensor(self, name: str, value: mx.array) -> mx.array:
        """The replay table for a gate's `chosen`/`guessed` tensor; any other tensor as it is."""
        table = name.rsplit(".", 1)[-1]
        if ".mlp.gate." not in name or table not in ("chosen", "guessed"):
            return value
        moe = self.moe_layers.index(layer_of(name))
        values = self.scaled.chosen if table == "chosen" else self.scaled.guessed
        return mx.array(routing_trace.padded(values, self.scaled.offsets, moe)).astype(value.dtype)


def _replay(config: dict, trace_file: Path) -> _Replay:
    """Turn a kimi_k3 `config` into a kimi_k3_replay one that replays `trace_file` (in place), scaled to it."""
    trace = routing_trace.load(trace_file)
    first_moe = config["first_k_dense_replace"]
    moe_layers = list(range(first_moe, config["num_hidden_layers"]))
    scaled = routing_trace.scale(trace, config["num_experts"], len(moe_layers))
    config.update(
        model_type="kimi_k3_replay",
        num_experts_per_token=trace.k * scaled.factor,
        replay_lengths=trace.lengths,
        replay_source={
            "trace": Path(trace_file).name, "model": trace.meta.get("model"), "experts": trace.experts,
            "k": trace.k, "expert_factor": scaled.factor, "layers": scaled.source_layers,
        },
    )  # fmt: skip
    return _Replay(scaled, moe_layers)


def _released_names(tensors: list[tuple[str, mx.array]]) -> list[tuple[str, mx.array]]:
    """MLA attention as checkpoints ship it: one `kv_b_proj` where mlx-lm splits `embed_q`/`unembed_out`.

    kv_b_proj holds, per head, the key rows (qk_nope) then the value rows (v_head), each kv_lora wide.
    """
    named = dict(tensors)
    out = []
    for name, value in tensors:
        if name.endswith("self_attn.unembed_out.weight"):
            continue
        if name.endswith("self_attn.embed_q.weight"):
            values = named[name.replace("embed_q", "unembed_out")]  # (heads, v_head, kv_lora)
            keys = value.swapaxes(-1, -2)  # (heads, qk_nope, kv_lora)
            joined = mx.concatenate([keys, values], axis=1)
            out.append((name.replace("embed_q", "kv_b_proj"), joined.reshape(-1, joined.shape[-1])))
            continue
        out.append((name, value))
    return out


def _hot_rows(rng: np.random.Generator, num_experts: int, skew: float) -> np.ndarray:
    """Router-row scale per expert: one expert in eight (seeded choice) gets 1 + skew."""
    scale = np.ones(num_experts, dtype=np.float32)
    if skew > 0:
        scale[rng.permutation(num_experts)[: max(1, num_experts // 8)]] = 1 + skew
    return scale


def _skewed(name: str, value: mx.array, hot: dict[str, np.ndarray]) -> mx.array:
    """Scale the router rows of hot experts: a router row with a larger norm wins top-k more often."""
    for path, scale in hot.items():
        parent = path.rsplit(".", 1)[0]
        if (
            name.startswith(parent + ".")
            and value.ndim == 2
            and value.shape[0] == len(scale)
            and name.endswith("weight")
        ):
            return value * mx.array(scale)[:, None]
    return value


def _expert_tensors(model, site, family: ExpertLayout, rng: np.random.Generator) -> list[OutTensor]:
    """The routed experts of one site, in the family's checkpoint layout, each drawn from `rng` when it is written
    (in the order listed, so the weights are the same as drawing them all first)."""
    module = dict(tree_flatten(model.parameters()))
    layer_prefix = site.path[: site.path.index(f"layers.{site.layer}.") + len(f"layers.{site.layer}.")]
    if family.template is None:
        return _fused_gate_up_experts(module, site, rng)
    tensors = []
    for proj in site.projections:
        rows, cols = module[f"{site.path}.{proj}.weight"].shape[1:]
        for e in range(site.num_experts):
            key = layer_prefix + family.template.format(e=e, proj=family.renames.get(proj, proj))
            if family.mxfp4:
                packed, scales = mxfp4_shapes((rows, cols))
                tensors += [
                    OutTensor(f"{key}.weight_packed", "U8", packed, partial(_random_codes, rng, packed)),
                    OutTensor(f"{key}.weight_scale", "U8", scales, partial(_scale_bytes, (rows, cols))),
                ]
            else:
                produce = partial(_normal, rng, (rows, cols), family)
                tensors.append(OutTensor(f"{key}.weight", NAME_OF[family.dtype], (rows, cols), produce))
    return tensors


def _fused_gate_up_experts(module: dict, site, rng: np.random.Generator) -> list[OutTensor]:
    """gpt_oss's layout: all experts of a layer stacked, gate and up rows interleaved in one
    `gate_up_proj`, MXFP4 as 16-byte blocks of 32 codes, a bias per projection."""
    inner, hidden = module[f"{site.path}.gate_proj.weight"].shape[1:]
    experts = site.num_experts
    gate = [random_mxfp4(rng, (inner, hidden)) for _ in range(experts)]
    up = [random_mxfp4(rng, (inner, hidden)) for _ in range(experts)]
    down = [random_mxfp4(rng, (hidden, inner)) for _ in range(experts)]

    def interleave(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.empty((a.shape[0] * 2, *a.shape[1:]), dtype=a.dtype)
        out[0::2], out[1::2] = a, b
        return out

    def blocks(codes: list[np.ndarray]) -> np.ndarray:
        stacked = np.stack(codes)
        return stacked.reshape(*stacked.shape[:-1], stacked.shape[-1] // 16, 16)

    def bias(rows: int) -> mx.array:
        return mx.array(rng.normal(0, 0.02, size=(experts, rows)).astype(np.float32)).astype(mx.bfloat16)

    prefix = site.path
    return [
        out_tensor(
            f"{prefix}.gate_up_proj_blocks", mx.array(blocks([interleave(g[0], u[0]) for g, u in zip(gate, up)]))
        ),
        out_tensor(
            f"{prefix}.gate_up_proj_scales", mx.array(np.stack([interleave(g[1], u[1]) for g, u in zip(gate, up)]))
        ),
        out_tensor(f"{prefix}.gate_up_proj_bias", bias(2 * inner)),
        out_tensor(f"{prefix}.down_proj_blocks", mx.array(blocks([d[0] for d in down]))),
        out_tensor(f"{prefix}.down_proj_scales", mx.array(np.stack([d[1] for d in down]))),
        out_tensor(f"{prefix}.down_proj_bias", bias(hidden)),
    ]


def _random_codes(rng: np.random.Generator, shape: tuple[int, int]) -> memoryview:
    return memoryview(rng.integers(0, 256, size=shape, dtype=np.uint8)).cast("B")


def _scale_bytes(shape: tuple[int, int]) -> bytes:
    return mxfp4_scales(shape).tobytes()


def _normal(rng: np.random.Generator, shape: tuple[int, int], family: ExpertLayout) -> memoryview:
    values = rng.normal(0, 1 / math.sqrt(shape[1]), size=shape).astype(np.float32)
    return to_bytes(_cast(mx.array(values), family.dtype))
