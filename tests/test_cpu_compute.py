"""CPU compute: GEMM prefill computes what the quantized kernel does (the BLAS it runs on: test_python_alone.py)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from nightshift.engine.cpu_prefill import MIN_ROWS, PrefillQuantizedLinear, use_gemm_prefill, use_quantized_kernel
from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.runtime import open_model
from nightshift.engine.store.gguf_import import convert_gguf
from tests.helpers.gguf_files import write_tiny_llama


def _layer(seed: int = 0, dtype: mx.Dtype = mx.float16) -> nn.QuantizedLinear:
    """A 4-bit layer with float16 scales and biases, as converted GGUF layers have (or `dtype` ones)."""
    mx.random.seed(seed)
    layer = nn.QuantizedLinear.from_linear(nn.Linear(96, 64), group_size=32, bits=4)
    layer.scales, layer.biases = layer.scales.astype(dtype), layer.biases.astype(dtype)
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


def test_mxfp4_layers_take_the_gemm_path_with_their_byte_scales():
    """MXFP4 scales are bytes: the GEMM path dequantizes them as stored (float32 activations: the kernel's dtype)."""
    mx.random.seed(1)
    reference = nn.QuantizedLinear.from_linear(nn.Linear(96, 64, bias=False), group_size=32, bits=4, mode="mxfp4")
    switched = nn.QuantizedLinear.from_linear(nn.Linear(96, 64, bias=False), group_size=32, bits=4, mode="mxfp4")
    switched.update(reference.parameters())
    switched.__class__ = PrefillQuantizedLinear
    switched.instruments = Instruments()
    x = mx.random.normal((1, 200, 96))
    np.testing.assert_allclose(np.array(switched(x)), np.array(reference(x)), rtol=1e-5, atol=1e-5)
    assert switched.instruments.gemm_calls == 1


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_16bit_activations_keep_the_quantized_kernel_unless_float32_prefill_is_asked(dtype):
    """mlx-lm's 16-bit conversions: the kernel sums in 16 bits, so the default keeps it (bit for bit); the opt-in
    float32 GEMM gives other values, closer to the exact product."""
    reference, switched = _layer(dtype=dtype), _layer(dtype=dtype)
    for layer in (reference, switched):
        layer.bias = layer.bias.astype(dtype)  # every parameter 16-bit, as `convert --dtype` makes them
    switched.__class__ = PrefillQuantizedLinear
    x = mx.random.normal((1, 200, 96)).astype(dtype)
    want = reference(x)
    assert want.dtype == dtype
    np.testing.assert_array_equal(np.array(switched(x).astype(mx.float32)), np.array(want.astype(mx.float32)))
    switched.float32_prefill = True
    fast = switched(x)
    weight = mx.dequantize(reference.weight, reference.scales, reference.biases, 32, 4).astype(mx.float32)
    exact = np.array(x.astype(mx.float32), dtype=np.float64) @ np.array(weight, dtype=np.float64).T
    kernel_error = np.abs(np.array(want.astype(mx.float32)) - exact).max()
    fast_error = np.abs(np.array(fast.astype(mx.float32)) - exact).max()
    assert fast_error < kernel_error


def test_converted_model_gets_gemm_prefill_and_keeps_its_tokens(tmp_path):
    model_dir = convert_gguf(write_tiny_llama(tmp_path / "tiny.gguf"), tmp_path / "tiny")
    model = open_model(model_dir)
    classes = {type(m) for _, m in model.model.named_modules()}
    assert PrefillQuantizedLinear in classes and nn.QuantizedLinear not in classes
    prompt = list(range(3, 3 + 2 * MIN_ROWS))
    switched = [c.token for c in model.generate_tokens(prompt, max_tokens=12)]
    assert use_quantized_kernel(model.model) == 15  # 7 per layer, 2 layers, and the embedding (a tied head)
    quantized = [c.token for c in model.generate_tokens(prompt, max_tokens=12)]
    assert switched == quantized
    assert use_gemm_prefill(model.model) == 15
