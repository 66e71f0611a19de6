"""Linear layers that multiply many rows at once through float GEMM on the CPU.

MLX's CPU quantized kernels run at ~1 GMAC/s and gain nothing from more rows, while
float GEMM through a real BLAS (see `cpu_blas`) is ~30x faster. For a prefill chunk
(many rows) a layer therefore dequantizes its weight and uses a matmul; a decode step
(one row) keeps the quantized kernel, which is faster there. Same math, float32 either
way; only the summation order differs.

The routed experts' switch layers (mlx-lm's `QuantizedSwitchLinear`, `SwitchLinear`) do the same:
for a pass of many rows, the rows are grouped by expert on the host, each expert's weight is
dequantized once and its rows go through one GEMM, and the outputs are put back in the rows' order.
(`gather_qmm` and `gather_mm` multiply row by row on the CPU.) For few rows (a decode step) they keep
those kernels and spread the experts over the CPU streams (`cpu_streams`). The in-RAM store, the
streamed layers and the resident ones all use these classes, so they take the same math and the same
threads.
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

from nightshift.engine.cpu_streams import split_experts
from nightshift.engine.instruments.probes import Instruments

# Below this many rows the quantized kernel wins (measured on this machine's 2 cores).
MIN_ROWS = 32


class PrefillQuantizedLinear(nn.QuantizedLinear):
    """`nn.QuantizedLinear` with a dequantized-GEMM path for inputs of MIN_ROWS rows or more."""

    instruments: Instruments | None = None  # where its GEMM calls are counted, if handed any (`use_gemm_prefill`)

    def __call__(self, x: mx.array) -> mx.array:
        if x.size // x.shape[-1] < MIN_ROWS:
            return super().__call__(x)
        if self.instruments is not None:
            self.instruments.gemm_calls += 1
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


def _grouped_gemm(layer: nn.Module, x: mx.array, indices: mx.array, weight_of) -> mx.array:
    """`x` (batch..., 1, in) times expert `indices[batch...]`'s weight, one GEMM per expert over its rows.

    weight_of(e): expert e's weight as float (out, in). Returns (batch..., 1, out) like gather_(q)mm.
    """
    batch = tuple(np.broadcast_shapes(x.shape[:-2], indices.shape))
    rows = mx.broadcast_to(x, (*batch, *x.shape[-2:])).reshape(-1, x.shape[-1])
    host = np.broadcast_to(np.array(indices), batch).reshape(-1)  # evaluates the router: prefill only
    order = np.argsort(host, kind="stable")
    experts, counts = np.unique(host[order], return_counts=True)
    ordered = rows[mx.array(order.astype(np.uint32))] if len(experts) > 1 else rows
    outputs, start = [], 0
    for expert, count in zip(experts.tolist(), counts.tolist()):
        y = ordered[start : start + count] @ weight_of(expert).T
        outputs.append(y + layer["bias"][expert] if "bias" in layer else y)
        start += count
    y = mx.concatenate(outputs) if len(outputs) > 1 else outputs[0]
    if len(experts) > 1:
        y = y[mx.array(np.argsort(order).astype(np.uint32))]
    return y.astype(x.dtype).reshape(*batch, 1, -1)


def _many_rows(x: mx.array, indices: mx.array) -> bool:
    """A pass of at least MIN_ROWS (row, expert) products, one row of `x` per index (as SwitchGLU calls)."""
    return x.shape[-2] == 1 and indices.size >= MIN_ROWS


def _kernel(layer: nn.Module, base: type, x: mx.array, indices: mx.array, sorted_indices: bool) -> mx.array:
    """`base`'s own kernel (`gather_qmm` / `gather_mm`) for few rows, the experts spread over the CPU streams
    (`cpu_streams`) where there are several; rows sorted by expert (mlx-lm's many-row order) stay one call."""
    weight = layer["weight"]
    call = partial(base.__call__, layer)
    if not sorted_indices and (split := split_experts(call, x, indices, weight.nbytes // weight.shape[0])) is not None:
        if layer.instruments is not None:
            layer.instruments.split_calls += 1
        return split
    return base.__call__(layer, x, indices, sorted_indices)


class PrefillQuantizedSwitchLinear(QuantizedSwitchLinear):
    """`QuantizedSwitchLinear` with a grouped GEMM path (each expert dequantized once) for many rows."""

    instruments: Instruments | None = None  # where its GEMM and split calls are counted, if handed any

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        if not _many_rows(x, indices) or self.get("global_scale") is not None:
            return _kernel(self, QuantizedSwitchLinear, x, indices, sorted_indices)
        if self.instruments is not None:
            self.instruments.expert_gemm_calls += 1
        biases = self.get("biases")

        def weight_of(e: int) -> mx.array:
            scales = self["scales"][e]  # float (affine) scales in float32, as PrefillQuantizedLinear; MXFP4's are uint8
            return mx.dequantize(
                self["weight"][e],
                scales.astype(mx.float32) if mx.issubdtype(scales.dtype, mx.floating) else scales,
                None if biases is None else biases[e].astype(mx.float32),
                self.group_size,
                self.bits,
                mode=self.mode,
            )

        return _grouped_gemm(self, x, indices, weight_of)


class PrefillSwitchLinear(SwitchLinear):
    """`SwitchLinear` with a grouped GEMM path for many rows."""

    instruments: Instruments | None = None  # where its GEMM and split calls are counted, if handed any

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        if not _many_rows(x, indices):
            return _kernel(self, SwitchLinear, x, indices, sorted_indices)
        if self.instruments is not None:
            self.instruments.expert_gemm_calls += 1
        return _grouped_gemm(self, x, indices, lambda e: self["weight"][e].astype(mx.float32))


GEMM_CLASSES = {
    nn.QuantizedLinear: PrefillQuantizedLinear,
    QuantizedSwitchLinear: PrefillQuantizedSwitchLinear,
    SwitchLinear: PrefillSwitchLinear,
}


def use_gemm_prefill(model: nn.Module, instruments: Instruments | None = None) -> int:
    """Give every quantized linear layer and expert switch layer of `model` the GEMM prefill path when MLX
    runs on the CPU; with `instruments`, those layers count their GEMM and split calls there.

    The layers keep their parameters and paths (only their class changes), so weights load
    and save as before. Returns how many layers were switched.
    """
    if mx.default_device() != mx.cpu:
        return 0
    switched = 0
    for _, module in model.named_modules():
        if type(module) in GEMM_CLASSES:
            module.__class__ = GEMM_CLASSES[type(module)]
            if instruments is not None:
                module.instruments = instruments
            switched += 1
    return switched


def use_quantized_kernel(model: nn.Module) -> int:
    """Undo `use_gemm_prefill` (for side-by-side measurements); returns how many layers were switched back."""
    plain = {gemm: base for base, gemm in GEMM_CLASSES.items()}
    switched = 0
    for _, module in model.named_modules():
        if type(module) in plain:
            module.__class__ = plain[type(module)]
            switched += 1
    return switched
