"""What a benchmark hands one model to see inside it: counters that prove a path ran, and hooks.

Handed at open (`open_model(..., instruments=)`, `load_streaming`, `use_gemm_prefill`) to the model's layers
and its stream, and kept there, never in a class or the process: two models in one process count apart. A
model opened without them pays nothing for them: each place that counts or calls a hook first asks whether
it was given any.
"""

from __future__ import annotations

from dataclasses import dataclass

# (layer, sorted unique experts, rows, rows that chose each expert) of one streaming layer call
RoutedCall = tuple[int, tuple[int, ...], int, tuple[int, ...]]
ForeseenCall = tuple[int, tuple[int, ...]]  # (layer, sorted unique experts) of a recorded call


@dataclass
class Instruments:
    """One model's counters (summed from its open; a benchmark takes differences of `counts()`) and hooks.

    split_calls: switch-linear calls whose experts were spread over the CPU streams (engine/cpu_streams.py).
    spread_calls: quantized linear (and tied head) calls whose outputs were spread over the CPU streams.
    spread_experts: streamed decode experts dealt to a stream other than the first, as they landed.
    stacked_experts: streamed decode experts copied into a stack with others to run in one call (quantized ones).
    float32_copy_bytes: bytes of float32 copies of 16-bit expert weights made to multiply them (engine/cpu_prefill.py).
    gemm_calls: linear layer calls that took the dequantized GEMM path (engine/cpu_prefill.py).
    expert_gemm_calls: expert switch-layer calls that took the grouped GEMM path.
    routing: given a list, every streaming layer call's (layer, sorted unique experts, rows, rows per expert) is
        appended, in the order the cache is asked (`nightshift bench cache` replays it); resident layers' calls
        when counted.
    foresight: a recorded run's calls (`routing`, from its open on): the stream guesses each next layer's
        experts from them, found by its own call count, instead of asking the router. The same prompt decoded
        greedily asks the same, so every guess is right and a decode measures what prediction could gain at
        most (`bench cache --foresight`). Resident layers' calls are counted late: meant for budgets under the
        expert bytes, where no layer is stacked.
    """

    split_calls: int = 0
    spread_calls: int = 0
    spread_experts: int = 0
    stacked_experts: int = 0
    float32_copy_bytes: int = 0
    gemm_calls: int = 0
    expert_gemm_calls: int = 0
    routing: list[RoutedCall] | None = None
    foresight: list[ForeseenCall] | None = None

    def counts(self) -> dict[str, int]:
        """The counters now, by name (as a run records them)."""
        return {
            "split_calls": self.split_calls,
            "spread_calls": self.spread_calls,
            "spread_experts": self.spread_experts,
            "stacked_experts": self.stacked_experts,
            "float32_copy_bytes": self.float32_copy_bytes,
            "gemm_calls": self.gemm_calls,
            "expert_gemm_calls": self.expert_gemm_calls,
        }
