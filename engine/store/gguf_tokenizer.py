"""A Hugging Face `tokenizer.json` rebuilt from the vocabulary a GGUF file carries.

GGUF files keep the tokenizer as metadata (tokens, token types, merges, the
pre-tokenizer's name). We rebuild the same byte-level BPE with the `tokenizers`
library so mlx-lm (through transformers) loads it from disk, offline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from nightshift.engine.errors import UnsupportedModelError

# GGUF token types (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# The split pattern GPT-2 style byte-level BPE applies before merging.
_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"""


def _byte_level() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_byte_level() -> pre_tokenizers.PreTokenizer:
    # Every digit is its own piece before the GPT-2 split (llama.cpp's "\p{N}" rule).
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"), _byte_level()])


# GGUF `tokenizer.ggml.pre` names -> the pre-tokenizer llama.cpp applies for them.
PRE_TOKENIZERS = {
    "default": _byte_level,
    "gpt2": _byte_level,
    "smollm": _digits_then_byte_level,
    "starcoder": _digits_then_byte_level,
}


@dataclass
class GGUFVocab:
    """The tokenizer part of a GGUF file's metadata."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    model: str = "gpt2"
    pre: str = "default"
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None
    context_length: int = 2048


def build_tokenizer(vocab: GGUFVocab) -> Tokenizer:
    """Build the byte-level BPE tokenizer the GGUF vocabulary describes."""
    if vocab.model != "gpt2":
        raise UnsupportedModelError(
            f"GGUF tokenizer model {vocab.model!r} is not supported (only byte-level BPE, 'gpt2'); "
            "use a model whose GGUF has tokenizer.ggml.model = gpt2"
        )
    if vocab.pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"GGUF pre-tokenizer {vocab.pre!r} is not supported; known: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    ids = {token: i for i, token in enumerate(vocab.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in vocab.merges]
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[vocab.pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    bos = _token(vocab, vocab.bos_id)
    if vocab.add_bos and bos is not None:
        tokenizer.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab.bos_id)]
                ),
            ]
        )
    added = [
        AddedToken(token, special=kind == CONTROL, normalized=False)
        for token, kind in zip(vocab.tokens, vocab.token_types)
        if kind in (CONTROL, USER_DEFINED)
    ]
    tokenizer.add_tokens(added)
    return tokenizer


def _token(vocab: GGUFVocab, index: int | None) -> str | None:
    return vocab.tokens[index] if index is not None and 0 <= index < len(vocab.tokens) else None


def tokenizer_config(vocab: GGUFVocab) -> dict:
    """The `tokenizer_config.json` transformers reads next to `tokenizer.json`."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": _token(vocab, vocab.bos_id),
        "eos_token": _token(vocab, vocab.eos_id),
        "unk_token": _token(vocab, vocab.unk_id),
        "pad_token": _token(vocab, vocab.pad_id),
        "add_bos_token": vocab.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": vocab.context_length,
    }
    if vocab.chat_template:
        config["chat_template"] = vocab.chat_template
    return {k: v for k, v in config.items() if v is not None}


def write_tokenizer(vocab: GGUFVocab, out_dir: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json into a model directory."""
    build_tokenizer(vocab).save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(vocab), indent=2))
