"""OFX and QFX statements (versions 1 in SGML and 2 in XML), read and validated by `ofxtools`.

ofxtools checks every element against the OFX specification (required
elements, types, enumerations) and gives amounts as Decimals. Two things it
does not do that a statement needs, done here on the raw elements:

- dates: it converts `DTPOSTED` to UTC, so a booking stamped 00:30 in Berlin
  lands on the day before; the bank's own calendar date (the text's first
  eight digits) is kept instead.
- amounts: it accepts `1E+3` and `NaN`; an amount must be written as a plain
  decimal number.

Intuit's private tags (QFX's `INTU.BID` ...) are skipped.

What maps to what, per statement (`STMTRS` bank, `CCSTMTRS` credit card):

- entries: each `STMTTRN` in `BANKTRANLIST`; amount `TRNAMT` as signed in the
  file (debits negative), currency `CURRENCY/CURSYM` where given, else
  `CURDEF`; date `DTPOSTED` (the bank's date); account `ACCTID`; reference
  `REFNUM`, else `CHECKNUM`; description `NAME` (or `PAYEE/NAME`) and `MEMO`.
- balances: `LEDGERBAL` (`BALAMT` at `DTASOF`), a closing balance. OFX states
  no opening balance: the balance before the period comes from an earlier
  statement in the file (a bank's multi-month download) or the balance check
  says it could not run.
"""

from __future__ import annotations

import io
import re
import warnings
from datetime import date
from decimal import Decimal
from typing import Any, ClassVar

from nightshift.app.review.formats.base import Entry, FormatError, Statement, StatementSource

_PLAIN = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)")
_DAY = re.compile(r"(\d{4})(\d{2})(\d{2})")


class OfxSource(StatementSource):
    kind: ClassVar[str] = "ofx"

    def read(self, data: bytes) -> Statement:
        from ofxtools.models.base import Aggregate
        from ofxtools.Parser import OFXTree

        parser = OFXTree()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # private (QFX) tags are skipped, by design
                parser.parse(io.BytesIO(data))
        except Exception as exc:  # ofxtools raises its own header and parse errors, and ValueError
            raise FormatError(f"{self.where()}: not readable as OFX: {_short(exc)}") from None
        text = data.decode("latin-1")  # only to find line numbers of tags (ASCII)
        lines = {tag: _lines(text, f"<{tag}>") for tag in ("STMTTRN", "LEDGERBAL")}
        seen = {"STMTTRN": 0, "LEDGERBAL": 0}
        entries: list[Entry] = []
        balances: list[Entry] = []
        for raw in (element for element in parser.getroot().iter() if element.tag in ("STMTRS", "CCSTMTRS")):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    statement = Aggregate.from_etree(raw)
            except Exception as exc:  # ofxtools' OFXSpecError (a ValueError) and decimal errors
                raise FormatError(f"{self.where()}: a statement does not fit the OFX specification: "
                                  f"{_short(exc)}") from None  # fmt: skip
            account = statement.account.acctid
            for element, transaction in zip(raw.iter("STMTTRN"), statement.banktranlist or []):
                line = _at(lines["STMTTRN"], seen, "STMTTRN")
                currency = transaction.currency.cursym if transaction.currency is not None else statement.curdef
                name = transaction.name or (transaction.payee.name if transaction.payee is not None else "")
                entries.append(Entry(
                    line, self._day(element, "DTPOSTED", line), self._amount(element, "TRNAMT", line),
                    currency, account, transaction.refnum or transaction.checknum or "",
                    " ".join(part for part in (name, transaction.memo) if part),
                ))  # fmt: skip
            ledger = raw.find("LEDGERBAL")
            line = _at(lines["LEDGERBAL"], seen, "LEDGERBAL")
            balances.append(Entry(line, self._day(ledger, "DTASOF", line), self._amount(ledger, "BALAMT", line),
                                  statement.curdef, account, "", "ledger balance"))  # fmt: skip
        return Statement(entries, balances)

    def _amount(self, element: Any, tag: str, line: int | None) -> Decimal:
        text = (element.findtext(tag) or "").strip()
        if not _PLAIN.fullmatch(text):
            raise FormatError(f"{self.where(line)}: {tag} {text!r} is not a plain decimal amount")
        return Decimal(text)

    def _day(self, element: Any, tag: str, line: int | None) -> date:
        found = _DAY.match((element.findtext(tag) or "").strip())  # ofxtools has checked the whole stamp
        if found is None:
            raise FormatError(f"{self.where(line)}: {tag} is not an OFX date")
        return date(int(found.group(1)), int(found.group(2)), int(found.group(3)))


def _lines(text: str, marker: str) -> list[int]:
    """The line of each occurrence of `marker`, in order."""
    return [text.count("\n", 0, found.start()) + 1 for found in re.finditer(re.escape(marker), text)]


def _at(lines: list[int], seen: dict[str, int], tag: str) -> int | None:
    index = seen[tag]
    seen[tag] += 1
    return lines[index] if index < len(lines) else None


def _short(exc: BaseException) -> str:
    """An ofxtools message cut to a readable length (some list every allowed value)."""
    message = str(exc) or type(exc).__name__
    return message if len(message) <= 240 else message[:240] + " ..."
