"""The streaming expert layer: a drop-in for mlx-lm's `SwitchGLU` / `SwitchMLP`.

It takes the same `(x, indices)`, brings in exactly the experts this call selects
(cache, prefetch in flight, or a demand read), stacks them and runs the family's
own switch module on the stack with the indices remapped into it, so the math is
mlx-lm's `gather_qmm` / `gather_mm` (and bias, activation) unchanged: greedy output
is token-identical to the model held fully in RAM. A one-row (decode) call instead
runs each expert alone, through the same switch module, as soon as it lands
(`overlap`): per slot the result is the same, and the compute hides behind the reads.
So does a prompt pass whose experts are 16-bit floats on the CPU, where every (row, expert)
product is computed alone whatever the call holds (`sums_per_pair`): no stack of the pass's
experts and no float32 copy of it is made, which set the peak memory of a prompt pass; nor
of a decode step's cached 16-bit experts, whose stacks of varying size MLX's buffer cache
could not reuse (a page fault storm every token).
"""

from __future__ import annotations

import itertools

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from nightshift.engine.cpu_prefill import MIN_ROWS, SORTED_PAIRS, rows_as_sorted, sums_per_pair, use_gemm_prefill
from nightshift.engine.cpu_streams import cpu_streams, part_bounds, worth_spreading
from nightshift.engine.errors import ModelFormatError
from nightshift.engine.moe.slots import Slots, in_slot_order
from nightshift.engine.moe.stream import ExpertStream, decode_step
from nightshift.engine.store.families import SWITCH_LINEAR_TYPES, module_at, switch_sites
from nightshift.engine.store.manifest import Manifest, MoeLayer
from nightshift.engine.store.safetensors_io import DTYPES


