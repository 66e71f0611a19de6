"""Reconciliation checks: deterministic, each turning source rows into findings and summary tables.

The numbers in a report come from here, never from the model. A finding
carries its severity, the rows behind it so a reader can go back to the
source line, and its figures, each named by its role (the bank's amount, the
ledger's, the difference, the opening balance...), so that a narrative's
sentence gets every figure placed by the template in the role it names
(app/review/roles.py).

No check does nothing quietly: a check that cannot run on what it got (no
rows in the period, no opening balance, a column the source lacks) raises
`CouldNotRun`, which becomes a high-severity finding "could not run: why",
and every check's state (ran, partly, not run) goes to the report's title
page. A check's findings are capped (`max_findings`): the largest are kept,
the rest are counted and summed in one summary finding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import date, timedelta
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
MAX_FINDINGS = 100  # findings listed per check by default; the rest are summed in one finding
TABLE_ROWS = 40  # groups shown per summary table; the rest are summed in one row


class CouldNotRun(ReviewError):
    """A check cannot run on what it got; the message says why (it becomes a high finding, never a silent pass)."""


class Percent(Decimal):
    """A percentage, exact (260.9375), so that it is never read as an amount."""


@dataclass(frozen=True)
class Figures:
    """What a finding states, each value named by its role, and the shape of the sentence that states them.

    Values are typed: Decimal an amount (signed, as the finding states it), Percent a percentage (exact), int a
    count, date a date, str a name (a reference, an account, a source). The narrative names figures only by
    role (`{difference}`); the template writes the value (app/review/roles.py).
    """

    kind: str = ""  # unmatched, differs, duplicates, totals, balance, variance, more, not_run
    roles: dict[str, Any] = field(default_factory=dict)


@dataclass
class Finding:
    check: str
    severity: str
    title: str
    detail: str
    amount: Decimal | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    row_count: int = 0
    figures: Figures = field(default_factory=Figures)
    summarized: dict[str, int] = field(default_factory=dict)  # a cap's summary: the findings it stands for

    @property
    def stands_for(self) -> int:
        """How many findings this one is: 1, or the number a cap's summary stands for."""
        return sum(self.summarized.values()) or 1


@dataclass
class SummaryTable:
    title: str
    columns: list[str]
    rows: list[list[str]]
    chart: list[tuple[str, Decimal, Decimal | None]] | None = None  # label, current, previous


@dataclass
class CheckRun:
    """One check's outcome for the title page: ran, partly (some accounts could not be checked) or not run."""

    number: int
    check: str
    about: str
    state: str
    findings: int = 0
    reasons: list[str] = field(default_factory=list)


@dataclass
class CheckContext:
    """What every check sees: the sources, the reviewed window and the one before it."""

    tables: dict[str, Table]
    window: Window
    previous: Window
    materiality: Decimal
    max_findings: int = MAX_FINDINGS

    def table(self, name: Any, check: str) -> Table:
        if name not in self.tables:
            raise ReviewError(f"check {check!r} names source {name!r}, which the schedule does not define")
        return self.tables[name]

    def current(self, name: Any, check: str) -> Table:
        return self.table(name, check).between(self.window.start, self.window.end)

    def severity(self, amount: Decimal) -> str:
        return "high" if abs(amount) >= self.materiality else "medium"


@dataclass
class Rest:
    """Findings past a check's cap: counted by severity and summed (absolute), never kept."""

    by_severity: dict[str, int] = field(default_factory=dict)
    total: Decimal = Decimal(0)

    def add(self, severity: str, count: int, total: Decimal) -> None:
        if count:
            self.by_severity[severity] = self.by_severity.get(severity, 0) + count
            self.total += total

    @property
    def count(self) -> int:
        return sum(self.by_severity.values())


@dataclass
class CheckResult:
    findings: list[Finding] = field(default_factory=list)
    tables: list[SummaryTable] = field(default_factory=list)
    runs: list[CheckRun] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)  # parts of a check that could not run (an account)
    rest: Rest = field(default_factory=Rest)

    @property
    def total_findings(self) -> int:
        """Every finding, counting those a cap summed."""
        return sum(f.stands_for for f in self.findings)


def _rows(table: Table, indices: np.ndarray) -> list[dict[str, Any]]:
    return [table.row(int(i)) for i in indices[:ROWS_KEPT]]


