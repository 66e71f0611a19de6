"""CPU compute: GEMM prefill computes what the quantized kernel does (the BLAS it runs on: test_python_alone.py)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from nightshift.engine.cpu_prefill import MIN_ROWS, PrefillQuantizedLinear, use_gemm_prefill, use_quantized_kernel
from nightshift.engine.runtime import open_model
from nightshift.engine.store.gguf_import import convert_gguf
from tests.helpers.gguf_files import write_tiny_llama


def _layer(seed: int = 0) -> nn.QuantizedLinear:
    """A 4-bit layer with float16 scales and biases, as converted GGUF layers have."""
    mx.random.seed(seed)
    layer = nn.QuantizedLinear.from_linear(nn.Linear(96, 64), group_size=32, bits=4)
    layer.scales, layer.biases = layer.scales.astype(mx.float16), layer.biases.astype(mx.float16)
    return layer


@pytest.mark.parametrize("rows", [1, MIN_ROWS - 1, MIN_ROWS, 200])
def test_gemm_prefill_matches_the_quantized_kernel(rows):
    reference = _layer()
    switched = _layer()
    switched.__class__ = PrefillQuantizedLinear
    x = mx.random.normal((1, rows, 96))
    want, got = np.array(reference(x)), np.array(switched(x))
    if rows < MIN_ROWS:
        np.testing.assert_array_equal(got, want)  # the same kernel
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_converted_model_gets_gemm_prefill_and_keeps_its_tokens(tmp_path):
    model_dir = convert_gguf(write_tiny_llama(tmp_path / "tiny.gguf"), tmp_path / "tiny")
    model = open_model(model_dir)
    classes = {type(m) for _, m in model.model.named_modules()}
    assert PrefillQuantizedLinear in classes and nn.QuantizedLinear not in classes
    prompt = list(range(3, 3 + 2 * MIN_ROWS))
    switched = [c.token for c in model.generate_tokens(prompt, max_tokens=12)]
    assert use_quantized_kernel(model.model) == 14  # 7 per layer, 2 layers
    quantized = [c.token for c in model.generate_tokens(prompt, max_tokens=12)]
    assert switched == quantized
    assert use_gemm_prefill(model.model) == 14
