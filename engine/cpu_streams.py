"""A decode step's experts, and the outputs of its wide quantized layers, spread over several MLX CPU streams.

MLX runs each stream's work on its own thread, and its CPU quantized matrix-vector kernel uses one
thread: a decode step's experts, computed in one call, keep one core busy while the others idle. Each
expert's product is the same kernel on the same bits whichever thread runs it, so the output is
identical, slot for slot, to the one-call result. On this 2-core machine two streams decoded the bench
model in RAM 1.67x as fast and the default model 1.19x (docs/results.md, "[13] two CPU streams").
So is each output of a quantized linear layer (`spread_outputs`): the kernel sums each output alone, so a part
of the weight's rows gives those outputs' bits; a tied 4-bit head of 49 152 rows took 25 ms a token on one thread
(moe128-mixtral's 4-bit copy, docs/results.md, session 13).

`NIGHTSHIFT_CPU_STREAMS` sets how many streams (1 turns the split off); by default one per usable core,
at most `MAX_STREAMS`. Only on the CPU: a GPU runs one call's experts in parallel already.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from nightshift.engine.errors import SettingError

ENV = "NIGHTSHIFT_CPU_STREAMS"
MAX_STREAMS = 2  # measured here (2 cores); more cores may take more, set through ENV
# Expert weight bytes a stream's part must hold to pay for handing it to another thread: parts of 2-6 KB (the
# tests' tiny models) ran 24 % slower split, parts of 190 KB and more (the default model) 1.19x faster; the
# line between was not swept.
MIN_PART_BYTES = 64 << 10

_extra: list[mx.Stream] = []  # made once per process and kept, as MLX keeps its streams
_counts: dict[str | None, int] = {}  # the variable's value (None: unset) -> stream count


def usable_cores() -> int:
    """Cores this process may run on (its affinity where the OS has one, as in a cgroup or taskset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def stream_count() -> int:
    """How many CPU streams a decode step's experts are spread over (1: not split). Asked on every layer call,
    so the answer is kept per value of the variable (it is read each time: a benchmark may change it)."""
    if mx.default_device() != mx.cpu:
        return 1
    said = os.environ.get(ENV)
    if said not in _counts:
        if said is not None and (not said.strip().isdigit() or int(said) < 1):
            raise SettingError(f"{ENV}={said!r}: give a whole number of streams, 1 or more (1 turns it off)")
        _counts[said] = int(said) if said is not None else max(1, min(usable_cores(), MAX_STREAMS))
    return _counts[said]


def cpu_streams() -> list[mx.Stream]:
    """The streams to spread over: the caller's current stream first (mlx-lm decodes on a stream of its own,
    `generation_stream`), then others of this process's, never the current one twice. Off the CPU, the current
    stream alone."""
    current, wanted = mx.default_stream(mx.default_device()), stream_count()
    if wanted == 1:
        return [current]
    while len(_extra) < wanted:  # one spare: the current stream may be one of them
        _extra.append(mx.new_stream(mx.cpu))
    return [current, *[s for s in _extra if s != current][: wanted - 1]]


def worth_spreading(part_bytes: int) -> bool:
    """Whether a part of `part_bytes` expert weight bytes is worth a stream of its own (MIN_PART_BYTES)."""
    return part_bytes >= MIN_PART_BYTES


def part_bounds(k: int, expert_bytes: int, streams: int) -> list[int]:
    """Where `split_experts` cuts `k` experts of `expert_bytes` each over `streams`: part i is
    [bounds[i], bounds[i + 1]), part i on the i-th stream; [0, k] when it does not split."""
    parts = min(streams, k)
    if parts < 2 or not worth_spreading(k // parts * expert_bytes):
        return [0, k]
    return [round(i * k / parts) for i in range(parts + 1)]


def split_experts(
    call: Callable[[mx.array, mx.array], mx.array], x: mx.array, indices: mx.array, expert_bytes: int
) -> mx.array | None:
    """`call(x, indices)` of a switch linear with the experts (the last axis of `indices`) split into one part per
    stream, each part on its own stream, joined in slot order; None when there is nothing to split (one stream,
    one expert per row, parts too small for `expert_bytes` of weight an expert). `x` is either shared by every
    slot (..., 1, 1, in) or one row per slot (..., k, 1, in)."""
    k = indices.shape[-1]
    if k < 2:  # checked first: the streamed layer calls this three times an expert, one expert each
        return None
    streams = cpu_streams()
    bounds = part_bounds(k, expert_bytes, len(streams))
    if len(bounds) < 3:
        return None
    per_slot = x.ndim >= 3 and x.shape[-3] == k
    outputs = []
    for stream, start, stop in zip(streams, bounds, bounds[1:]):
        with mx.stream(stream):
            rows = x[..., start:stop, :, :] if per_slot else x
            outputs.append(call(rows, indices[..., start:stop]))
    return mx.concatenate(outputs, axis=-3)


def spread_outputs(layer: nn.Module, x: mx.array) -> mx.array | None:
    """A quantized linear `layer`'s product `x @ W.T` (with its bias, if it has one) for a few rows, W's rows (the
    outputs) cut into one part per stream, each part's product on its own stream, joined in order; None where there
    is nothing to split (one stream, parts under MIN_PART_BYTES). The parts are views of the weight, made once."""
    streams = cpu_streams()
    weight = layer["weight"]
    bounds = part_bounds(weight.shape[0], weight.nbytes // weight.shape[0], len(streams))  # outputs as experts
    if len(bounds) < 3:
        return None
    held = getattr(layer, "_parts", None)
    if held is None or held[0] is not weight or len(held[1]) != len(bounds) - 1:
        keys = [key for key in ("weight", "scales", "biases", "bias") if key in layer]
        parts = [{key: layer[key][begin:end] for key in keys} for begin, end in itertools.pairwise(bounds)]
        mx.eval(parts)  # views of the weight's memory: no copy
        held = (weight, parts)
        object.__setattr__(layer, "_parts", held)  # not a parameter: the layer's tree stays its own
    outputs = []
    for stream, part in zip(streams, held[1]):
        with mx.stream(stream):
            y = mx.quantized_matmul(
                x,
                part["weight"],
                scales=part["scales"],
                biases=part.get("biases"),
                transpose=True,
                group_size=layer.group_size,
                bits=layer.bits,
                mode=layer.mode,
            )
            outputs.append(y + part["bias"] if "bias" in part else y)
    return mx.concatenate(outputs, axis=-1)
