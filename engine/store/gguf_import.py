"""Convert a GGUF file into a model directory mlx-lm loads from disk.

The directory holds `config.json`, `model.safetensors` (quantized tensors kept
quantized, see `gguf_quant`), `tokenizer.json`, `tokenizer_config.json` with the
chat template, and `nightshift.json` recording where it came from. It is built in
a temporary sibling directory and renamed into place only when complete, so a
crash or a full disk never leaves a directory that looks like a model.

GGUF stores llama's Q and K projections with their rows permuted for llama.cpp's
rotary embedding (pairs of adjacent dimensions rotate together). We undo that
permutation, which is a pure row reorder and therefore exact on quantized rows,
so the result is the usual Hugging Face layout that mlx-lm's `llama` expects.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from nightshift.engine.errors import ModelFormatError, NoSpaceError, UnsupportedModelError
from nightshift.engine.store.gguf_quant import GROUP_SIZE, QUANT_BITS, Quantized, convert_quantized
from nightshift.engine.store.gguf_tokenizer import GGUFVocab, write_tokenizer

MARKER = "nightshift.json"
# Bumped whenever the converter's output changes, so older conversions are redone.
CONVERTER_VERSION = 2
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Architecture:
    """How one GGUF architecture maps onto an mlx-lm model family."""

    model_type: str
    config: Callable[[GGUFFile], dict]
    tensor_names: dict[str, str]
    layer_tensor_names: dict[str, str]


class GGUFFile:
    """A parsed GGUF file: metadata fields and tensors, with errors that name the file."""

    def __init__(self, path: Path):
        from gguf import GGUFReader

        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFormatError(f"GGUF file not found: {self.path}")
        try:
            self.reader = GGUFReader(str(self.path))
        except Exception as exc:  # the reader raises a mix of ValueError, struct and numpy errors
            raise ModelFormatError(
                f"{self.path} is not a readable GGUF file ({type(exc).__name__}: {exc}); "
                "it may be truncated or corrupt: download it again"
            ) from exc

    def get(self, key: str, default=None):
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str):
        value = self.get(key)
        if value is None:
            raise ModelFormatError(f"{self.path} lacks the metadata field {key!r}")
        return value

    @property
    def architecture(self) -> str:
        return self.require("general.architecture")

    def tensors(self) -> Iterator:
        return iter(self.reader.tensors)

    def vocab(self) -> GGUFVocab:
        arch = self.architecture
        return GGUFVocab(
            tokens=self.require("tokenizer.ggml.tokens"),
            token_types=self.require("tokenizer.ggml.token_type"),
            merges=self.get("tokenizer.ggml.merges", []),
            model=self.require("tokenizer.ggml.model"),
            pre=self.get("tokenizer.ggml.pre", "default"),
            bos_id=self.get("tokenizer.ggml.bos_token_id"),
            eos_id=self.get("tokenizer.ggml.eos_token_id"),
            unk_id=self.get("tokenizer.ggml.unknown_token_id"),
            pad_id=self.get("tokenizer.ggml.padding_token_id"),
            add_bos=bool(self.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=self.get("tokenizer.chat_template"),
            context_length=int(self.require(f"{arch}.context_length")),
        )


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _architecture(gguf: GGUFFile) -> Architecture:
    arch = gguf.architecture
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{gguf.path}: GGUF architecture {arch!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    return ARCHITECTURES[arch]


def llama_config(gguf: GGUFFile) -> dict:
    """The mlx-lm `config.json` for a llama-architecture GGUF."""
    a = "llama"
    heads = int(gguf.require(f"{a}.attention.head_count"))
    hidden = int(gguf.require(f"{a}.embedding_length"))
    names = {t.name for t in gguf.tensors()}
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": int(gguf.require(f"{a}.block_count")),
        "intermediate_size": int(gguf.require(f"{a}.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(gguf.get(f"{a}.attention.head_count_kv", heads)),
        "head_dim": int(gguf.get(f"{a}.rope.dimension_count", hidden // heads)),
        "rms_norm_eps": float(gguf.require(f"{a}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(gguf.get(f"{a}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(gguf.require(f"{a}.context_length")),
        "vocab_size": len(gguf.require("tokenizer.ggml.tokens")),
        "tie_word_embeddings": "output.weight" not in names,
        "rope_traditional": False,
    }


LLAMA = Architecture(
    model_type="llama",
    config=llama_config,
    tensor_names={
        "token_embd.weight": "model.embed_tokens",
        "output_norm.weight": "model.norm",
        "output.weight": "lm_head",
    },
    layer_tensor_names={
        "attn_norm.weight": "input_layernorm",
        "ffn_norm.weight": "post_attention_layernorm",
        "attn_q.weight": "self_attn.q_proj",
        "attn_k.weight": "self_attn.k_proj",
        "attn_v.weight": "self_attn.v_proj",
        "attn_output.weight": "self_attn.o_proj",
        "ffn_gate.weight": "mlp.gate_proj",
        "ffn_up.weight": "mlp.up_proj",
        "ffn_down.weight": "mlp.down_proj",
    },
)

ARCHITECTURES = {"llama": LLAMA}


def rotary_unpermutation(rows: int, heads: int) -> np.ndarray:
    """Row order that turns llama.cpp's interleaved-rotary Q/K rows back into HF order.

    llama.cpp stores row (h, i, j) -- head h, pair i, member j -- at h*D + 2*i + j;
    the HF layout keeps it at h*D + j*D/2 + i.
    """
    per_head = rows // heads
    return np.arange(rows).reshape(heads, per_head // 2, 2).swapaxes(1, 2).reshape(-1)


def _float_tensor(type_name: str, data: np.ndarray, shape: tuple[int, ...]) -> mx.array:
    if type_name == "BF16":
        return mx.array(np.ascontiguousarray(data).view(np.uint16).reshape(shape)).view(mx.bfloat16)
    return mx.array(np.ascontiguousarray(data).reshape(shape))


def _target_name(arch: Architecture, gguf_name: str) -> str:
    if gguf_name in arch.tensor_names:
        return arch.tensor_names[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in arch.layer_tensor_names:
        return f"model.layers.{parts[1]}.{arch.layer_tensor_names[parts[2]]}"
    raise UnsupportedModelError(f"GGUF tensor {gguf_name!r} has no place in an mlx-lm {arch.model_type} model")


def convert_tensors(gguf: GGUFFile, config: dict, progress: Progress | None = None) -> tuple[dict, dict]:
    """All tensors as MLX arrays under mlx-lm names, plus the per-module quantization map."""
    arch = _architecture(gguf)
    weights: dict[str, mx.array] = {}
    quantization: dict[str, dict] = {}
    heads = {"attn_q.weight": config["num_attention_heads"], "attn_k.weight": config["num_key_value_heads"]}
    for tensor in gguf.tensors():
        name = _target_name(arch, tensor.name)
        type_name = tensor.tensor_type.name
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the innermost dimension first
        permute_heads = heads.get(tensor.name.split(".", 2)[-1])
        try:
            if type_name in QUANT_BITS:
                q: Quantized = convert_quantized(type_name, tensor.data, shape[0])
                if permute_heads:
                    q = q.take_rows(rotary_unpermutation(shape[0], permute_heads))
                # MLX returns embedding rows in the scales' dtype, which then sets the residual
                # stream's dtype: widen (exactly) to float32 there so the model computes in float32.
                scale_type = np.float32 if name == arch.tensor_names["token_embd.weight"] else np.float16
                weights[f"{name}.weight"] = mx.array(q.weight)
                weights[f"{name}.scales"] = mx.array(q.scales.astype(scale_type))
                weights[f"{name}.biases"] = mx.array(q.biases.astype(scale_type))
                quantization[name] = {"group_size": GROUP_SIZE, "bits": q.bits}
            elif type_name in ("F32", "F16", "BF16"):
                array = _float_tensor(type_name, tensor.data, shape)
                if permute_heads:
                    array = array[mx.array(rotary_unpermutation(shape[0], permute_heads))]
                weights[f"{name}.weight"] = array
            else:
                raise UnsupportedModelError(
                    f"{gguf.path}: tensor {tensor.name} is {type_name}, which has no exact MLX form; "
                    "nightshift converts F32, F16, BF16, Q4_1 and Q8_0"
                )
        except ValueError as exc:
            raise ModelFormatError(f"{gguf.path}: tensor {tensor.name} is malformed: {exc}") from exc
        if progress:
            progress(tensor.name)
    return weights, quantization


def quantization_config(per_module: dict[str, dict]) -> dict:
    """mlx-lm's quantization entry: the most common setting, plus the modules that differ."""
    bits = [q["bits"] for q in per_module.values()] or [4]
    default = {"group_size": GROUP_SIZE, "bits": max(set(bits), key=bits.count), "mode": "affine"}
    exceptions = {name: q for name, q in per_module.items() if q["bits"] != default["bits"]}
    return {**default, **exceptions}


