"""Reconciliation checks: deterministic, each turning source rows into findings and summary tables.

The numbers in a report come from here, never from the model. A finding
carries its severity and the rows behind it so a reader can go back to the
source line.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from nightshift.app.review.errors import ReviewError
from nightshift.app.review.money import exact_group_sums, exact_sum, to_decimal
from nightshift.app.review.sources import Table
from nightshift.app.review.window import Window

if TYPE_CHECKING:  # numpy is imported by the checks that run: reading schedules (review list, jobs) needs none
    import numpy as np

SEVERITIES = ("high", "medium", "low")
ROWS_KEPT = 20  # rows shown per finding; the count says how many there were


@dataclass
class Finding:
    check: str
    severity: str
    title: str
    detail: str
    amount: Decimal | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    row_count: int = 0


@dataclass
class SummaryTable:
    title: str
    columns: list[str]
    rows: list[list[str]]
    chart: list[tuple[str, Decimal, Decimal | None]] | None = None  # label, current, previous


@dataclass
class CheckContext:
    """What every check sees: the sources, the reviewed window and the one before it."""

    tables: dict[str, Table]
    window: Window
    previous: Window
    materiality: Decimal

    def table(self, name: Any, check: str) -> Table:
        if name not in self.tables:
            raise ReviewError(f"check {check!r} names source {name!r}, which the schedule does not define")
        return self.tables[name]

    def current(self, name: Any, check: str) -> Table:
        return self.table(name, check).between(self.window.start, self.window.end)

    def severity(self, amount: Decimal) -> str:
        return "high" if abs(amount) >= self.materiality else "medium"


@dataclass
class CheckResult:
    findings: list[Finding] = field(default_factory=list)
    tables: list[SummaryTable] = field(default_factory=list)


def _rows(table: Table, indices: np.ndarray) -> list[dict[str, Any]]:
    return [table.row(int(i)) for i in indices[:ROWS_KEPT]]


def _inside(table: Table, window: Window) -> np.ndarray:
    import numpy as np

    return (table.dates >= np.datetime64(window.start, "D")) & (table.dates <= np.datetime64(window.end, "D"))


def check_match(config: dict[str, Any], context: CheckContext) -> CheckResult:
    """Pair two sources by reference, amount and date; report unmatched rows and amount mismatches."""
    from nightshift.app.review.matching import match

    # Counterparts may lie up to the tolerance outside the period (items in transit);
    # only rows dated inside the period are reported.
    tolerance = int(config.get("date_tolerance_days", 3))
    margin = timedelta(days=tolerance)
    window = context.window
    left = context.table(config["left"], "match").between(window.start - margin, window.end + margin)
    right = context.table(config["right"], "match").between(window.start - margin, window.end + margin)
    result = match(left, right, tolerance, bool(config.get("use_reference", True)))
    findings: list[Finding] = []
    left_in, right_in = _inside(left, window), _inside(right, window)
    left_rest = {i for i in result.left_unmatched.tolist() if left_in[i]}
    right_rest = {i for i in result.right_unmatched.tolist() if right_in[i]}
    # Unmatched rows with the same reference on both sides: one finding for the pair.
    left_references, right_references = left.text.get("reference"), right.text.get("reference")
    right_by_reference: dict[str, int] = {}
    for i in result.right_unmatched.tolist() if right_references is not None else []:
        if reference := right_references[i]:
            right_by_reference.setdefault(reference, i)
    for i in sorted(left_rest):
        reference = left_references[i] if left_references is not None else ""
        j = right_by_reference.pop(reference, None) if reference else None
        if j is None or j not in right_rest:
            continue
        left_rest.discard(i)
        right_rest.discard(j)
        difference = left.amount(i) - right.amount(j)
        what = "Amount differs" if difference else "Dates too far apart"
        findings.append(Finding(
            "match", "high", f"{what} for reference {reference}",
            f"{left.name} shows {left.amount(i):,} on {left.dates[i]}, {right.name} shows "
            f"{right.amount(j):,} on {right.dates[j]}: a difference of {difference:,} "
            f"(dates may differ by {tolerance} days).",
            difference, [left.row(i), right.row(j)], 2,
        ))  # fmt: skip
    for table, other, rest in ((left, right, left_rest), (right, left, right_rest)):
        for i in sorted(rest):
            row = table.row(i)
            label = row.get("reference") or row.get("description") or f"line {row['line']}"
            findings.append(Finding(
                "match", context.severity(row["amount"]), f"In {table.name}, not in {other.name}: {label}",
                f"{row['date']} {row.get('description', '')} {row['amount']:,} has no counterpart in {other.name} "
                f"(same amount, within {tolerance} days).",
                row["amount"], [row], 1,
            ))  # fmt: skip
    matched_left, matched_right = int(left_in[result.left].sum()), int(right_in[result.right].sum())
    summary = SummaryTable(
        f"Matching {left.name} with {right.name}",
        ["", left.name, right.name],
        [
            ["rows in period", f"{int(left_in.sum()):,}", f"{int(right_in.sum()):,}"],
            ["matched", f"{matched_left:,}", f"{matched_right:,}"],
            ["not matched", f"{int(left_in.sum()) - matched_left:,}", f"{int(right_in.sum()) - matched_right:,}"],
            ["total", left.format(exact_sum(left.amounts[left_in])), right.format(exact_sum(right.amounts[right_in]))],
        ],
    )
    return CheckResult(findings, [summary])


def check_duplicates(config: dict[str, Any], context: CheckContext) -> CheckResult:
    """Rows of one source equal on every key column (by default date, amount and reference)."""
    import numpy as np

    table = context.current(config["source"], "duplicates")
    keys = list(config.get("keys", ["date", "amount", "reference"]))
    if len(table) == 0:
        return CheckResult()
    codes = np.zeros(len(table), dtype=np.int64)
    for key in keys:
        column = table.column(key)
        # Text as fixed-width unicode: numpy sorts that in C, object arrays through Python comparisons.
        _, inverse = np.unique(column.astype(str) if column.dtype == object else column, return_inverse=True)
        codes = codes * np.int64(inverse.max() + 1) + inverse
        _, codes = np.unique(codes, return_inverse=True)
    order = np.argsort(codes, kind="stable")
    ranked = codes[order]
    boundaries = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1], True])
    findings = []
    for start, stop in itertools.pairwise(boundaries):
        if stop - start < 2:
            continue
        rows = order[start:stop]
        first = table.row(int(rows[0]))
        extra = table.amount(int(rows[0])) * (stop - start - 1)
        label = first.get("reference") or first.get("description") or f"line {first['line']}"
        findings.append(Finding(
            "duplicates", context.severity(extra), f"{stop - start} identical rows in {table.name}: {label}",
            f"{stop - start} rows share {', '.join(keys)} ({first['date']}, {first['amount']:,}); "
            f"if only one is genuine, {extra:,} is counted twice.",
            extra, _rows(table, rows), int(stop - start),
        ))  # fmt: skip
    return CheckResult(findings)


def _totals(table: Table, by: str) -> dict[str, int]:
    import numpy as np

    groups, inverse = np.unique(table.column(by).astype(str), return_inverse=True)
    return dict(zip(groups.tolist(), exact_group_sums(table.amounts, inverse.ravel(), len(groups))))


def check_totals(config: dict[str, Any], context: CheckContext) -> CheckResult:
    """Totals by a column (account, category) for the period; differences against `compare` if given."""
    import numpy as np

    table = context.current(config["source"], "totals")
    by = config.get("by", "account")
    totals = _totals(table, by)
    counts = dict(zip(*np.unique(table.column(by).astype(str), return_counts=True))) if len(table) else {}
    rows = [[group, f"{int(counts[group]):,}", table.format(total)] for group, total in sorted(totals.items())]
    rows.append(["total", f"{len(table):,}", table.format(exact_sum(table.amounts))])
    findings = []
    if other_name := config.get("compare"):
        other = _totals(context.current(other_name, "totals"), by)
        for group in sorted(set(totals) | set(other)):
            difference = totals.get(group, 0) - other.get(group, 0)
            if difference:
                amount = to_decimal(difference, table.scale)
                findings.append(Finding(
                    "totals", context.severity(amount), f"{by} {group}: totals differ",
                    f"{table.name} totals {table.format(totals.get(group, 0))}, {other_name} "
                    f"{table.format(other.get(group, 0))} for {by} {group}.", amount,
                ))  # fmt: skip
    chart = [(group, to_decimal(total, table.scale), None) for group, total in sorted(totals.items())]
    return CheckResult(findings, [SummaryTable(f"Totals of {table.name} by {by}", [by, "rows", "total"], rows, chart)])


def check_balance(config: dict[str, Any], context: CheckContext) -> CheckResult:
    """Opening balance + movements in the period = closing balance, per account."""
    import numpy as np

    balances = context.table(config["balances"], "balance")
    movements = context.current(config["movements"], "balance")
    start, end = np.datetime64(context.window.start, "D"), np.datetime64(context.window.end, "D")
    accounts = sorted(set(balances.text["account"].tolist()))
    findings, rows = [], []
    for account in accounts:
        mine = balances.where(balances.text["account"] == account)
        before = np.flatnonzero(mine.dates < start)
        during = np.flatnonzero((mine.dates >= start) & (mine.dates <= end))
        if len(before) == 0 or len(during) == 0:
            continue
        opening_row = before[np.argmax(mine.dates[before])]
        closing_row = during[np.argmax(mine.dates[during])]
        # `account` set: every movement row belongs to that account (a bank statement);
        # otherwise movements are matched to balances by their own account column.
        fixed = config.get("account")
        if fixed is not None and fixed != account:
            continue
        moved_rows = np.arange(len(movements)) if fixed else np.flatnonzero(movements.text["account"] == account)
        opening, closing = int(mine.amounts[opening_row]), int(mine.amounts[closing_row])
        moved = exact_sum(movements.amounts[moved_rows])
        difference = opening + moved - closing
        rows.append([account, balances.format(opening), balances.format(moved), balances.format(closing),
                     balances.format(difference)])  # fmt: skip
        if difference:
            amount = to_decimal(difference, balances.scale)
            findings.append(Finding(
                "balance", "high", f"{account}: opening + movements does not equal closing",
                f"Opening {balances.format(opening)} ({mine.dates[opening_row]}) + movements "
                f"{balances.format(moved)} = {balances.format(opening + moved)}, but the closing balance on "
                f"{mine.dates[closing_row]} is {balances.format(closing)}: {amount:,} unexplained.",
                amount, [mine.row(int(opening_row)), mine.row(int(closing_row))], 2,
            ))  # fmt: skip
    table = SummaryTable("Balance roll-forward", ["account", "opening", "movements", "closing", "difference"], rows)
    return CheckResult(findings, [table] if rows else [])


def check_variance(config: dict[str, Any], context: CheckContext) -> CheckResult:
    """Totals by a column against the previous period; changes above the threshold are findings."""
    table = context.table(config["source"], "variance")
    by = config.get("by", "account")
    threshold = Decimal(str(config.get("threshold_pct", 25)))
    min_change = Decimal(str(config.get("min_change", "0")))
    current = _totals(table.between(context.window.start, context.window.end), by)
    previous = _totals(table.between(context.previous.start, context.previous.end), by)
    findings, rows, chart = [], [], []
    for group in sorted(set(current) | set(previous)):
        now, before = to_decimal(current.get(group, 0), table.scale), to_decimal(previous.get(group, 0), table.scale)
        change = now - before
        # Percent change of the size, so a cost that grows (more negative) is "up" too.
        percent = ((abs(now) - abs(before)) / abs(before) * 100).quantize(Decimal("1")) if before else None
        if percent is None:
            shown = "new"
        else:
            shown = "no change" if percent == 0 else ("up " if percent > 0 else "down ") + f"{abs(percent)}%"
        rows.append([group, f"{before:,}", f"{now:,}", f"{change:+,}", shown])
        chart.append((group, now, before))
        if abs(change) >= min_change and change and (percent is None or abs(percent) >= threshold):
            findings.append(Finding(
                "variance", "medium", f"{by} {group}: {shown} against {context.previous.label}",
                f"{group} moved from {before:,} in {context.previous.label} to {now:,} in "
                f"{context.window.label} ({change:+,}, {shown}); threshold {threshold}%.", change,
            ))  # fmt: skip
    summary = SummaryTable(
        f"Change of {table.name} by {by}: {context.window.label} against {context.previous.label}",
        [by, context.previous.label, context.window.label, "change", "%"],
        rows,
        chart,
    )
    return CheckResult(findings, [summary])


CHECKS: dict[str, Callable[[dict[str, Any], CheckContext], CheckResult]] = {
    "match": check_match,
    "duplicates": check_duplicates,
    "totals": check_totals,
    "balance": check_balance,
    "variance": check_variance,
}

# Fields each check type needs, checked when the schedule is read.
REQUIRED = {"match": ("left", "right"), "duplicates": ("source",), "totals": ("source",),
            "balance": ("balances", "movements"), "variance": ("source",)}  # fmt: skip


Step = Callable[[str, float], None]  # told a step's name and seconds as it ends (the checks benchmark)


def run_checks(checks: list[dict[str, Any]], context: CheckContext, step: Step | None = None) -> CheckResult:
    """Every check in order; findings sorted by severity, then size."""
    combined = CheckResult()
    for number, config in enumerate(checks, start=1):
        started = time.perf_counter()
        result = CHECKS[config["type"]](config, context)
        if step is not None:
            step(f"check {number} {config['type']}", time.perf_counter() - started)
        combined.findings.extend(result.findings)
        combined.tables.extend(result.tables)
    combined.findings.sort(key=lambda f: (SEVERITIES.index(f.severity), -abs(f.amount or 0)))
    return combined
