"""Where a streamed call's router slots go: each expert's rows, and the outputs put back in slot order.

A decode step runs its experts as they come (the cached ones together, each read as it lands), each on the rows that
selected it; the switch's output is then every row's slots in their order. `Slots` works out once a call, with a few
vectorized steps, what the per-expert loops did with a NumPy call an expert (52 us a layer call for one row's 16
experts warm, more right after a router readback; moe128-mixtral's 4-bit copy, docs/results.md, session 13).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np


@dataclass(frozen=True)
class Slots:
    """One call's router indices, by expert (their sorted unique ids: an expert's place is its index there)."""

    rows: int
    k: int  # slots a row
    order: np.ndarray  # the flat slots sorted by expert, each expert's in slot order (a stable sort)
    counts: np.ndarray  # slots an expert, by place
    place: np.ndarray  # by sorted slot: its expert's place
    turn: np.ndarray  # by sorted slot: its turn among its expert's slots
    once: list[bool]  # by place: every row selected the expert, once

    @classmethod
    def of(cls, host: np.ndarray) -> Slots:
        """`host`: router indices (..., k) on the host."""
        flat = host.reshape(-1)
        k = host.shape[-1]
        order = np.argsort(flat, kind="stable")
        ranked = flat[order]
        new = np.empty(flat.size, dtype=bool)  # by sorted slot: the first of its expert's
        new[0] = True
        np.not_equal(ranked[1:], ranked[:-1], out=new[1:])
        first = np.flatnonzero(new)
        counts = np.diff(np.append(first, flat.size))
        rows = flat.size // k
        if len(first) == flat.size:  # no expert twice (a decode step of one row): each one slot, its row's
            once = [rows == 1] * flat.size
            return cls(rows, k, order, counts, np.arange(flat.size), np.zeros(flat.size, dtype=np.int64), once)
        place = np.cumsum(new) - 1
        row = order // k
        repeat = np.zeros(flat.size, dtype=bool)  # by sorted slot: the same row as the one before, same expert
        repeat[1:] = (row[1:] == row[:-1]) & ~new[1:]
        twice = np.logical_or.reduceat(repeat, first)
        once = ((counts == rows) & ~twice).tolist()  # a row's slots of one expert are sorted by row: once is all rows
        return cls(rows, k, order, counts, place, np.arange(flat.size) - first[place], once)

    def picked(self, place: int) -> np.ndarray:
        """The row of each of the expert's slots, in slot order (a row selecting it twice is there twice)."""
        start = int(np.searchsorted(self.place, place))
        return self.order[start : start + self.counts[place]] // self.k


def in_slot_order(blocks: list[tuple[list[int], mx.array]], slots: Slots, shape: tuple[int, ...]) -> mx.array:
    """The experts' outputs, `blocks` in the order they ran (each block's experts by place in turn, each expert's rows
    as `Slots.picked` gives them), as the switch's output for router indices of `shape`: every row's slots in order."""
    width = blocks[0][1].shape[-1]
    places = [place for block, _ in blocks for place in block]
    counts = slots.counts[places]
    start = np.empty(len(slots.counts), dtype=np.int64)  # where each expert's rows begin in the joined blocks
    start[places] = np.cumsum(counts) - counts
    where = np.empty(slots.order.size, dtype=np.uint32)
    where[slots.order] = start[slots.place] + slots.turn
    done = mx.concatenate([out.reshape(-1, width) for _, out in blocks]) if len(blocks) > 1 else blocks[0][1]
    return done.reshape(-1, width)[mx.array(where)].reshape(*shape, width)
