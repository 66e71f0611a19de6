"""Two-source matching (bank vs ledger) with numpy: reference first, then amount, dates within a tolerance.

Each pass groups rows by a key (reference and amount, then amount alone).
Most groups hold one row per side: those are paired in one vectorised step
when their dates are close enough. Groups with several rows on a side (the
same amount paid twice in a week) go through a date-ordered sweep, which
pairs as many rows as the tolerance allows: every row's window of acceptable
dates has the same width, so taking the earliest acceptable counterpart for
each row in date order is optimal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.review.sources import Table


@dataclass
class MatchResult:
    """Index pairs into the left and right tables, and which rows stayed unmatched."""

    left: np.ndarray
    right: np.ndarray
    left_unmatched: np.ndarray
    right_unmatched: np.ndarray


def _factorize(*columns: np.ndarray) -> list[np.ndarray]:
    """Dense integer codes for values shared across columns (equal values, equal codes)."""
    joined = np.concatenate(columns)
    _, codes = np.unique(joined, return_inverse=True)
    out, start = [], 0
    for column in columns:
        out.append(codes[start : start + len(column)].astype(np.int64))
        start += len(column)
    return out


def sweep(left_days: list[int], right_days: list[int], tolerance: int) -> list[tuple[int, int]]:
    """Positions of pairs within one group; both lists sorted by day."""
    pairs, j = [], 0
    for i, day in enumerate(left_days):
        while j < len(right_days) and right_days[j] < day - tolerance:
            j += 1  # too early for this row, so for every later one too
        if j < len(right_days) and right_days[j] <= day + tolerance:
            pairs.append((i, j))
            j += 1
    return pairs


def pair_by_key(left_keys: np.ndarray, left_days: np.ndarray, right_keys: np.ndarray, right_days: np.ndarray,
                tolerance: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """One-to-one pairs (positions into the inputs) with equal keys and days at most `tolerance` apart."""
    if len(left_keys) == 0 or len(right_keys) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    left_codes, right_codes = _factorize(left_keys, right_keys)
    groups = int(max(left_codes.max(), right_codes.max())) + 1
    left_count = np.bincount(left_codes, minlength=groups)
    right_count = np.bincount(right_codes, minlength=groups)
    # Right rows ordered by (group, day): each group is one slice, found by searchsorted.
    right_order = np.lexsort((right_days, right_codes))
    right_start = np.searchsorted(right_codes[right_order], np.arange(groups))

    single = (left_count == 1) & (right_count == 1)
    lone = np.flatnonzero(single[left_codes])
    partner = right_order[right_start[left_codes[lone]]]
    close = np.abs(left_days[lone] - right_days[partner]) <= tolerance
    pairs_left, pairs_right = [lone[close]], [partner[close]]

    crowded = np.flatnonzero((left_count > 0) & (right_count > 0) & ~single)
    if len(crowded):
        left_order = np.lexsort((left_days, left_codes))
        left_start = np.searchsorted(left_codes[left_order], np.arange(groups))
        swept_left, swept_right = [], []
        for group in crowded.tolist():
            lefts = left_order[left_start[group] : left_start[group] + left_count[group]]
            rights = right_order[right_start[group] : right_start[group] + right_count[group]]
            for i, j in sweep(left_days[lefts].tolist(), right_days[rights].tolist(), tolerance):
                swept_left.append(lefts[i])
                swept_right.append(rights[j])
        pairs_left.append(np.array(swept_left, dtype=np.int64))
        pairs_right.append(np.array(swept_right, dtype=np.int64))
    return np.concatenate(pairs_left), np.concatenate(pairs_right)


def match(left: Table, right: Table, date_tolerance_days: int, use_reference: bool = True) -> MatchResult:
    """Pair rows of `left` and `right` with equal amounts and dates at most `date_tolerance_days` apart.

    With `use_reference`, rows with the same non-empty reference and amount are paired first,
    then the rest by amount alone.
    """
    left_free = np.ones(len(left), dtype=bool)
    right_free = np.ones(len(right), dtype=bool)
    pairs_left, pairs_right = [], []
    amount_left, amount_right = _factorize(left.amounts, right.amounts)
    day_left, day_right = left.dates.astype(np.int64), right.dates.astype(np.int64)

    def run_pass(key_left: np.ndarray, key_right: np.ndarray, usable_left: np.ndarray, usable_right: np.ndarray) -> None:
        rows_left = np.flatnonzero(left_free & usable_left)
        rows_right = np.flatnonzero(right_free & usable_right)
        at_left, at_right = pair_by_key(key_left[rows_left], day_left[rows_left], key_right[rows_right],
                                        day_right[rows_right], date_tolerance_days)  # fmt: skip
        chosen_left, chosen_right = rows_left[at_left], rows_right[at_right]
        left_free[chosen_left] = False
        right_free[chosen_right] = False
        pairs_left.append(chosen_left)
        pairs_right.append(chosen_right)

    if use_reference and "reference" in left.text and "reference" in right.text:
        ref_left, ref_right = _factorize(left.text["reference"].astype(str), right.text["reference"].astype(str))
        width = np.int64(max(amount_left.max(initial=0), amount_right.max(initial=0)) + 1)
        run_pass(ref_left * width + amount_left, ref_right * width + amount_right,
                 left.text["reference"] != "", right.text["reference"] != "")  # fmt: skip
    run_pass(amount_left, amount_right, np.ones(len(left), bool), np.ones(len(right), bool))
    return MatchResult(
        np.concatenate(pairs_left), np.concatenate(pairs_right), np.flatnonzero(left_free), np.flatnonzero(right_free)
    )
