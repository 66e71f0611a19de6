"""The tokenizer rebuilt from GGUF metadata: round trips, special tokens, digits, chat template."""

from __future__ import annotations

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from nightshift.engine.errors import UnsupportedModelError
from nightshift.engine.store.gguf_import import GGUFFile, convert_gguf
from nightshift.engine.store.gguf_tokenizer import build_tokenizer
from tests.helpers.gguf_files import write_tiny_llama

TEXTS = [
    "hello world",
    "héllo wörld — naïve café",
    "数字 日本語 한국어 🙂🚀",
    "tabs\tand\nnew lines\r\n  and   spaces ",
    "Total 1234.56 EUR, -7,89",
    "",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    path = write_tiny_llama(root / "tiny.gguf")
    return GGUFFile(path), convert_gguf(path, root / "model")


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tiny, text):
    gguf_file, _ = tiny
    tokenizer = build_tokenizer(gguf_file.vocab())
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == text


def test_merges_apply_and_digits_split(tiny):
    gguf_file, _ = tiny
    vocab = gguf_file.vocab()
    tokenizer = build_tokenizer(vocab)
    pieces = [vocab.tokens[i] for i in tokenizer.encode(" the 2024").ids]
    assert pieces == ["Ġthe", "Ġ", "2", "0", "2", "4"]


def test_special_tokens_are_single_ids(tiny):
    gguf_file, _ = tiny
    vocab = gguf_file.vocab()
    tokenizer = build_tokenizer(vocab)
    ids = tokenizer.encode("<|im_start|>user<|im_end|>").ids
    assert ids[0] == vocab.tokens.index("<|im_start|>")
    assert ids[-1] == vocab.tokens.index("<|im_end|>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user"


def test_chat_template_from_gguf_metadata(tiny):
    _, model_dir = tiny
    tokenizer = load_tokenizer(model_dir)
    messages = [{"role": "user", "content": "Reconcile März 🙂"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nReconcile März 🙂<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == "<|im_end|>"


def test_unknown_pre_tokenizer_is_refused(tiny):
    gguf_file, _ = tiny
    vocab = gguf_file.vocab()
    vocab.pre = "some-new-regex"
    with pytest.raises(UnsupportedModelError, match="some-new-regex"):
        build_tokenizer(vocab)
