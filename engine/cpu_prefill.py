"""Quantized linear layers that multiply many rows at once through float GEMM on the CPU.

MLX's CPU quantized kernels run at ~1 GMAC/s and gain nothing from more rows, while
float GEMM through a real BLAS (see `cpu_blas`) is ~30x faster. For a prefill chunk
(many rows) a layer therefore dequantizes its weight and uses a matmul; a decode step
(one row) keeps the quantized kernel, which is faster there. Same math, float32 either
way; only the summation order differs.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

# Below this many rows the quantized kernel wins (measured on this machine's 2 cores).
MIN_ROWS = 32


class PrefillQuantizedLinear(nn.QuantizedLinear):
    """`nn.QuantizedLinear` with a dequantized-GEMM path for inputs of MIN_ROWS rows or more."""

    # Layer calls that took the GEMM path, over all layers: the counter a benchmark shows to prove it fired.
    gemm_calls = 0

    def __call__(self, x: mx.array) -> mx.array:
        if x.size // x.shape[-1] < MIN_ROWS:
            return super().__call__(x)
        PrefillQuantizedLinear.gemm_calls += 1
        # Float32 scales: MLX dequantizes in the scales' dtype, and float16 would round the weights.
        biases = self.get("biases")
        weight = mx.dequantize(
            self["weight"],
            self["scales"].astype(mx.float32),
            None if biases is None else biases.astype(mx.float32),
            self.group_size,
            self.bits,
            mode=self.mode,
        )
        y = (x @ weight.T).astype(x.dtype)
        return y + self["bias"] if "bias" in self else y


def use_gemm_prefill(model: nn.Module) -> int:
    """Give every quantized linear layer of `model` the GEMM prefill path when MLX runs on the CPU.

    The layers keep their parameters and paths (only their class changes), so weights load
    and save as before. Returns how many layers were switched.
    """
    if mx.default_device() != mx.cpu:
        return 0
    switched = 0
    for _, module in model.named_modules():
        if type(module) is nn.QuantizedLinear:
            module.__class__ = PrefillQuantizedLinear
            switched += 1
    return switched


def use_quantized_kernel(model: nn.Module) -> int:
    """Undo `use_gemm_prefill` (for side-by-side measurements); returns how many layers were switched back."""
    switched = 0
    for _, module in model.named_modules():
        if type(module) is PrefillQuantizedLinear:
            module.__class__ = nn.QuantizedLinear
            switched += 1
    return switched
