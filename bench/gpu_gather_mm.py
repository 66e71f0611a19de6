"""mlx-lm's 16-bit float experts on a CPU, computed as MLX computes them on a GPU.

mlx[cpu]'s `gather_mm`, which mlx-lm's unquantized experts use, takes float32 only ("[GatherMM::eval] Currently only
supports float32"), so plain mlx-lm cannot run a bf16 or float16 expert here. Patched in its place, the wrapper below
keeps the model's 16-bit weights and activations and computes only the products and sums in float32, the output in
the inputs' dtype: the reference nightshift's bf16 experts are held to (engine/cpu_prefill.py computes them so).
Used by bench/peer_tokens.py (`--as-stored`) and the tests of 16-bit checkpoints.

    with monkeypatch.context() as patch:
        patch.setattr(mx, "gather_mm", gather_mm_as_on_a_gpu(mx.gather_mm))
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx


def gather_mm_as_on_a_gpu(gather_mm: Callable[..., mx.array]) -> Callable[..., mx.array]:
    """`gather_mm` for any float dtype: float32 products and sums, the output in the inputs' promoted dtype."""

    def upcast(a, b, lhs_indices=None, rhs_indices=None, *, sorted_indices=False):
        out = gather_mm(
            a.astype(mx.float32), b.astype(mx.float32), lhs_indices, rhs_indices, sorted_indices=sorted_indices
        )
        return out.astype(mx.result_type(a, b))

    return upcast
