"""The converted default model against llama.cpp on the same GGUF: same tokens, same greedy output.

Needs llama-cpp-python, either importable here or in the interpreter named by
NIGHTSHIFT_LLAMA_CPP_PYTHON (it is not a nightshift dependency); skips otherwise.
Where the two outputs part, llama.cpp quantizes activations to 8 bits, so the
first differing step must be a near-tie in both models.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from app.default_model import default_gguf_path
from engine import open_model
from tests.conftest import REAL_DATA_DIR

pytestmark = [pytest.mark.model, pytest.mark.slow]

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about SSDs.",
    "List three things to check in a month-end bank reconciliation.",
    "Explain what a Mixture-of-Experts model is in two sentences.",
    "Translate 'good morning' into French, German and Spanish.",
]
MAX_TOKENS = 48
# Largest gap between the top two logits (in either model) accepted where the outputs part.
NEAR_TIE = 0.5


def _llama_cpp_python() -> str:
    if python := os.environ.get("NIGHTSHIFT_LLAMA_CPP_PYTHON"):
        return python
    if importlib.util.find_spec("llama_cpp") is not None:
        return sys.executable
    pytest.skip("llama.cpp is absent: install llama-cpp-python or set NIGHTSHIFT_LLAMA_CPP_PYTHON")


def _ours(model, ids: list[int]) -> tuple[list[int], list[float]]:
    """Greedy tokens and, per step, the gap between the top two logits (log-prob gaps are logit gaps)."""
    from mlx_lm import stream_generate

    tokens, gaps = [], []
    for response in stream_generate(model.model, model.tokenizer, ids, max_tokens=MAX_TOKENS):
        top = mx.sort(response.logprobs)[-2:].tolist()
        tokens.append(response.token)
        gaps.append(top[1] - top[0])
    return tokens, gaps


@pytest.fixture(scope="module")
def comparison(default_model_dir):
    python = _llama_cpp_python()
    model = open_model(default_model_dir)
    requests, ours = [], []
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        ids = model.chat_tokens(messages)
        text = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        requests.append({"ids": ids, "text": text, "max_tokens": MAX_TOKENS})
        ours.append((ids, *_ours(model, ids)))
    gguf = str(REAL_DATA_DIR / default_gguf_path().relative_to(default_gguf_path().parents[1]))
    result = subprocess.run(
        [python, str(Path(__file__).with_name("llama_cpp_reference.py")), gguf],
        input=json.dumps({"prompts": requests}), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return list(zip(PROMPTS, ours, json.loads(result.stdout)["answers"]))


def test_tokenization_matches_llama_cpp(comparison):
    for prompt, (ids, _, _), theirs in comparison:
        assert ids == theirs["tokenized"], prompt


def test_greedy_output_matches_llama_cpp_or_parts_at_a_near_tie(comparison, record_property):
    for prompt, (_, tokens, gaps), theirs in comparison:
        expected = theirs["tokens"]
        same = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), None)
        if same is None:
            assert tokens == expected, prompt
            record_property(prompt, f"identical, {len(tokens)} tokens")
            continue
        (_, first), (_, second) = theirs["top2"][same]
        record_property(prompt, f"part at step {same}: ours gap {gaps[same]:.3f}, llama.cpp gap {first - second:.3f}")
        assert gaps[same] < NEAR_TIE and first - second < NEAR_TIE, (prompt, same, gaps[same], first - second)
