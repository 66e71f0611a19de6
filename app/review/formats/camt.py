"""ISO 20022 camt.053 bank-to-customer statements (what European banks export), checked against ISO's schema.

The file is parsed by lxml (no network, no entities: a statement never
fetches anything) and validated by xmlschema against the official
camt.053.001.NN schema its namespace names (versions 02 to 14 ship in xsd/);
a file that does not fit is refused with the schema's reason, the element's
path and line. Only then are the fields read, so every amount is a valid
xs:decimal (never an exponent, never negative: the sign is `CdtDbtInd`).

What maps to what, per `Stmt` (one account, one period):

- entries: every `Ntry` with status BOOK (pending and information entries move
  no balance); amount `Amt` signed by `CdtDbtInd` (DBIT negative; a reversal,
  `RvslInd`, is already marked in the direction it moves money), currency
  `Amt/@Ccy`, date `BookgDt`, account `Acct/Id` (IBAN or other id),
  reference the single transaction's `EndToEndId` (unless NOTPROVIDED) or
  its structured creditor reference, description the related parties'
  names, the unstructured remittance text and `AddtlNtryInf`.
- balances: `CLBD` (closing booked) at the end of its date; the first
  statement's `OPBD` (opening booked; `PRCD` if it has none) is the balance
  before its date's bookings, so it is dated the day before. Available and
  interim balances are not read.
"""

from __future__ import annotations

import functools
import re
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from nightshift.app.review.formats.base import Entry, FormatError, Statement, StatementSource

if TYPE_CHECKING:
    import xmlschema
    from lxml import etree

SCHEMAS = Path(__file__).resolve().parent / "xsd"
_NAMESPACE = re.compile(r"\{urn:iso:std:iso:20022:tech:xsd:(camt\.\d{3}\.\d{3}\.\d{2})\}Document")


@functools.cache
def schema(version: str) -> xmlschema.XMLSchema:
    """The official schema of one camt.053 version (loading one takes about half a second, so it is kept)."""
    import xmlschema

    return xmlschema.XMLSchema(SCHEMAS / f"{version}.xsd")


def known_versions() -> list[str]:
    return sorted(path.stem for path in SCHEMAS.glob("camt.053.*.xsd"))


class Camt053Source(StatementSource):
    kind: ClassVar[str] = "camt053"

    def read(self, data: bytes) -> Statement:
        from lxml import etree

        parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
        try:
            root = etree.fromstring(data, parser)
        except etree.XMLSyntaxError as exc:
            raise FormatError(f"{self.where(exc.lineno)}: not well-formed XML: {exc.msg}") from None
        found = _NAMESPACE.fullmatch(root.tag)
        if found is None or not found.group(1).startswith("camt.053."):
            raise FormatError(f"{self.where(root.sourceline)}: not a camt.053 statement: the root element is "
                              f"{root.tag!r}; a camt.053 file starts with <Document xmlns=\"urn:iso:std:iso:20022:"
                              "tech:xsd:camt.053.001.NN\">")  # fmt: skip
        version = found.group(1)
        if version not in known_versions():
            raise FormatError(f"{self.where()}: {version} is not a version this reader knows "
                              f"({', '.join(known_versions())})")  # fmt: skip
        error = next(schema(version).iter_errors(root), None)
        if error is not None:
            line = error.sourceline if isinstance(error.sourceline, int) else None
            leaf = error.elem is not None and len(error.elem) == 0 and (error.elem.text or "").strip()
            value = f" (the value is {leaf!r})" if leaf else ""
            raise FormatError(f"{self.where(line)}: does not fit the {version} schema at {error.path}{value}: "
                              f"{error.reason or error.message}")  # fmt: skip
        return _Reader(self, {"c": root.tag[1 : root.tag.index("}")]}).read(root)


class _Reader:
    """Walks a schema-valid document; `c` is its namespace."""

    def __init__(self, source: Camt053Source, namespaces: dict[str, str]):
        self.source, self.ns = source, namespaces

    def text(self, element: etree._Element, path: str) -> str:
        found = element.find(path, self.ns)
        return (found.text or "").strip() if found is not None else ""

    def texts(self, element: etree._Element, path: str) -> list[str]:
        return [(found.text or "").strip() for found in element.findall(path, self.ns) if (found.text or "").strip()]

    def amount(self, element: etree._Element) -> tuple[Decimal, str]:
        """`Amt` signed by `CdtDbtInd` (the schema has made sure both are there and valid), and its currency."""
        amount = element.find("c:Amt", self.ns)
        value = Decimal(amount.text.strip())
        return (-value if self.text(element, "c:CdtDbtInd") == "DBIT" else value), amount.get("Ccy")

    def day(self, element: etree._Element, path: str) -> date | None:
        """A `Dt` or `DtTm` (the date as the bank wrote it, whatever its time zone)."""
        text = self.text(element, f"{path}/c:Dt") or self.text(element, f"{path}/c:DtTm")[:10]
        return date.fromisoformat(text) if text else None

    def read(self, root: etree._Element) -> Statement:
        entries: list[Entry] = []
        balances: list[Entry] = []
        opened: set[str] = set()
        for statement in root.iterfind("c:BkToCstmrStmt/c:Stmt", self.ns):
            account = self.text(statement, "c:Acct/c:Id/c:IBAN") or self.text(statement, "c:Acct/c:Id/c:Othr/c:Id")
            stated = {self.text(balance, "c:Tp/c:CdOrPrtry/c:Cd"): balance
                      for balance in statement.iterfind("c:Bal", self.ns)}  # fmt: skip
            opening = stated.get("OPBD", stated.get("PRCD"))
            if opening is not None and account not in opened:
                opened.add(account)
                amount, currency = self.amount(opening)
                day = self.day(opening, "c:Dt") - timedelta(days=1)
                balances.append(Entry(opening.sourceline, day, amount, currency, account, "", "opening balance"))
            if (closing := stated.get("CLBD")) is not None:
                amount, currency = self.amount(closing)
                balances.append(Entry(closing.sourceline, self.day(closing, "c:Dt"), amount, currency, account, "",
                                      "closing balance"))  # fmt: skip
            entries.extend(self.entry(entry, account) for entry in statement.iterfind("c:Ntry", self.ns)
                           if self.status(entry) == "BOOK")  # fmt: skip
        return Statement(entries, balances)

    def status(self, entry: etree._Element) -> str:
        return self.text(entry, "c:Sts/c:Cd") or self.text(entry, "c:Sts")  # a code (02-07) or a choice (08 on)

    def entry(self, entry: etree._Element, account: str) -> Entry:
        day = self.day(entry, "c:BookgDt")
        if day is None:
            raise FormatError(f"{self.source.where(entry.sourceline)}: a booked entry (Sts BOOK) without a "
                              "booking date (BookgDt)")  # fmt: skip
        amount, currency = self.amount(entry)
        details = entry.findall("c:NtryDtls/c:TxDtls", self.ns)
        reference = ""
        if len(details) == 1:
            end_to_end = self.text(details[0], "c:Refs/c:EndToEndId")
            creditor = self.text(details[0], "c:RmtInf/c:Strd/c:CdtrRefInf/c:Ref")
            reference = end_to_end if end_to_end and end_to_end != "NOTPROVIDED" else creditor
        words = [name for tx in details for name in self.texts(tx, "c:RltdPties//c:Nm")]
        words += [text for tx in details for text in self.texts(tx, "c:RmtInf/c:Ustrd")]
        words += self.texts(entry, "c:AddtlNtryInf")
        return Entry(entry.sourceline, day, amount, currency, account, reference, " ".join(words))
