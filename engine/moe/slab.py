"""The expert cache's tensors: one layer's cached experts as the rows of one array per tensor (its slab).

A decode step's cached experts then run as one call of the family's switch on the layer's slab, the router's
choice mapped to their rows, as the model held in RAM runs a layer on its stack: no stack of them is built at
every call (nine `mx.stack`s of 14 experts a layer call on moe128-mixtral's 4-bit copy, and an `async_eval` of
that many operations waits for most of them to run: MLX's CPU scheduler keeps few tasks in flight), and an expert
costs its tensors' bytes, not an MLX array and its allocation per tensor (~0.7 KB each, 9 an expert on that copy).
A layer whose every expert is cached is ordered by expert (`by_expert`), and its slab is the resident stack.

Rows are written in place, through a NumPy view of the slab's memory (MLX exposes its buffers), and only where
nothing queued can still read them: an evicted expert's row is retired, and freed at `settle`, which the stream
calls right after a layer's router is read back: every computation queued before has run by then (the router's
input is the previous layer's output). A full slab grows by an eighth (at least `GROW` rows) into new arrays
(whatever is queued keeps reading the old ones) and is packed into smaller ones when more than twice that are
free. Everything here runs on the thread that runs the layers.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from nightshift.engine.moe.held import held_bytes
from nightshift.engine.moe.reads import Tensors
from nightshift.engine.store.manifest import MoeLayer
from nightshift.engine.store.safetensors_io import DTYPES

GROW = 4  # the fewest rows a full slab grows by


def headroom(rows: int) -> int:
    """Rows a slab of `rows` grows by when full; more than twice as many free and it is packed."""
    return max(GROW, rows // 8)


class LayerSlab:
    """One layer's cached experts, each a row of one array per expert tensor."""

    def __init__(self, spec: MoeLayer):
        self.spec = spec
        self.rows: dict[int, int] = {}  # expert -> its row
        self.tensors: Tensors = {}  # the rows as the switch reads them: in the store's dtypes
        self.capacity = 0
        self._raw: list[np.ndarray] = []  # the same memory as unsigned integers, writable (one per tensor)
        self._free: list[int] = []
        self._retired: list[int] = []  # rows of experts evicted since the last `settle`: a queued call may read them

    @property
    def row_bytes(self) -> int:
        return held_bytes(self.spec)

    def put(self, expert: int, raw: Tensors) -> None:
        """Copy `raw` (the expert's tensors as unsigned integers, as the reader decodes them) into a free row."""
        if not self._free:
            self._remake(self.capacity + headroom(self.capacity), list(range(self.capacity)))
        row = self._free.pop()
        for view, slot in zip(self._raw, self.spec.tensors):
            view[row] = np.asarray(raw[slot.name])
        self.rows[expert] = row

    def drop(self, expert: int) -> None:
        """`expert` left the cache: its row is free from the next `settle` on."""
        self._retired.append(self.rows.pop(expert))

    def settle(self) -> None:
        """Nothing queued reads the retired rows any more: free them, and pack the slab if it holds few experts."""
        self._free += self._retired
        self._retired = []
        if len(self._free) > 2 * headroom(self.capacity):
            self._remake(len(self.rows) + headroom(len(self.rows)), sorted(self.rows.values()))

    def by_expert(self) -> Tensors:
        """Every expert of the layer cached: its rows put in expert order, so that the slab is the layer's stack."""
        order = sorted(self.rows)
        assert order == list(range(self.spec.num_experts)), "a layer is stacked only with every expert cached"
        if self.capacity != len(order) or any(self.rows[e] != e for e in order):
            self._remake(len(order), [self.rows[e] for e in order])
        return self.tensors

    def expert(self, expert: int) -> Tensors:
        """One cached expert's tensors as a stack of one (views of its row)."""
        row = self.rows[expert]
        return {name: t[row : row + 1] for name, t in self.tensors.items()}

    def _remake(self, capacity: int, kept: list[int]) -> None:
        """New arrays of `capacity` rows, the old rows `kept` copied into the first ones in that order (a row
        not kept is dropped; a retired row kept stays retired); whatever is queued reads the old arrays."""
        raw, tensors = [], {}
        for i, slot in enumerate(self.spec.tensors):
            dtype, itemsize = DTYPES[slot.dtype]
            array = mx.zeros((capacity, *slot.shape), dtype=getattr(mx, f"uint{8 * itemsize}"))
            mx.eval(array)
            raw.append(np.asarray(array))
            if kept:
                raw[-1][: len(kept)] = self._raw[i][kept]
            tensors[slot.name] = array if array.dtype == dtype else array.view(dtype)
        mx.eval(tensors)
        place = {row: i for i, row in enumerate(kept)}
        self.rows = {expert: place[row] for expert, row in self.rows.items()}
        self._retired = [place[row] for row in self._retired if row in place]
        self._free = [place[row] for row in self._free if row in place] + list(range(capacity - 1, len(kept) - 1, -1))
        self._raw, self.tensors, self.capacity = raw, tensors, capacity


class Slabs:
    """Every streamed layer's slab (`LayerSlab`), and the layers with rows to free at the next `settle`."""

    def __init__(self, specs: list[MoeLayer]):
        self.layers = {spec.layer: LayerSlab(spec) for spec in specs}
        self._retiring: set[int] = set()

    def drop(self, key: tuple[int, int]) -> None:
        """The cache evicted `key`: retire its row (the cache's eviction callback)."""
        self.layers[key[0]].drop(key[1])
        self._retiring.add(key[0])

    def settle(self) -> None:
        """Free the retired rows (called once nothing queued can read them: a router just read back)."""
        for layer in self._retiring:
            self.layers[layer].settle()
        self._retiring = set()

    def nbytes(self) -> int:
        """The slabs' memory, free rows included."""
        return sum(slab.capacity * slab.row_bytes for slab in self.layers.values())

    def held_bytes(self) -> int:
        """The bytes of the cached experts' rows."""
        return sum(len(slab.rows) * slab.row_bytes for slab in self.layers.values())