def _needed_bytes(gguf: GGUFFile) -> int:
    """Room the converted directory needs: the tensors plus tokenizer and slack."""
    return int(sum(int(t.n_bytes) for t in gguf.tensors()) * 1.05) + (32 << 20)


def require_free_space(where: Path, needed: int, purpose: str) -> None:
    """Refuse, before writing anything, when `where` has less than `needed` bytes free for `purpose`."""
    free = shutil.disk_usage(where).free
    if free < needed:
        raise NoSpaceError(
            f"not enough free space in {where} {purpose}: {needed / 1e6:.0f} MB needed, {free / 1e6:.0f} MB free; "
            "free some space or set NIGHTSHIFT_HOME to a directory on a larger drive"
        )


def convert_gguf(gguf_path: Path, out_dir: Path, progress: Progress | None = None) -> Path:
    """Convert `gguf_path` into the model directory `out_dir`, atomically."""
    gguf = GGUFFile(gguf_path)
    arch = _architecture(gguf)
    config = arch.config(gguf)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    require_free_space(out_dir.parent, _needed_bytes(gguf), f"to convert {gguf.path.name}")
    vocab = gguf.vocab()

    staging = out_dir.with_name(f".{out_dir.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        weights, quantization = convert_tensors(gguf, config, progress)
        config["quantization"] = quantization_config(quantization)
        mx.save_safetensors(str(staging / "model.safetensors"), weights, metadata={"format": "mlx"})
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        write_tokenizer(vocab, staging)
        marker = {
            "source": str(Path(gguf_path).resolve()),
            "source_sha256": sha256_of(gguf_path),
            "converter_version": CONVERTER_VERSION,
        }
        (staging / MARKER).write_text(json.dumps(marker, indent=2))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if exc.errno == 28:  # ENOSPC: the estimate was beaten by another writer
            raise NoSpaceError(f"ran out of space writing {out_dir}: {exc}") from exc
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def is_converted_from(model_dir: Path, gguf_sha256: str) -> bool:
    """True when `model_dir` is a complete conversion, by this converter, of the GGUF with that digest."""
    marker = Path(model_dir) / MARKER
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return recorded.get("source_sha256") == gguf_sha256 and recorded.get("converter_version") == CONVERTER_VERSION