class StreamingSwitch(nn.Module):
    """Routed experts of one layer, read from the drives on each call."""

    def __init__(self, switch: nn.Module, layer: MoeLayer, stream: ExpertStream):
        super().__init__()
        # Plain attributes, not children: the experts are not parameters of the resident model.
        object.__setattr__(self, "_switch", switch)
        object.__setattr__(self, "_stream", stream)
        object.__setattr__(self, "_empty", {n: switch[n].parameters() for n in expert_projections(switch)})
        object.__setattr__(self, "_holding", None)  # the slab chunk a resident layer's switch holds, if any
        # A prompt pass's experts run as they land too, one by one, where that gives the stacked call's bits; the
        # stack and its float32 copies were what set the peak of a prompt pass on 16-bit experts.
        self.per_pair = sums_per_pair(switch, {DTYPES[slot.dtype][0] for slot in layer.tensors})
        self.layer_index = layer.layer
        self.tensor_names = [slot.name for slot in layer.tensors]
        self.expert_bytes = sum(slot.nbytes for slot in layer.tensors)
        # Where each expert tensor goes in the switch: (its projection module, the leaf's name).
        owners = [name.rsplit(".", 1) for name in self.tensor_names]
        object.__setattr__(self, "_leaves", [(module_at(switch, path), leaf) for path, leaf in owners])
        # Modules a family hangs under its switch beside the experts (muse_spark's post-expert norm): resident,
        # shared with the switch, and reachable where the family's code looks for them.
        for name, child in switch.children().items():
            if name not in self._empty and tree_flatten(child.parameters()):
                setattr(self, name, child)

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        resident = self._stream.resident(self.layer_index, indices, self._release)
        if resident is not None:  # every expert of the layer in RAM: the in-RAM model's own call, on their rows
            chunk, rows = resident
            if self._holding is not chunk:  # kept in the switch from call to call (~0.2 ms a call saved)
                self._switch.update(tree_unflatten(list(chunk.items())))
                object.__setattr__(self, "_holding", chunk)
            return self._switch(x, rows[indices])
        if self._stream.settings.overlap and (self.per_pair or decode_step(indices.shape)):
            return self._overlapped(x, indices)
        unique, host, called = self._stream.experts(self.layer_index, x, indices)
        stack, index = called
        local = mx.array(index[np.searchsorted(unique, host)]).astype(indices.dtype)
        return self._run(list(stack.items()), x, local)

    def _release(self) -> None:
        """Let go of the resident chunk (the layer streams again, to give RAM back)."""
        self._switch.update(self._empty)
        object.__setattr__(self, "_holding", None)

    def _run(self, stacked: list[tuple[str, mx.array]], x: mx.array, indices: mx.array) -> mx.array:
        """The family's switch on `stacked` experts, `indices` into the stack; the stack dropped after the call
        (the lazy output holds what it needs)."""
        self._switch.update(tree_unflatten(stacked))
        try:
            return self._switch(x, indices)
        finally:
            self._switch.update(self._empty)

    def _overlapped(self, x: mx.array, indices: mx.array) -> mx.array:
        """A decode step (one row per sequence): run the experts as they come, then put the outputs back in each
        row's slot order.

        The experts' compute hides behind the reads still landing instead of following the last one. The cached experts
        come together: those every row selected once run as one call on the slab (their rows in it, engine/moe/slab.py),
        which the switch linears spread over the CPU streams as the in-RAM call is (`_run_stacked`). One expert a call,
        queued on its own stream, kept MLX's task window of about 20 operations full with one or two experts' chains,
        and the second stream's gain was lost: at 100 % hits a bench-model token took 3.4 s one by one, 3.0-3.2 s
        stacked (docs/results.md, [13] cached experts in one call). 16-bit cached experts run together too: each
        product is one float32 copy's whatever the call holds, and the call's copy of them comes in multiples of
        `cpu_prefill.COPY_STEP` experts, sizes MLX's buffer cache reuses. Each read expert runs alone as it lands
        (`_run_one`). Either way each row takes the quantized kernel row by row, as in a one-row call (the
        same bits as the sequence decoded alone), and the model's block sums the slots in their order, as it would the
        stacked call's output.
        """
        rows = x.reshape(-1, 1, x.shape[-1])
        # Each expert's slots (a row may select one expert in several: longcat_flash maps its zero experts to expert
        # 0, each needs its output), worked out once the stream has read the router's choice back.
        slots: list[Slots] = []
        streams = cpu_streams()
        blocks: list[tuple[list[int], mx.array]] = []  # (expert places, their outputs: each one's rows in turn)
        dealt = [0] * len(streams)  # experts given to each stream so far in this call
        # A stacked call takes the quantized kernel below MIN_ROWS (row, expert) products, as a one-row call does
        # (1: a prompt pass of MIN_ROWS rows or more, none together). 16-bit experts (`per_pair`) run together too:
        # their product is a float32 copy's whatever the call holds, and the copy of the cached ones, gathered from
        # the slab, comes in sizes MLX's buffer cache reuses (`cpu_prefill.COPY_STEP`).
        most = max((MIN_ROWS - 1) // rows.shape[0], 1)

        def run(places: list[int], stack: dict[str, mx.array], index: list[int]) -> None:
            if not slots:  # the stream has read the router's choice back before anything lands
                slots.append(Slots.of(np.array(indices)))
            once = [most > 1 and slots[0].once[place] for place in places]  # every row selected it, once
            together = [j for j in range(len(places)) if once[j]]
            alone = [j for j in range(len(places)) if not once[j]]
            for group in (together[i : i + most] for i in range(0, len(together), most)):
                if len(group) < 2:
                    alone += group
                else:
                    self._run_stacked(rows, [places[j] for j in group], stack, [index[j] for j in group], dealt, blocks)
            for j in sorted(alone):
                picks = None if slots[0].once[places[j]] else slots[0].picked(places[j])
                self._run_one(rows, picks, places[j], stack, index[j], streams, dealt, blocks)

        try:
            with rows_as_sorted(self._switch, self.per_pair and indices.size >= SORTED_PAIRS):
                self._stream.experts(self.layer_index, x, indices, landed=run)
        finally:
            self._switch.update(self._empty)
        return in_slot_order(blocks, slots[0], indices.shape)

    def _set_stack(self, stack: dict[str, mx.array]) -> None:
        """The switch's experts: `stack`, set leaf by leaf (no tree rebuilt)."""
        for name, (owner, leaf) in zip(self.tensor_names, self._leaves):
            owner[leaf] = stack[name]

    def _run_stacked(
        self,
        rows: mx.array,
        places: list[int],
        stack: dict[str, mx.array],
        index: list[int],
        dealt: list[int],
        blocks: list[tuple[list[int], mx.array]],
    ) -> None:
        """Experts every row selected once (`index` theirs in `stack`), in one call, queued: on the current stream,
        the switch linears split the call over the CPU streams (`split_experts`) as the in-RAM call is. (Each
        part stacked and run whole on its own stream instead ran 0.56 of the roofline at 50 %, against 0.88.)"""
        count = len(places)
        if self._stream.instruments is not None:
            self._stream.instruments.stacked_experts += count
        self._set_stack(stack)
        local = mx.broadcast_to(mx.array(np.array(index, dtype=np.uint32)), (rows.shape[0], 1, count))
        out = self._switch(rows, local)  # (rows, 1, count, out)
        bounds = part_bounds(count, self.expert_bytes, len(dealt))
        for turn, (begin, end) in enumerate(itertools.pairwise(bounds)):
            dealt[turn] += end - begin
        if self._stream.instruments is not None:
            self._stream.instruments.spread_experts += count - bounds[1]
        blocks.append((places, out.reshape(rows.shape[0], count, -1).swapaxes(0, 1)))
        mx.async_eval(blocks[-1][1])  # queued: this thread goes back to the landing reads

    def _run_one(
        self,
        rows: mx.array,
        picked: np.ndarray | None,
        place: int,
        stack: dict[str, mx.array],
        index: int,
        streams: list[mx.Stream],
        dealt: list[int],
        blocks: list[tuple[list[int], mx.array]],
    ) -> None:
        """One expert (`index` in `stack`) on the rows that selected it (`picked`; None: every row, once), queued
        on the stream with the fewest experts of the call so far (the first alone where experts are too small to
        pay for another)."""
        if self.per_pair and next(iter(stack.values())).shape[0] > 1:  # upcast whole (`_float32_gather`): its row
            stack, index = {name: t[index : index + 1] for name, t in stack.items()}, 0
        usable = dealt if worth_spreading(self.expert_bytes) else dealt[:1]
        turn = usable.index(min(usable))
        dealt[turn] += 1
        if self._stream.instruments is not None:
            self._stream.instruments.spread_experts += turn > 0
        with mx.stream(streams[turn]):
            mine = rows if picked is None else rows[mx.array(picked.astype(np.uint32))]
            self._set_stack(stack)
            # Made on the host, not queued behind the experts already on this stream.
            out = self._switch(mine, mx.array(np.full((mine.shape[0], 1, 1), index, dtype=np.uint32)))
        blocks.append(([place], out))
        mx.async_eval(out)  # queued on its stream: this thread goes back to the landing reads


def expert_projections(switch: nn.Module) -> list[str]:
    """The children of a switch module that hold the stacked experts."""
    return [name for name, child in switch.children().items() if isinstance(child, SWITCH_LINEAR_TYPES)]


def placeholder(like: mx.array, dtype: mx.Dtype) -> mx.array:
    """One expert's zeros shaped as `like`'s, held as one element: no call computes with a placeholder (the real
    experts replace it first), and one of float32 zeros per projection held 38 MiB on the 192-neuron export (30
    layers x 3 x 0.42 MiB; docs/results.md, [22] memory)."""
    return mx.broadcast_to(mx.zeros((), dtype=dtype), (1, *like.shape[1:]))


def slim_switch(switch: nn.Module, layer: MoeLayer) -> nn.Module:
    """`switch` with one placeholder expert in the store's dtype, quantized as the store's experts are; checked
    against the files."""
    stored = {slot.name: DTYPES[slot.dtype][0] for slot in layer.tensors}
    for name, proj in list(switch.children().items()):
        if not isinstance(proj, SWITCH_LINEAR_TYPES):
            continue
        quantized = name in layer.quantization
        for leaf in ("weight", "bias") if "bias" in proj else ("weight",):
            dtype = proj[leaf].dtype if quantized else stored.get(f"{name}.{leaf}", proj[leaf].dtype)
            proj[leaf] = placeholder(proj[leaf], dtype)
        if quantized:
            q = layer.quantization[name]
            setattr(switch, name, proj.to_quantized(group_size=q["group_size"], bits=q["bits"], mode=q["mode"]))
    wanted = {slot.name for slot in layer.tensors}
    have = {f"{n}.{leaf}" for n in expert_projections(switch) for leaf, _ in tree_flatten(switch[n].parameters())}
    if have != wanted:
        raise ModelFormatError(
            f"layer {layer.layer}: the store's expert files hold {sorted(wanted)} but the model needs {sorted(have)}; "
            "import the model again"
        )
    mx.eval(switch.parameters())
    return switch


def install(model: nn.Module, manifest: Manifest, stream: ExpertStream, float32_prefill: bool = False) -> None:
    """Replace every routed-expert module of `model` with a StreamingSwitch reading through `stream`
    (`float32_prefill`: as `use_gemm_prefill`'s)."""
    layers = {layer.layer: layer for layer in manifest.layers}
    sites = switch_sites(model)
    for site in sites:
        if site.layer not in layers:
            raise ModelFormatError(f"the store has no expert files for layer {site.layer}; import the model again")
        parent_path, name = site.path.rsplit(".", 1)
        parent = module_at(model, parent_path)
        switch = slim_switch(getattr(parent, name), layers[site.layer])
        use_gemm_prefill(
            switch, stream.instruments, float32_prefill
        )  # a prompt's experts: dequantized once per pass, one GEMM each
        setattr(parent, name, StreamingSwitch(switch, layers[site.layer], stream))
    for site, nxt in itertools.pairwise(sites):
        stream.ahead.follow(site.layer, nxt.layer, module_at(model, nxt.path.rsplit(".", 1)[0]), nxt.num_experts)
