"""The converted default model against llama.cpp on the same GGUF: same tokens, same greedy output.

Needs llama-cpp-python, either importable here or in the interpreter named by
NIGHTSHIFT_LLAMA_CPP_PYTHON (it is not a nightshift dependency); skips otherwise.
llama.cpp quantizes activations to 8 bits for its dot products, so where the two
greedy outputs part, the step must be a near-tie in llama.cpp's logits, and the
exact float64 math (tests/helpers/llama_reference.py) must side with nightshift.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from mlx_lm import stream_generate

from nightshift.engine.bench.peer import llama_cpp_python
from nightshift.engine.runtime import open_model
from tests.helpers.llama_reference import Float64Llama

pytestmark = [pytest.mark.model, pytest.mark.slow]

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about SSDs.",
    "List three things to check in a month-end bank reconciliation.",
    "Explain what a Mixture-of-Experts model is in two sentences.",
    "Translate 'good morning' into French, German and Spanish.",
]
MAX_TOKENS = 48
# Largest gap between llama.cpp's top two logits accepted where the outputs part.
NEAR_TIE = 0.5


def _llama_cpp_python() -> str:
    if (python := llama_cpp_python()) is None:
        pytest.skip("llama.cpp is absent: install llama-cpp-python or set NIGHTSHIFT_LLAMA_CPP_PYTHON")
    return python


@pytest.fixture(scope="module")
def comparison(default_model_dir, default_gguf):
    """Per prompt: its ids, nightshift's greedy tokens, llama.cpp's answer."""
    python = _llama_cpp_python()
    model = open_model(default_model_dir)
    requests, ours = [], []
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        ids = model.chat_tokens(messages)
        text = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        requests.append({"ids": ids, "text": text, "max_tokens": MAX_TOKENS})
        ours.append([r.token for r in stream_generate(model.model, model.tokenizer, ids, max_tokens=MAX_TOKENS)])
    result = subprocess.run(
        [python, str(Path(__file__).with_name("llama_cpp_reference.py")), str(default_gguf)],
        input=json.dumps({"prompts": requests}), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout)["answers"]
    return [
        (prompt, request["ids"], tokens, answer)
        for prompt, request, tokens, answer in zip(PROMPTS, requests, ours, answers)
    ]


def test_tokenization_matches_llama_cpp(comparison):
    for prompt, ids, _, theirs in comparison:
        assert ids == theirs["tokenized"], prompt


def test_greedy_output_matches_llama_cpp_or_parts_at_a_near_tie(comparison, default_gguf, record_property):
    exact = Float64Llama(default_gguf)
    for prompt, ids, tokens, theirs in comparison:
        expected = theirs["tokens"]
        step = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), None)
        if step is None:
            assert tokens == expected, prompt
            record_property(prompt, f"identical, {len(tokens)} tokens")
            continue
        (_, first), (_, second) = theirs["top2"][step]
        logits = exact.last_logits(ids + tokens[:step])
        record_property(
            prompt,
            f"part at step {step}: nightshift {tokens[step]}, llama.cpp {expected[step]}; "
            f"llama.cpp top-2 gap {first - second:.3f}; float64 logits {logits[tokens[step]]:.4f} "
            f"vs {logits[expected[step]]:.4f}",
        )
        assert first - second < NEAR_TIE, (prompt, step, first - second)
        assert int(np.argmax(logits)) == tokens[step], (prompt, step, "exact math sides with llama.cpp")
