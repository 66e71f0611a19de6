"""Linear layers that multiply many rows at once through float GEMM on the CPU.

MLX's CPU quantized kernels run at ~1 GMAC/s and gain nothing from more rows, while
float GEMM through a real BLAS (see `cpu_blas`) is ~30x faster. For a prefill chunk
(many rows) a layer therefore dequantizes its weight and uses a matmul; a decode step
(one row) keeps the quantized kernel, which is faster there.

Exact by default: the GEMM path is taken only where MLX's kernel itself computes in float32 (the input and the
float scales/biases promote to float32: float32 activations, whatever the scales' dtype). There the weights
dequantize to the same float32 values and only the summation order differs (~1e-6 on the logits; the family
conformance suite checks the greedy tokens against plain mlx-lm). Where the kernel computes in float16 or bfloat16
(mlx-lm's `convert --dtype bfloat16|float16`: 16-bit activations and scales), its CPU loop rounds every product
and partial sum to 16 bits, which no float32 GEMM reproduces: the logits move by ~0.1 and the tokens change. Those
calls keep the kernel unless the model was opened with `float32_prefill` (opt-in, `--float32-prefill`): faster
and closer to the real-number result, but not mlx-lm's tokens.

The routed experts' switch layers (mlx-lm's `QuantizedSwitchLinear`, `SwitchLinear`) do the same:
for a pass of many rows, the rows are grouped by expert on the host, each expert's weight is
dequantized once and its rows go through one GEMM, and the outputs are put back in the rows' order.
(`gather_qmm` and `gather_mm` multiply row by row on the CPU.) For few rows (a decode step) they keep
those kernels and spread the experts over the CPU streams (`cpu_streams`). Float experts in 16 bits (bf16 and FP8
releases, DeepSeek V3 and MiniMax M2 as published) have no CPU kernel in MLX ("[GatherMM::eval] Currently only
supports float32"): their products are computed as MLX computes them on a GPU, inputs upcast to float32, float32
sums, the output rounded to the promoted dtype of the input and the weight, at any number of rows: through MLX's own
`gather_mm` on float32 copies of the experts a call uses, so the sums are in gather_mm's order (row by row), which
is how the project reproduces mlx-lm on such a checkpoint. A grouped GEMM over many rows sums in BLAS's order
instead: the last float32 bits differ, rounding to 16 bits turns some of those into a whole 16-bit step, and on a
nearly flat model that changed the tokens (docs/results.md, 192 neurons); it is taken for them only with
`float32_prefill`. The in-RAM store, the streamed layers and the resident ones all use these classes, so they take
the same math and the same threads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

from nightshift.engine.cpu_streams import split_experts, spread_outputs
from nightshift.engine.instruments.probes import Instruments

# Below this many rows the quantized kernel wins (measured on this machine's 2 cores).
MIN_ROWS = 32
# mlx-lm's SwitchGLU / SwitchMLP sort a call of this many (row, expert) pairs or more by expert, gathering the rows
# into a new array; a smaller call hands gather_mm its rows as expanded views, which MLX's CPU gather_mm reads as
# transposed one-row matrices: another BLAS path, other float32 bits for the same product (measured here). A part of
# a sorted call therefore lays its rows out as the sorted call would (`rows_as_sorted`).
SORTED_PAIRS = 64
# The float32 copies of the experts a 16-bit call uses come in multiples of this many experts, the padding unused: MLX's
# buffer cache reuses a copy's buffer only for one of the same size, and copies sized by each call's count of experts
# faulted their pages in afresh every time (docs/results.md, [22] a decode step's copies; session 12).
COPY_STEP = 8


def _float32_kernel(layer: nn.Module, x: mx.array) -> bool:
    """Whether MLX's quantized kernel computes `layer(x)` in float32: the dtype `x` and the float scales and biases
    promote to (mixed float16 and bfloat16 promote to float32 too). MXFP4/8 scales are bytes: `x` decides."""
    floats = [layer[k] for k in ("scales", "biases") if k in layer and mx.issubdtype(layer[k].dtype, mx.floating)]
    return mx.result_type(x, *floats) == mx.float32


def _dequantized(layer: nn.Module, weight: mx.array, scales: mx.array, biases: mx.array | None) -> mx.array:
    """`weight` dequantized for a float32 GEMM: float (affine) scales and biases in float32, as MLX dequantizes in
    the scales' dtype and float16 would round the weights; MXFP4/8 scales (bytes) as stored."""
    return mx.dequantize(
        weight,
        scales.astype(mx.float32) if mx.issubdtype(scales.dtype, mx.floating) else scales,
        None if biases is None else biases.astype(mx.float32),
        layer.group_size,
        layer.bits,
        mode=layer.mode,
    )


