"""The expert cache's tensors: the cached experts of every layer as rows of one array per expert tensor (a slab).

A decode step's cached experts then run as one call of the family's switch on the slab, the router's choice mapped
to their rows, as the model held in RAM runs a layer on its stack: no stack of them is built at every call (nine
`mx.stack`s of 14 experts a layer call on moe128-mixtral's 4-bit copy, and an `async_eval` of that many operations
waits for most of them to run: MLX's CPU scheduler keeps few tasks in flight), and an expert costs its tensors'
bytes, not an MLX array and its allocation per tensor (~0.7 KB each, 9 an expert on that copy). Layers whose
experts have one layout (names, shapes and dtypes: every layer of most models) share a slab, so an expert evicted
from one layer leaves its row to a read of any other, and the slab never has to grow or shrink with the mix of
layers the cache holds: it is made at the cache's budget (and a little more, `spare`) with the first expert kept,
its pages handed back until rows are written (so it takes RAM as the cache fills), and grows by a chunk, another
array, only when the budget does (a chunk's rows are a call of their own).

Rows are written in place, through a NumPy view of the slab's memory (MLX exposes its buffers), and only where
nothing queued can still read them: an evicted expert's row is retired, and freed at `settle`, which the stream
calls right after a layer's router is read back: every computation queued before has run by then (the router's
input is the previous layer's output). When the budget falls, the free rows' pages are handed back there, and the
last chunk's experts move into free rows of the others as soon as they fit, the chunk let go of. Everything here runs
on the thread that runs the layers.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import numpy as np

from nightshift.engine.io.arenas import discard_pages
from nightshift.engine.moe.held import held_bytes
from nightshift.engine.moe.reads import Tensors
from nightshift.engine.store.manifest import MoeLayer
from nightshift.engine.store.safetensors_io import DTYPES

Key = tuple[int, int]  # (layer, expert)
Row = tuple[int, int]  # (chunk, row in it)
FEWEST_ROWS = 16  # the smallest chunk made


def spare(rows: int) -> int:
    """Rows made beyond the budget's `rows`: room for the reads a call keeps while its evictions' rows are retired."""
    return max(FEWEST_ROWS, rows // 32)


class Slab:
    """The cached experts of the layers sharing one layout, each a row of a chunk: one array per expert tensor."""

    def __init__(self, spec: MoeLayer, experts: int):
        """`spec`: any of the layers' (their tensors are laid out alike); `experts`: theirs all told (the most rows)."""
        self.spec = spec
        self.experts = experts
        self.where: dict[Key, Row] = {}
        self.chunks: list[Tensors] = []  # the rows as the switch reads them: in the store's dtypes
        self._raw: list[list[np.ndarray]] = []  # the same memory as unsigned integers, writable, a list a chunk
        self._free: list[Row] = []
        self._retired: list[Row] = []  # rows of experts evicted since the last `settle`: a queued call may read them
        self._live: list[int] = []  # experts held, a chunk

    @property
    def row_bytes(self) -> int:
        return held_bytes(self.spec)

    @property
    def rows(self) -> int:
        return sum(len(raw[0]) for raw in self._raw)

    def put(self, key: Key, raw: Tensors, budget_rows: int) -> None:
        """Copy `raw` (the expert's tensors as unsigned integers, as the reader decodes them) into a free row; with
        none, a new chunk of the rows `budget_rows` asks for beyond those made (and `spare`)."""
        if not self._free:
            wanted = max(budget_rows - self.rows, 0) + spare(budget_rows)
            self._add_chunk(max(FEWEST_ROWS, min(wanted, self.experts - self.rows + spare(budget_rows))))
        chunk, row = self._free.pop()
        for view, slot in zip(self._raw[chunk], self.spec.tensors):
            view[row] = np.asarray(raw[slot.name])
        self.where[key] = (chunk, row)
        self._live[chunk] += 1

    def drop(self, key: Key) -> None:
        """`key` left the cache: its row is free from the next `settle` on."""
        self._retired.append(self.where.pop(key))
        self._live[self._retired[-1][0]] -= 1

    def settle(self) -> None:
        """Nothing queued reads the retired rows any more: free them; let go of the last chunk once what it holds
        fits in the others' free rows (moved there)."""
        self._free += self._retired
        self._retired = []
        while self.chunks:
            last = len(self.chunks) - 1
            if last == 0 and self._live[0]:  # one chunk holding experts (the usual case): nothing to move
                return
            elsewhere = [(chunk, row) for chunk, row in self._free if chunk != last]
            if self._live[last] > len(elsewhere):
                return
            for key in [key for key, (chunk, _) in self.where.items() if chunk == last]:
                chunk, row = elsewhere.pop()
                old = self.where[key][1]
                for view, moved in zip(self._raw[chunk], self._raw[last]):
                    view[row] = moved[old]
                self.where[key] = (chunk, row)
                self._live[chunk] += 1
            self._free = elsewhere
            del self.chunks[last], self._raw[last], self._live[last]

    def discard_free(self) -> None:
        """The free rows' pages handed back to the system (the budget fell: what its evictions freed goes back)."""
        for chunk, row in self._free:
            for view in self._raw[chunk]:
                discard_pages(view[row])

    def _add_chunk(self, rows: int) -> None:
        raw, tensors = [], {}
        for slot in self.spec.tensors:
            dtype, itemsize = DTYPES[slot.dtype]
            array = mx.zeros((rows, *slot.shape), dtype=getattr(mx, f"uint{8 * itemsize}"))
            mx.eval(array)
            raw.append(np.asarray(array))
            discard_pages(raw[-1])  # zero-filled by MLX: no RAM taken until a row is written
            tensors[slot.name] = array if array.dtype == dtype else array.view(dtype)
        mx.eval(tensors)
        self.chunks.append(tensors)
        self._raw.append(raw)
        self._live.append(0)
        self._free += [(len(self.chunks) - 1, row) for row in reversed(range(rows))]  # popped lowest first


