"""A Beancount ledger (v3), read by Beancount's own loader: both the books and their balances.

The loader parses, books (fills in the amount a posting leaves out) and
validates the file; every error it reports is refused with its line, except a
failed balance assertion: that is exactly what the balance check is for, so
the assertions come through as balances and the check reports the
difference. The file is read as text through `load_string`, so the loader
keeps no cache file next to the ledger; `include` is refused (only the one
file is read and hashed), and so is any `plugin` outside Beancount's own
(a plugin is Python code the loader would import and run).

What maps to what:

- entries, with `account` set (`Assets:Bank:Operating`): each posting to that
  account is a row, its units the amount, its transaction's date; the row's
  `account` is the transaction's other accounts (`Expenses:Travel`), so totals
  and variance by account show where the money went. Without `account`: every
  posting, with its own account. Reference: the transaction's first link
  (`^INV-7004`); description: payee and narration.
- balances: each `balance` directive (for `account`, if set). Beancount asserts
  the balance at the start of its date, before that day's bookings, so it is
  the balance at the end of the day before, and is dated so.
"""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

from nightshift.app.review.formats.base import Entry, FormatError, Statement, StatementSource


class BeancountSource(StatementSource):
    kind: ClassVar[str] = "beancount"

    def read(self, data: bytes) -> Statement:
        from beancount import loader
        from beancount.core.data import Balance, Transaction
        from beancount.ops.balance import BalanceError
        from beancount.parser import parser

        text = self.decode(data, "Beancount files are UTF-8")
        _, _, options = parser.parse_string(text)
        if options["include"]:
            raise FormatError(f"{self.where()}: includes other files ({', '.join(options['include'])}); only one "
                              "file is read: point `path` at a ledger without `include`")  # fmt: skip
        foreign = [name for name, _ in options["plugin"] if not name.startswith("beancount.")]
        if foreign:
            raise FormatError(f"{self.where()}: loads plugins {foreign}; only Beancount's own (beancount.plugins.*) "
                              "run here, since a plugin is code")  # fmt: skip
        directives, errors, _ = loader.load_string(text)
        refused = [error for error in errors if not isinstance(error, BalanceError)]
        if refused:
            first = refused[0]
            more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
            raise FormatError(f"{self.where(first.source.get('lineno'))}: {first.message.strip()}{more}")
        entries: list[Entry] = []
        balances: list[Entry] = []
        for directive in directives:
            if isinstance(directive, Transaction):
                entries.extend(self._rows(directive))
            elif isinstance(directive, Balance) and self.account in (None, directive.account):
                balances.append(Entry(
                    directive.meta["lineno"], directive.date - timedelta(days=1), directive.amount.number,
                    directive.amount.currency, directive.account, "", "balance assertion",
                ))  # fmt: skip
        return Statement(entries, balances)

    def _rows(self, transaction):
        reference = sorted(transaction.links)[0] if transaction.links else ""
        description = " ".join(part for part in (transaction.payee, transaction.narration) if part)
        line = transaction.meta.get("lineno")
        for posting in transaction.postings:
            if self.account is None:
                account = posting.account
            elif posting.account == self.account:
                account = ", ".join(sorted({p.account for p in transaction.postings if p.account != self.account}))
            else:
                continue
            yield Entry(line, transaction.date, posting.units.number, posting.units.currency, account, reference,
                        description)  # fmt: skip

    def select(self, statement: Statement) -> list[Entry]:
        """Entries are chosen by `account` as they are read (their account column is the counterpart)."""
        return statement.entries if self.rows == "entries" else statement.balances