def _inside(table: Table, window: Window) -> np.ndarray:
    import numpy as np

    return (table.dates >= np.datetime64(window.start, "D")) & (table.dates <= np.datetime64(window.end, "D"))


def _label(row: dict[str, Any]) -> str:
    return row.get("reference") or row.get("description") or f"line {row['line']}"


def _named(row: dict[str, Any]) -> dict[str, str]:
    """A row's reference and description, those it has, as a finding's roles."""
    return {key: str(row[key]) for key in ("reference", "description") if row.get(key)}


def _day(value: Any) -> date:
    return date.fromisoformat(str(value))


def needed_rows(table: Table, what: str) -> Table:
    """`table`, refused as a whole check when it has no rows: a check over nothing would pass quietly."""
    if len(table) == 0:
        raise CouldNotRun(f"{table.name} has no rows {what}")
    return table


def text_column(table: Table, name: str) -> np.ndarray:
    """A text column the check relies on; refused when the source lacks it or every value is empty."""
    if name in ("date", "amount"):
        return table.column(name)
    values = table.text.get(name)
    if values is None:
        raise CouldNotRun(f"{table.name} has no column {name!r}; map one in the source's `columns`")
    if len(values) and not (values != "").any():
        raise CouldNotRun(f"{table.name} has no {name} values (no column mapped to {name!r}?)")
    return values


def _units(amount: Decimal, scale: int) -> int:
    return int(amount.scaleb(scale).to_integral_value())