class PrefillQuantizedLinear(nn.QuantizedLinear):
    """`nn.QuantizedLinear` with a dequantized-GEMM path for inputs of MIN_ROWS rows or more, taken where the kernel
    computes in float32 or where `float32_prefill` asks for it (module docstring)."""

    instruments: Instruments | None = None  # where its GEMM calls are counted, if handed any (`use_gemm_prefill`)
    float32_prefill = False  # the GEMM path for 16-bit activations too (not mlx-lm's tokens): `use_gemm_prefill`

    def __call__(self, x: mx.array) -> mx.array:
        if self.get("global_scale") is not None:
            return super().__call__(x)
        if x.size // x.shape[-1] < MIN_ROWS:  # few rows: the kernel, the outputs spread over the CPU streams
            return _spread(self, x, super().__call__)
        if not (self.float32_prefill or _float32_kernel(self, x)):
            return super().__call__(x)
        if self.instruments is not None:
            self.instruments.gemm_calls += 1
        weight = _dequantized(self, self["weight"], self["scales"], self.get("biases"))
        y = (x @ weight.T).astype(x.dtype)
        return y + self["bias"] if "bias" in self else y


def _spread(layer: nn.Module, x: mx.array, whole: Callable[[mx.array], mx.array]) -> mx.array:
    """`layer`'s product for few rows with its outputs spread over the CPU streams (`spread_outputs`: the same
    bits), or `whole(x)` where that does not pay."""
    spread = spread_outputs(layer, x)
    if spread is None:
        return whole(x)
    if layer.instruments is not None:
        layer.instruments.spread_calls += 1
    return spread


class SpreadQuantizedEmbedding(nn.QuantizedEmbedding):
    """`nn.QuantizedEmbedding` whose output projection (a tied head, `as_linear`) spreads its outputs, the
    vocabulary, over the CPU streams for few rows (`spread_outputs`)."""

    instruments: Instruments | None = None  # where its spread calls are counted, if handed any
    float32_prefill = False  # unused: a head's rows are few (the prompt's last), kept for `use_gemm_prefill`

    def as_linear(self, x: mx.array) -> mx.array:
        if x.size // x.shape[-1] >= MIN_ROWS or self.get("global_scale") is not None:
            return super().as_linear(x)
        return _spread(self, x, super().as_linear)


def _grouped_gemm(layer: nn.Module, x: mx.array, indices: mx.array, weight_of, out_dtype: mx.Dtype) -> mx.array:
    """`x` (batch..., 1, in) times expert `indices[batch...]`'s weight, one float32 GEMM per expert over its rows.

    weight_of(e): expert e's weight as float32 (out, in). Returns (batch..., 1, out) in `out_dtype`, like
    gather_(q)mm.
    """
    batch = tuple(np.broadcast_shapes(x.shape[:-2], indices.shape))
    rows = mx.broadcast_to(x, (*batch, *x.shape[-2:])).reshape(-1, x.shape[-1])
    host = np.broadcast_to(np.array(indices), batch).reshape(-1)  # evaluates the router: prefill only
    order = np.argsort(host, kind="stable")
    experts, counts = np.unique(host[order], return_counts=True)
    rows = rows.astype(mx.float32)
    ordered = rows[mx.array(order.astype(np.uint32))] if len(experts) > 1 else rows
    outputs, start = [], 0
    for expert, count in zip(experts.tolist(), counts.tolist()):
        y = ordered[start : start + count] @ weight_of(expert).T
        outputs.append(y + layer["bias"][expert] if "bias" in layer else y)
        start += count
    y = mx.concatenate(outputs) if len(outputs) > 1 else outputs[0]
    if len(experts) > 1:
        y = y[mx.array(np.argsort(order).astype(np.uint32))]
    return y.astype(out_dtype).reshape(*batch, 1, -1)


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
    """`QuantizedSwitchLinear` with a grouped GEMM path (each expert dequantized once) for many rows, taken where the
    kernel computes in float32 or where `float32_prefill` asks for it."""

    instruments: Instruments | None = None  # where its GEMM and split calls are counted, if handed any
    float32_prefill = False  # as PrefillQuantizedLinear's

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        exact = self.float32_prefill or _float32_kernel(self, x)
        if not _many_rows(x, indices) or not exact or self.get("global_scale") is not None:
            return _kernel(self, QuantizedSwitchLinear, x, indices, sorted_indices)
        if self.instruments is not None:
            self.instruments.expert_gemm_calls += 1
        biases = self.get("biases")

        def weight_of(e: int) -> mx.array:
            return _dequantized(self, self["weight"][e], self["scales"][e], None if biases is None else biases[e])

        return _grouped_gemm(self, x, indices, weight_of, x.dtype)


