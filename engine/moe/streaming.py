"""The streaming expert layer: a drop-in for mlx-lm's `SwitchGLU` / `SwitchMLP`.

It takes the same `(x, indices)`, brings in exactly the experts this call selects
(cache, prefetch in flight, or a demand read), stacks them and runs the family's
own switch module on the stack with the indices remapped into it, so the math is
mlx-lm's `gather_qmm` / `gather_mm` (and bias, activation) unchanged: greedy output
is token-identical to the model held fully in RAM. A one-row (decode) call instead
runs each expert alone, through the same switch module, as soon as it lands
(`overlap`): per slot the result is the same, and the compute hides behind the reads.
"""

from __future__ import annotations

import itertools

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from nightshift.engine.cpu_prefill import use_gemm_prefill
from nightshift.engine.cpu_streams import SplitCounter, cpu_streams, worth_spreading
from nightshift.engine.errors import ModelFormatError
from nightshift.engine.moe.stream import ExpertStream, decode_step
from nightshift.engine.store.families import SWITCH_LINEAR_TYPES, module_at, switch_sites
from nightshift.engine.store.manifest import Manifest, MoeLayer


class StreamingSwitch(nn.Module):
    """Routed experts of one layer, read from the drives on each call."""

    def __init__(self, switch: nn.Module, layer: MoeLayer, stream: ExpertStream):
        super().__init__()
        # Plain attributes, not children: the experts are not parameters of the resident model.
        object.__setattr__(self, "_switch", switch)
        object.__setattr__(self, "_stream", stream)
        object.__setattr__(self, "_empty", {n: switch[n].parameters() for n in expert_projections(switch)})
        object.__setattr__(self, "_holding", None)  # the resident stack the switch holds, if any
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
        if resident is not None:  # every expert of the layer in RAM, stacked: the in-RAM model's own call
            if self._holding is not resident:  # kept in the switch from call to call (~0.2 ms a call saved)
                self._switch.update(tree_unflatten(list(resident.items())))
                object.__setattr__(self, "_holding", resident)
            return self._switch(x, indices)
        if self._stream.settings.overlap and decode_step(indices.shape):
            return self._overlapped(x, indices)
        unique, host, experts = self._stream.experts(self.layer_index, x, indices)
        stacked = [(name, mx.stack([e[name] for e in experts])) for name in self.tensor_names]
        local = mx.array(np.searchsorted(unique, host).astype(np.uint32)).astype(indices.dtype)
        return self._run(stacked, x, local)

    def _release(self) -> None:
        """Let go of the resident stack (the stream unstacks the layer to give RAM back)."""
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
        """A decode step (one row per sequence): run each expert as it lands on the rows that selected it, then
        put the outputs back in each row's slot order.

        The experts' compute hides behind the reads still landing instead of following the last one. Each is
        dealt to the CPU stream (`cpu_streams`; one where the experts are too small to pay for another thread)
        with the fewest experts of the call so far and queued
        (`async_eval`), not waited for: MLX's compute threads run them while this thread takes the next landing
        (waiting on each cost 0.5 ms an expert, 17 % of a bench-model layer). An expert runs on its rows through
        the family's switch with a stack of one, so each row takes the quantized kernel row by row as in a
        one-row call (the same bits as the sequence decoded alone), and the model's block sums the slots in
        their order, as it would the stacked call's output.
        """
        rows = x.reshape(-1, 1, x.shape[-1])
        # Per expert (sorted ids), the row of each slot that selected it, in slot order: a row may select one
        # expert in several slots (longcat_flash maps its zero experts to expert 0), each needs its output.
        picked: list[np.ndarray] = []
        outputs: dict[int, mx.array] = {}
        streams = cpu_streams()[: None if worth_spreading(self.expert_bytes) else 1]
        dealt = [0] * len(streams)  # experts given to each stream so far in this call

        def run(i: int, expert: dict[str, mx.array]) -> None:
            if not picked:  # the stream has read the router's choice back before anything lands
                host = np.array(indices).reshape(-1)
                picked.extend(np.flatnonzero(host == e) // indices.shape[-1] for e in np.unique(host))
            turn = dealt.index(min(dealt))
            dealt[turn] += 1
            SplitCounter.spread_experts += turn > 0
            every_row_once = np.array_equal(picked[i], np.arange(rows.shape[0]))
            with mx.stream(streams[turn]):
                mine = rows if every_row_once else rows[mx.array(picked[i].astype(np.uint32))]
                for name, (owner, leaf) in zip(self.tensor_names, self._leaves):
                    owner[leaf] = expert[name][None]  # a stack of one, set leaf by leaf (no tree rebuilt)
                outputs[i] = self._switch(mine, mx.zeros((mine.shape[0], 1, 1), dtype=indices.dtype))
            mx.async_eval(outputs[i])  # queued on its stream: this thread goes back to the landing reads

        try:
            unique, host, _ = self._stream.experts(self.layer_index, x, indices, landed=run)
        finally:
            self._switch.update(self._empty)
        # Outputs in sorted-id order, each expert's slots ascending: a stable sort of the slots by expert gives
        # every slot its place there.
        order = np.argsort(np.searchsorted(unique, host.reshape(-1)), kind="stable")
        place = np.empty_like(order)
        place[order] = np.arange(order.size)
        done = mx.concatenate([outputs[i] for i in range(len(unique))]).reshape(order.size, -1)
        return done[mx.array(place.astype(np.uint32))].reshape(*indices.shape, -1)


def expert_projections(switch: nn.Module) -> list[str]:
    """The children of a switch module that hold the stacked experts."""
    return [name for name, child in switch.children().items() if isinstance(child, SWITCH_LINEAR_TYPES)]


def slim_switch(switch: nn.Module, layer: MoeLayer) -> nn.Module:
    """`switch` with one placeholder expert, quantized as the store's experts are; checked against the files."""
    for name, proj in list(switch.children().items()):
        if not isinstance(proj, SWITCH_LINEAR_TYPES):
            continue
        proj.weight = mx.zeros((1, *proj.weight.shape[1:]), dtype=proj.weight.dtype)
        if "bias" in proj:
            proj.bias = mx.zeros((1, *proj.bias.shape[1:]), dtype=proj.bias.dtype)
        if name in layer.quantization:
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


def install(model: nn.Module, manifest: Manifest, stream: ExpertStream) -> None:
    """Replace every routed-expert module of `model` with a StreamingSwitch reading through `stream`."""
    layers = {layer.layer: layer for layer in manifest.layers}
    sites = switch_sites(model)
    for site in sites:
        if site.layer not in layers:
            raise ModelFormatError(f"the store has no expert files for layer {site.layer}; import the model again")
        parent_path, name = site.path.rsplit(".", 1)
        parent = module_at(model, parent_path)
        switch = slim_switch(getattr(parent, name), layers[site.layer])
        use_gemm_prefill(switch)  # a prompt's experts: dequantized once per pass, one GEMM each (on the CPU)
        setattr(parent, name, StreamingSwitch(switch, layers[site.layer], stream))
    for site, nxt in itertools.pairwise(sites):
        stream.follow(site.layer, nxt.layer, module_at(model, nxt.path.rsplit(".", 1)[0]), nxt.num_experts)