def _largest(units: np.ndarray, keep: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the `keep` largest amounts (by size, ties in order) and of the rest."""
    import numpy as np

    order = np.argsort(-np.abs(units), kind="stable")
    return np.sort(order[:keep]), order[keep:]


def _sum_rest(rest: Rest, units: np.ndarray, scale: int, materiality: Decimal, always: str | None = None) -> None:
    """Unmatched rows past the cap, summed into `rest` by severity without becoming findings."""
    import numpy as np

    sizes = np.abs(units)
    high = sizes >= _units(materiality, scale) if always is None else np.ones(len(units), dtype=bool)
    rest.add(always or "high", int(high.sum()), to_decimal(exact_sum(sizes[high]), scale))
    rest.add("medium", int((~high).sum()), to_decimal(exact_sum(sizes[~high]), scale))


def check_match(config: dict[str, Any], context: CheckContext) -> CheckResult:
    """Pair two sources by reference, amount and date; report unmatched rows and amount mismatches."""
    import numpy as np

    from nightshift.app.review.matching import match

    # Counterparts may lie up to the tolerance outside the period (items in transit);
    # only rows dated inside the period are reported.
    tolerance = int(config.get("date_tolerance_days", 3))
    margin = timedelta(days=tolerance)
    window = context.window
    left = context.table(config["left"], "match").between(window.start - margin, window.end + margin)
    right = context.table(config["right"], "match").between(window.start - margin, window.end + margin)
    left_in, right_in = _inside(left, window), _inside(right, window)
    for side in (left, right):
        if len(side) == 0:
            raise CouldNotRun(f"{side.name} has no rows in {window.label} (nor within {tolerance} days of it), "
                              "so nothing can be matched against it")  # fmt: skip
    result = match(left, right, tolerance, bool(config.get("use_reference", True)))
    cap = int(config.get("max_findings", context.max_findings))
    out = CheckResult()
    left_rest = result.left_unmatched[left_in[result.left_unmatched]]
    right_rest = result.right_unmatched[right_in[result.right_unmatched]]
    # Unmatched rows with the same reference on both sides: one finding for the pair.
    left_references, right_references = left.text.get("reference"), right.text.get("reference")
    pairs: list[tuple[int, int]] = []
    if left_references is not None and right_references is not None:
        right_by_reference: dict[str, int] = {}
        for j in result.right_unmatched.tolist():
            if reference := right_references[j]:
                right_by_reference.setdefault(reference, j)
        right_open = set(right_rest.tolist())
        for i in left_rest.tolist():
            j = right_by_reference.pop(left_references[i], None) if left_references[i] else None
            if j is not None and j in right_open:
                pairs.append((i, j))
    paired_left, paired_right = {i for i, _ in pairs}, {j for _, j in pairs}
    left_rest = np.array([i for i in left_rest.tolist() if i not in paired_left], dtype=np.int64)
    right_rest = np.array([j for j in right_rest.tolist() if j not in paired_right], dtype=np.int64)
    differences = np.array([left.amounts[i] - right.amounts[j] for i, j in pairs], dtype=np.int64)
    kept, dropped = _largest(differences, cap)
    _sum_rest(out.rest, differences[dropped], left.scale, context.materiality, always="high")
    for at in kept.tolist():
        i, j = pairs[at]
        reference, difference = left_references[i], left.amount(i) - right.amount(j)
        what = "Amount differs" if difference else "Dates too far apart"
        out.findings.append(Finding(
            "match", "high", f"{what} for reference {reference}",
            f"{left.name} shows {left.amount(i):,} on {left.dates[i]}, {right.name} shows "
            f"{right.amount(j):,} on {right.dates[j]}: a difference of {difference:,} "
            f"(dates may differ by {tolerance} days).",
            difference, [left.row(i), right.row(j)], 2,
            Figures("differs", {"reference": reference, "left": left.name, "right": right.name,
                                "left_amount": left.amount(i), "right_amount": right.amount(j),
                                "difference": difference, "left_date": _day(left.dates[i]),
                                "right_date": _day(right.dates[j]), "days": tolerance}),
        ))  # fmt: skip
    for table, other, rest in ((left, right, left_rest), (right, left, right_rest)):
        kept, dropped = _largest(table.amounts[rest], cap)
        _sum_rest(out.rest, table.amounts[rest[dropped]], table.scale, context.materiality)
        for i in rest[kept].tolist():
            row = table.row(i)
            out.findings.append(Finding(
                "match", context.severity(row["amount"]), f"In {table.name}, not in {other.name}: {_label(row)}",
                f"{row['date']} {row.get('description', '')} {row['amount']:,} has no counterpart in {other.name} "
                f"(same amount, within {tolerance} days).",
                row["amount"], [row], 1,
                Figures("unmatched", {"source": table.name, "other": other.name, "amount": row["amount"],
                                      "date": _day(row["date"]), **_named(row), "days": tolerance}),
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
    out.tables.append(summary)
    return out


def check_duplicates(config: dict[str, Any], context: CheckContext) -> CheckResult:
    """Rows of one source equal on every key column (by default date, amount and reference)."""
    import numpy as np

    table = needed_rows(context.current(config["source"], "duplicates"), f"in {context.window.label}")
    keys = list(config.get("keys", ["date", "amount", "reference"]))
    codes = np.zeros(len(table), dtype=np.int64)
    for key in keys:
        column = text_column(table, key)
        # Text as fixed-width unicode: numpy sorts that in C, object arrays through Python comparisons.
        _, inverse = np.unique(column.astype(str) if column.dtype == object else column, return_inverse=True)
        codes = codes * np.int64(inverse.max() + 1) + inverse
        _, codes = np.unique(codes, return_inverse=True)
    order = np.argsort(codes, kind="stable")
    ranked = codes[order]
    boundaries = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1], True])
    starts, sizes = boundaries[:-1], np.diff(boundaries)
    repeated = np.flatnonzero(sizes >= 2)
    extras = table.amounts[order[starts[repeated]]] * (sizes[repeated] - 1)
    kept, dropped = _largest(extras, int(config.get("max_findings", context.max_findings)))
    out = CheckResult()
    _sum_rest(out.rest, extras[dropped], table.scale, context.materiality)
    for group in repeated[kept].tolist():
        start, count = int(starts[group]), int(sizes[group])
        rows = order[start : start + count]
        first = table.row(int(rows[0]))
        extra = table.amount(int(rows[0])) * (count - 1)
        out.findings.append(Finding(
            "duplicates", context.severity(extra), f"{count} identical rows in {table.name}: {_label(first)}",
            f"{count} rows share {', '.join(keys)} ({first['date']}, {first['amount']:,}); "
            f"if only one is genuine, {extra:,} is counted twice.",
            extra, _rows(table, rows), count,
            Figures("duplicates", {"source": table.name, "count": count, "amount": first["amount"], "extra": extra,
                                   "date": _day(first["date"]), **_named(first)}),
        ))  # fmt: skip
    return out


def _totals(table: Table, by: str) -> dict[str, int]:
    import numpy as np

    groups, inverse = np.unique(text_column(table, by).astype(str), return_inverse=True)
    return dict(zip(groups.tolist(), exact_group_sums(table.amounts, inverse.ravel(), len(groups))))


def _shown(groups: Iterable[str], size: Callable[[str], int]) -> tuple[list[str], list[str]]:
    """The TABLE_ROWS largest groups in name order, and the rest (summed in one row by the caller)."""
    ranked = sorted(groups, key=lambda group: (-size(group), group))
    return sorted(ranked[:TABLE_ROWS]), ranked[TABLE_ROWS:]


def check_totals(config: dict[str, Any], context: CheckContext) -> CheckResult:
    """Totals by a column (account, category) for the period; differences against `compare` if given."""
    import numpy as np

    table = needed_rows(context.current(config["source"], "totals"), f"in {context.window.label}")
    by = config.get("by", "account")
    totals = _totals(table, by)
    counts = dict(zip(*np.unique(text_column(table, by).astype(str), return_counts=True)))
    shown, hidden = _shown(totals, lambda group: abs(totals[group]))
    rows = [[group, f"{int(counts[group]):,}", table.format(totals[group])] for group in shown]
    if hidden:
        rows.append([f"{len(hidden):,} more", f"{sum(int(counts[g]) for g in hidden):,}",
                     table.format(sum(totals[g] for g in hidden))])  # fmt: skip
    rows.append(["total", f"{len(table):,}", table.format(exact_sum(table.amounts))])
    out = CheckResult()
    if other_name := config.get("compare"):
        other = _totals(needed_rows(context.current(other_name, "totals"), f"in {context.window.label}"), by)
        differing = [group for group in sorted(set(totals) | set(other)) if totals.get(group, 0) != other.get(group, 0)]
        differing.sort(key=lambda group: -abs(totals.get(group, 0) - other.get(group, 0)))
        cap = int(config.get("max_findings", context.max_findings))
        for group in differing[cap:]:
            amount = to_decimal(totals.get(group, 0) - other.get(group, 0), table.scale)
            out.rest.add(context.severity(amount), 1, abs(amount))
        for group in differing[:cap]:
            mine, theirs = to_decimal(totals.get(group, 0), table.scale), to_decimal(other.get(group, 0), table.scale)
            out.findings.append(Finding(
                "totals", context.severity(mine - theirs), f"{by} {group}: totals differ",
                f"{table.name} totals {mine:,}, {other_name} {theirs:,} for {by} {group}.",
                mine - theirs, figures=Figures("totals", {"by": by, "group": group, "source": table.name,
                                                          "other": other_name, "total": mine, "other_total": theirs,
                                                          "difference": mine - theirs}),
            ))  # fmt: skip
    chart = [(group, to_decimal(totals[group], table.scale), None) for group in shown]
    out.tables.append(SummaryTable(f"Totals of {table.name} by {by}", [by, "rows", "total"], rows, chart))
    return out


def check_balance(config: dict[str, Any], context: CheckContext) -> CheckResult:
    """Opening balance + movements in the period = closing balance, per account.

    With `account`, only that account is checked and every movement row belongs to it (a bank
    statement); otherwise every account of the balances source, movements matched by their account.
    An account without an opening (last before the period) or closing balance (last in it) is a
    part that could not run, never skipped.
    """
    import numpy as np

    balances = needed_rows(context.table(config["balances"], "balance"), "at all")
    movements = context.current(config["movements"], "balance")
    window = context.window
    start, end = np.datetime64(window.start, "D"), np.datetime64(window.end, "D")
    accounts_of = text_column(balances, "account") if config.get("account") is None else balances.text.get("account")
    accounts_of = np.full(len(balances), "", dtype=object) if accounts_of is None else accounts_of
    known = sorted(set(accounts_of.tolist()) - {""})
    fixed = config.get("account")
    if fixed is not None and fixed not in known:
        listed = f"its accounts are {', '.join(known[:10])}" if known else "it has no account column or values"
        raise CouldNotRun(f"{balances.name} has no balances for account {fixed!r} ({listed}); "
                          "map the account column, give the source a fixed `account`, or name an account it has")  # fmt: skip
    if fixed is None:
        moved_accounts = text_column(movements, "account") if len(movements) else movements.text["account"]
    out, rows = CheckResult(), []
    for account in [fixed] if fixed is not None else known:
        mine = balances.where(accounts_of == account)
        before = np.flatnonzero(mine.dates < start)
        during = np.flatnonzero((mine.dates >= start) & (mine.dates <= end))
        if len(before) == 0:
            out.not_run.append(f"{account}: {balances.name} has no balance before {window.start} (the opening balance)")
            continue
        if len(during) == 0:
            out.not_run.append(
                f"{account}: {balances.name} has no balance dated in {window.label} (the closing balance)"
            )
            continue
        opening_row = before[np.argmax(mine.dates[before])]
        closing_row = during[np.argmax(mine.dates[during])]
        moved_rows = np.arange(len(movements)) if fixed is not None else np.flatnonzero(moved_accounts == account)
        opening, closing = int(mine.amounts[opening_row]), int(mine.amounts[closing_row])
        moved = exact_sum(movements.amounts[moved_rows])
        difference = opening + moved - closing
        rows.append([account, balances.format(opening), balances.format(moved), balances.format(closing),
                     balances.format(difference)])  # fmt: skip
        if difference:
            amount = to_decimal(difference, balances.scale)
            values = [to_decimal(units, balances.scale) for units in (opening, moved, opening + moved, closing)]
            opened, closed = _day(mine.dates[opening_row]), _day(mine.dates[closing_row])
            out.findings.append(Finding(
                "balance", "high", f"{account}: opening + movements does not equal closing",
                f"Opening {values[0]:,} ({opened}) + movements {values[1]:,} = {values[2]:,}, but the closing "
                f"balance on {closed} is {values[3]:,}: {amount:,} unexplained.",
                amount, [mine.row(int(opening_row)), mine.row(int(closing_row))], 2,
                Figures("balance", {"account": account, "opening": values[0], "movements": values[1],
                                    "expected": values[2], "closing": values[3], "difference": amount,
                                    "opening_date": opened, "closing_date": closed}),
            ))  # fmt: skip
    if not rows and out.not_run:
        raise CouldNotRun("; ".join(out.not_run))
    if rows:
        out.tables.append(SummaryTable("Balance roll-forward", ["account", "opening", "movements", "closing",
                                                                "difference"], rows))  # fmt: skip
    return out


def _said(exact: Decimal | None) -> str:
    """A percent change as the report words it: "up 261%", "down 12%", "no change", "new"."""
    if exact is None:
        return "new"
    percent = exact.quantize(Decimal("1"))
    return "no change" if percent == 0 else ("up " if percent > 0 else "down ") + f"{abs(percent)}%"


def check_variance(config: dict[str, Any], context: CheckContext) -> CheckResult:
    """Totals by a column against the previous period; changes above the threshold are findings."""
    table = context.table(config["source"], "variance")
    by = config.get("by", "account")
    threshold = Decimal(str(config.get("threshold_pct", 25)))
    min_change = Decimal(str(config.get("min_change", "0")))
    current = _totals(needed_rows(table.between(context.window.start, context.window.end),
                                  f"in {context.window.label}"), by)  # fmt: skip
    previous = _totals(needed_rows(table.between(context.previous.start, context.previous.end),
                                   f"in {context.previous.label} to compare against"), by)  # fmt: skip
    out, changes = CheckResult(), {}
    for group in set(current) | set(previous):
        now, before = to_decimal(current.get(group, 0), table.scale), to_decimal(previous.get(group, 0), table.scale)
        # Percent change of the size, so a cost that grows (more negative) is "up" too.
        exact = (abs(now) - abs(before)) / abs(before) * 100 if before else None
        changes[group] = (before, now, exact)
    shown, hidden = _shown(changes, lambda group: abs(changes[group][1] - changes[group][0]))
    flagged = [(group, before, now, now - before, exact) for group, (before, now, exact) in sorted(changes.items())
               if now != before and abs(now - before) >= min_change
               and (exact is None or abs(exact.quantize(Decimal("1"))) >= threshold)]  # fmt: skip
    rows = []
    for group in shown:
        before, now, exact = changes[group]
        rows.append([group, f"{before:,}", f"{now:,}", f"{now - before:+,}", _said(exact)])
    if hidden:
        moved = sum((changes[g][1] - changes[g][0] for g in hidden), Decimal(0))
        rows.append([f"{len(hidden):,} more", f"{sum((changes[g][0] for g in hidden), Decimal(0)):,}",
                     f"{sum((changes[g][1] for g in hidden), Decimal(0)):,}", f"{moved:+,}", ""])  # fmt: skip
    flagged.sort(key=lambda item: -abs(item[3]))
    cap = int(config.get("max_findings", context.max_findings))
    for item in flagged[cap:]:
        out.rest.add("medium", 1, abs(item[3]))
    for group, before, now, change, exact in sorted(flagged[:cap]):
        said = _said(exact)
        out.findings.append(Finding(
            "variance", "medium", f"{by} {group}: {said} against {context.previous.label}",
            f"{group} moved from {before:,} in {context.previous.label} to {now:,} in "
            f"{context.window.label} ({change:+,}, {said}); threshold {threshold}%.", change,
            figures=Figures("variance", {"by": by, "group": group, "before": before, "after": now, "change": change,
                                         **({} if exact is None else {"percent": Percent(exact)}),
                                         "threshold": Percent(threshold), "previous": context.previous.label,
                                         "period": context.window.label}),
        ))  # fmt: skip
    chart = [(group, changes[group][1], changes[group][0]) for group in shown]
    out.tables.append(SummaryTable(
        f"Change of {table.name} by {by}: {context.window.label} against {context.previous.label}",
        [by, context.previous.label, context.window.label, "change", "%"], rows, chart,
    ))  # fmt: skip
    return out


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


def _about(config: dict[str, Any]) -> str:
    """What a check looks at, in words, for the title page."""
    kind = config["type"]
    if kind == "match":
        return f"{config['left']} against {config['right']}"
    if kind == "balance":
        account = f" ({config['account']})" if config.get("account") else ""
        return f"{config['balances']}{account} rolled forward with {config['movements']}"
    by = f" by {config.get('by', 'account')}" if kind in ("totals", "variance") else ""
    return f"{config['source']}{by}"


def _could_not_run(kind: str, why: str) -> Finding:
    return Finding(kind, "high", f"could not run: {why}",
                   "This check was not done, so its absence of findings means nothing: fix the source or the "
                   "schedule so it can run.", figures=Figures("not_run", {"check": kind, "why": why}))  # fmt: skip


def _rank(finding: Finding) -> tuple[int, Decimal]:
    return SEVERITIES.index(finding.severity), -abs(finding.amount or 0)


def _capped(kind: str, number: int, result: CheckResult, cap: int) -> list[Finding]:
    """The check's `cap` most severe and largest findings, and one finding that counts and sums the rest."""
    findings = sorted(result.findings, key=_rank)
    rest = result.rest
    for extra in findings[cap:]:
        rest.add(extra.severity, 1, abs(extra.amount or 0))
    findings = findings[:cap]
    if rest.count:
        counts = ", ".join(f"{rest.by_severity[s]:,} {s}" for s in SEVERITIES if s in rest.by_severity)
        findings.append(Finding(
            kind, next(s for s in SEVERITIES if s in rest.by_severity), f"{rest.count:,} more {kind} findings not listed",
            f"Check {number} found {len(findings) + rest.count:,} findings; the {len(findings):,} largest are listed. "
            f"The other {rest.count:,} ({counts}) amount to {rest.total:,} in absolute terms. Raise `max_findings` "
            "in the check to list more, or look for what makes so many (the wrong file or period?).",
            rest.total, figures=Figures("more", {"check": kind, "count": rest.count, "listed": len(findings),
                                                 "total": rest.total}),
            summarized=dict(rest.by_severity),
        ))  # fmt: skip
    return findings


def run_checks(checks: list[dict[str, Any]], context: CheckContext, step: Step | None = None) -> CheckResult:
    """Every check in order; findings sorted by severity, then size; each check's state in `runs`."""
    combined = CheckResult()
    for number, config in enumerate(checks, start=1):
        kind = config["type"]
        started = time.perf_counter()
        try:
            result = CHECKS[kind](config, context)
        except CouldNotRun as exc:
            result = CheckResult(not_run=[str(exc)])
            state = "not run"
        else:
            state = "partly" if result.not_run else "ran"
        if step is not None:
            step(f"check {number} {kind}", time.perf_counter() - started)
        findings = [_could_not_run(kind, why) for why in result.not_run]
        findings += _capped(kind, number, result, int(config.get("max_findings", context.max_findings)))
        combined.runs.append(CheckRun(number, kind, _about(config), state, sum(f.stands_for for f in findings),
                                      result.not_run))  # fmt: skip
        combined.findings.extend(findings)
        combined.tables.extend(result.tables)
    combined.findings.sort(key=_rank)
    return combined