class Slabs:
    """Every streamed layer's slab (one a layout), sized from the cache's budget (`budget()`, bytes)."""

    def __init__(self, specs: list[MoeLayer], budget: Callable[[], int]):
        layouts: dict[tuple, list[MoeLayer]] = {}
        for spec in specs:
            layouts.setdefault(tuple((t.name, t.dtype, tuple(t.shape)) for t in spec.tensors), []).append(spec)
        self.by_layout = [Slab(group[0], sum(spec.num_experts for spec in group)) for group in layouts.values()]
        self.layers = {spec.layer: slab for slab, group in zip(self.by_layout, layouts.values()) for spec in group}
        self._budget = budget
        self._retiring: set[Slab] = set()

    def put(self, key: Key, raw: Tensors) -> None:
        """`key`'s tensors as read, into its layer's slab."""
        slab = self.layers[key[0]]
        slab.put(key, raw, self._budget() // slab.row_bytes)

    def drop(self, key: Key) -> None:
        """The cache evicted `key`: retire its row (the cache's eviction callback)."""
        self.layers[key[0]].drop(key)
        self._retiring.add(self.layers[key[0]])

    def settle(self) -> None:
        """Free the retired rows (called once nothing queued can read them: a router just read back)."""
        for slab in self._retiring:
            slab.settle()
        self._retiring = set()

    def discard_free(self) -> None:
        """Every slab's free rows' pages handed back (`Slab.discard_free`); call after `settle`."""
        for slab in self.by_layout:
            slab.discard_free()

    def nbytes(self) -> int:
        """The slabs' memory, free rows included."""
        return sum(slab.rows * slab.row_bytes for slab in self.by_layout)

    def held_bytes(self) -> int:
        """The bytes of the cached experts' rows."""
        return sum(len(slab.where) * slab.row_bytes for slab in self.by_layout)
