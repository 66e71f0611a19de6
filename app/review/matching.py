"""Two-source matching (bank vs ledger) with numpy: reference first, then amount, dates within a tolerance.

Each pass groups rows by a key (reference and amount, then amount alone).
Within a group rows are paired in date order, each left row taking the
earliest right row within the tolerance: every row's window of acceptable
dates has the same width, so this pairs as many rows as possible (an amount
paid twice in a week still pairs both). All groups advance together, one
vectorised step per round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nightshift.app.review.sources import Table


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
        out.append(codes[start : start + len(column)].astype(np.int64, copy=False))
        start += len(column)
    return out


def pair_by_key(left_keys: np.ndarray, left_days: np.ndarray, right_keys: np.ndarray, right_days: np.ndarray,
                tolerance: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """One-to-one pairs (positions into the inputs) with equal keys and days at most `tolerance` apart.

    Both sides are sorted by (key, day); every group then advances two cursors
    at once, one vectorised step per round: a right row too early for the
    current left row is passed over, one within reach is paired, and a left
    row nothing can reach is left alone. Rounds = the largest group's rows.
    """
    if len(left_keys) == 0 or len(right_keys) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    left_codes, right_codes = _factorize(left_keys, right_keys)
    groups = int(max(left_codes.max(), right_codes.max())) + 1
    left_order = np.lexsort((left_days, left_codes))
    right_order = np.lexsort((right_days, right_codes))
    left_sorted_days, right_sorted_days = left_days[left_order], right_days[right_order]
    left_count = np.bincount(left_codes, minlength=groups)
    right_count = np.bincount(right_codes, minlength=groups)
    left_start = np.cumsum(left_count) - left_count
    right_start = np.cumsum(right_count) - right_count

    both = np.flatnonzero((left_count > 0) & (right_count > 0))
    at_left, at_right = left_start[both].copy(), right_start[both].copy()
    end_left, end_right = at_left + left_count[both], at_right + right_count[both]
    pairs_left, pairs_right = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    active = np.arange(len(both))
    while len(active):
        i, j = at_left[active], at_right[active]
        left_day, right_day = left_sorted_days[i], right_sorted_days[j]
        early = right_day < left_day - tolerance
        hit = ~early & (right_day <= left_day + tolerance)
        pairs_left.append(left_order[i[hit]])
        pairs_right.append(right_order[j[hit]])
        at_right[active[early | hit]] += 1
        at_left[active[~early]] += 1
        active = active[(at_left[active] < end_left[active]) & (at_right[active] < end_right[active])]
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

    def run_pass(
        key_left: np.ndarray, key_right: np.ndarray, usable_left: np.ndarray, usable_right: np.ndarray
    ) -> None:
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
        # Only rows with a reference take part, so only theirs are turned into codes (as fixed-width
        # text, the largest transient of a match: a statement without references skips it).
        usable_left, usable_right = left.text["reference"] != "", right.text["reference"] != ""
        with_left, with_right = np.flatnonzero(usable_left), np.flatnonzero(usable_right)
        if len(with_left) and len(with_right):
            ref_left, ref_right = _factorize(left.text["reference"][with_left].astype(str),
                                             right.text["reference"][with_right].astype(str))  # fmt: skip
            width = np.int64(max(amount_left.max(initial=0), amount_right.max(initial=0)) + 1)
            key_left, key_right = np.zeros(len(left), dtype=np.int64), np.zeros(len(right), dtype=np.int64)
            key_left[with_left] = ref_left * width + amount_left[with_left]
            key_right[with_right] = ref_right * width + amount_right[with_right]
            run_pass(key_left, key_right, usable_left, usable_right)
    run_pass(amount_left, amount_right, np.ones(len(left), bool), np.ones(len(right), bool))
    return MatchResult(
        np.concatenate(pairs_left), np.concatenate(pairs_right), np.flatnonzero(left_free), np.flatnonzero(right_free)
    )