def _float32_gather(layer: nn.Module, x: mx.array, indices: mx.array, sorted_indices: bool) -> mx.array:
    """MLX's own `gather_mm` on float32 copies of `x` and of the experts `indices` names, rounded to the promoted
    dtype (the GPU's upcast rule, module docstring): row by row, as `gather_mm` sums, each used expert upcast once."""
    weight = layer["weight"]
    if weight.shape[0] == 1:  # one expert (a decode step's, run alone): every index is 0, nothing to read back
        experts, slots = weight, indices
    else:
        used, host = np.unique(np.array(indices), return_inverse=True)  # evaluates the router
        size = min(-(-len(used) // COPY_STEP) * COPY_STEP, weight.shape[0])
        if size == weight.shape[0]:  # every expert's copy (a streamed call's stack holds only those it uses)
            experts, slots = weight, indices
        else:  # the used ones gathered, padded to `size` with copies the slots never name
            experts = weight[mx.array(np.resize(used, size).astype(np.uint32))]
            slots = mx.array(host.reshape(indices.shape).astype(np.uint32))
    if layer.instruments is not None:
        layer.instruments.float32_copy_bytes += experts.size * 4
    rows = x.astype(mx.float32)
    if layer.rows_sorted:  # standard strides: a row's size-1 axes no longer read as a transposed matrix
        rows = rows.flatten().reshape(rows.shape)
    y = mx.gather_mm(
        rows,
        experts.astype(mx.float32).swapaxes(-1, -2),
        rhs_indices=slots,
        sorted_indices=sorted_indices,  # the remap keeps the order
    ).astype(mx.result_type(x, weight))
    return y + mx.expand_dims(layer["bias"][indices], -2) if "bias" in layer else y


def sums_per_pair(switch: nn.Module, expert_dtypes: set[mx.Dtype]) -> bool:
    """Whether every expert projection of `switch`, given experts of `expert_dtypes`, multiplies each (row, expert)
    pair alone whatever rows a call holds: 16-bit float experts on the CPU (`_float32_gather`: one float32 product
    per pair, as `gather_mm` does, the output rounded per element), unless `float32_prefill` groups a pass's rows.
    A call on a subset of the pairs, its rows laid out as the whole call's (`rows_as_sorted`), then gives each pair
    the bits the whole call would, so the experts can run as they land."""
    projections = [c for c in switch.children().values() if isinstance(c, (SwitchLinear, QuantizedSwitchLinear))]
    return (
        bool(projections)
        and expert_dtypes <= {mx.bfloat16, mx.float16}
        and all(isinstance(p, PrefillSwitchLinear) and not p.float32_prefill for p in projections)
    )


@contextmanager
def rows_as_sorted(switch: nn.Module, sorted_call: bool) -> Iterator[None]:
    """Within it, the 16-bit projections of `switch` lay their rows out as the rows of a sorted call (row-major,
    gathered), whatever view they come as, when `sorted_call`: calls on parts of a call of SORTED_PAIRS pairs or
    more, which mlx-lm's switch would have sorted whole, get that call's bits."""
    projections = [p for p in switch.children().values() if isinstance(p, PrefillSwitchLinear)]
    for projection in projections:
        projection.rows_sorted = sorted_call
    try:
        yield
    finally:
        for projection in projections:
            projection.rows_sorted = False


class PrefillSwitchLinear(SwitchLinear):
    """`SwitchLinear` with a grouped GEMM path for many rows where its weight and input are float32 (or where
    `float32_prefill` asks for it); 16-bit weights or inputs, which MLX has no CPU kernel for, go through
    `gather_mm` on float32 copies otherwise (module docstring)."""

    instruments: Instruments | None = None  # where its GEMM and split calls are counted, if handed any
    float32_prefill = False  # as PrefillQuantizedLinear's
    rows_sorted = False  # rows laid out as a sorted call's (`rows_as_sorted`)

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        weight = self["weight"]
        if weight.dtype != mx.float32 or x.dtype != mx.float32:
            if not (self.float32_prefill and _many_rows(x, indices)):
                return _float32_gather(self, x, indices, sorted_indices)
        elif not _many_rows(x, indices):
            return _kernel(self, SwitchLinear, x, indices, sorted_indices)
        if self.instruments is not None:
            self.instruments.expert_gemm_calls += 1
        return _grouped_gemm(self, x, indices, lambda e: weight[e].astype(mx.float32), mx.result_type(x, weight))


GEMM_CLASSES = {
    nn.QuantizedLinear: PrefillQuantizedLinear,
    nn.QuantizedEmbedding: SpreadQuantizedEmbedding,
    QuantizedSwitchLinear: PrefillQuantizedSwitchLinear,
    SwitchLinear: PrefillSwitchLinear,
}


def use_gemm_prefill(model: nn.Module, instruments: Instruments | None = None, float32_prefill: bool = False) -> int:
    """Give every quantized linear layer and expert switch layer of `model` the GEMM prefill path when MLX
    runs on the CPU, and their few-row calls (and a quantized tied head's) the outputs spread over the CPU streams;
    with `instruments`, those layers count their GEMM, split and spread calls there. `float32_prefill`: take it for
    16-bit activations too, where it is faster than MLX's kernel but gives other tokens than mlx-lm.

    The layers keep their parameters and paths (only their class changes), so weights load
    and save as before. Returns how many layers were switched.
    """
    if mx.default_device() != mx.cpu:
        return 0
    switched = 0
    for _, module in model.named_modules():
        if type(module) in GEMM_CLASSES:
            module.__class__ = GEMM_CLASSES[type(module)]
            switched += 1
        elif type(module) not in GEMM_CLASSES.values():
            continue
        module.float32_prefill = float32_prefill  # also on layers switched before (a streamed store's experts)
        if instruments is not None:
            module.instruments = instruments
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
