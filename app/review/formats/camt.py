"""ISO 20022 camt.053 bank-to-customer statements (what European banks export), each field read checked strictly.

The file is parsed by lxml (no network, no entities: a statement never
fetches anything). Its namespace names the version (camt.053.001.02 to .14
are read). ISO's schemas are not shipped (they are ISO's files, not ours), so
the reader checks every element it reads as strictly as the schema would,
and refuses the file naming its line, the element's path and what is wrong:

- the document holds one `BkToCstmrStmt` with at least one `Stmt`; each
  element the reader walks through (`Stmt`, `Acct`, `Bal`, `Ntry`, `TxDtls`,
  `Refs`, `RmtInf`...) holds only the children the standard names there, so a
  misspelt `Ntry` or `Bal` is refused, never skipped;
- `Amt` is an xs:decimal without sign or exponent (the sign is `CdtDbtInd`),
  with at most its currency's ISO 4217 minor-unit digits (5, the schema's
  limit, for a code Babel does not know); `Ccy` is three capital letters;
  `CdtDbtInd` is exactly CRDT or DBIT;
- `Sts` is BOOK, PDNG or INFO (versions 02 to 06) or a `Cd` of ISO's entry
  status codes or a `Prtry` (07 on); a balance's `Tp/CdOrPrtry` is a `Cd` of
  ISO's balance codes or a `Prtry`, and a statement states OPBD, PRCD and
  CLBD at most once each; the references read are 1 to 35 characters;
- dates (`Dt`, `DtTm`) are valid ISO dates and times, exactly one per date;
- each element read (`Acct/Id` as `IBAN` or `Othr/Id`, `Amt`,
  `CdtDbtInd`, `Sts`, a balance's `Dt`, a booked entry's `BookgDt`)
  occurs exactly once where it must.

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
  interim balances are checked but not read.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, ClassVar

from nightshift.app.review.errors import ReviewError
from nightshift.app.review.formats.base import Entry, FormatError, Statement, StatementSource
from nightshift.app.review.money import currency_digits

if TYPE_CHECKING:
    from lxml import etree

VERSIONS = range(2, 15)  # camt.053.001.02 to .14
CHOICE_STATUS = 7  # from this version on, `Sts` is a choice of `Cd` and `Prtry`, not a bare code
SCHEMA_DECIMALS = 5  # the schemas' fractionDigits on every amount
_NAMESPACE = re.compile(r"\{(urn:iso:std:iso:20022:tech:xsd:(camt\.\d{3}\.\d{3}\.(\d{2})))\}Document")
_XML_SPACE = " \t\r\n"  # what xs:decimal, xs:date and xs:dateTime collapse; codes keep theirs (and are refused)
_AMOUNT = re.compile(r"\d+(\.\d+)?")
_CURRENCY = re.compile(r"[A-Z]{3}")
_IBAN = re.compile(r"[A-Z]{2}[0-9]{2}[a-zA-Z0-9]{1,30}")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}(Z|[+-]\d{2}:\d{2})?")
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?")
DIRECTIONS = ("CRDT", "DBIT")
OLD_STATUSES = ("BOOK", "PDNG", "INFO")  # versions 02 to 06
STATUSES = ("BOOK", "FUTR", "INFO", "PDNG")  # ISO's external entry status codes (07 on)
BALANCE_CODES = ("CLAV", "CLBD", "FWAV", "INFO", "ITAV", "ITBD", "OPAV", "OPBD", "PRCD", "XPCD")
READ_BALANCES = ("OPBD", "PRCD", "CLBD")
# The children the standard names in each element the reader walks through (versions 02 to 14 together): any
# other child is refused, so a misspelt `Ntry`, `Bal` or `Refs` is never skipped as if it were not there.
PARTS = {
    "Document": {"BkToCstmrStmt"},
    "BkToCstmrStmt": {"GrpHdr", "Stmt", "SplmtryData"},
    "Stmt": {"Id", "StmtPgntn", "ElctrncSeqNb", "RptgSeq", "LglSeqNb", "CreDtTm", "FrToDt", "CpyDplctInd", "RptgSrc",
             "Acct", "RltdAcct", "Intrst", "Bal", "TxsSummry", "Ntry", "AddtlStmtInf"},
    "Acct": {"Id", "Tp", "Ccy", "Nm", "Prxy", "Ownr", "Svcr"},
    "Acct/Id": {"IBAN", "Othr"},
    "Bal": {"Tp", "CdtLine", "Amt", "CdtDbtInd", "Dt", "Avlbty"},
    "Bal/Tp": {"CdOrPrtry", "SubTp"},
    "Ntry": {"NtryRef", "Amt", "CdtDbtInd", "RvslInd", "Sts", "BookgDt", "ValDt", "AcctSvcrRef", "Avlbty", "BkTxCd",
             "ComssnWvrInd", "AddtlInfInd", "AmtDtls", "Chrgs", "TechInptChanl", "Intrst", "CardTx", "NtryDtls",
             "AddtlNtryInf"},
    "NtryDtls": {"Btch", "TxDtls"},
    "TxDtls": {"Refs", "Amt", "CdtDbtInd", "AmtDtls", "Avlbty", "BkTxCd", "Chrgs", "Intrst", "RltdPties", "RltdAgts",
               "LclInstrm", "PmtTpInf", "Purp", "RltdRmtInf", "RmtInf", "RltdDts", "RltdPric", "RltdQties",
               "FinInstrmId", "Tax", "RtrInf", "CorpActn", "SfkpgAcct", "CshDpst", "CardTx", "AddtlTxInf",
               "SplmtryData", "InstrCpy", "RltdCorpActn", "UndrlygAllcn"},
    "Refs": {"MsgId", "AcctSvcrRef", "PmtInfId", "InstrId", "EndToEndId", "UETR", "TxId", "MndtId", "ChqNb",
             "ClrSysRef", "AcctOwnrTxId", "AcctSvcrTxId", "MktInfrstrctrTxId", "PrcgId", "Prtry", "RtrId"},
    "RmtInf": {"Ustrd", "Strd"},
    "Strd": {"RfrdDocInf", "RfrdDocAmt", "CdtrRefInf", "Invcr", "Invcee", "TaxRmt", "GrnshmtRmt", "AddtlRmtInf",
             "SctiesData"},
    "CdtrRefInf": {"Tp", "Ref"},
}  # fmt: skip


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
        if found is None or not found.group(2).startswith("camt.053."):
            raise FormatError(f"{self.where(root.sourceline)}: not a camt.053 statement: the root element is "
                              f"{root.tag!r}; a camt.053 file starts with <Document xmlns=\"urn:iso:std:iso:20022:"
                              "tech:xsd:camt.053.001.NN\">")  # fmt: skip
        namespace, version, number = found.groups()
        if not version.startswith("camt.053.001.") or int(number) not in VERSIONS:
            raise FormatError(f"{self.where()}: {version} is not a version this reader knows (camt.053.001.02 to "
                              f".{VERSIONS[-1]}); ask the bank for one of those")  # fmt: skip
        return _Reader(self, namespace, int(number)).read(root)


class _Reader:
    """Checks each element as it reads it; `namespace` is the document's, `version` its camt.053.001 number."""

    def __init__(self, source: Camt053Source, namespace: str, version: int):
        self.source, self.namespace, self.version = source, namespace, version
        self.ns = {"c": namespace}
        self.decimals: dict[str, int] = {}  # per currency code

    def fail(self, element: etree._Element, what: str, missing: str = "") -> FormatError:
        """The error for `element` (or its missing child `missing`), naming the line and the element's path."""
        path = "/".join(self.step(node) for node in reversed([element, *element.iterancestors()]))
        return FormatError(f"{self.source.where(element.sourceline)}: /{path}{'/' + missing if missing else ''}: "
                           f"{what}")  # fmt: skip

    def step(self, element: etree._Element) -> str:
        """`Ntry[3]` for the third of several `Ntry` siblings, `Amt` for an only one."""
        name = etree_name(element)
        parent = element.getparent()
        if parent is None:
            return name
        same = parent.findall(element.tag)
        return f"{name}[{same.index(element) + 1}]" if len(same) > 1 else name

    def children(self, parent: etree._Element, name: str) -> list[etree._Element]:
        return parent.findall(f"c:{name}", self.ns)

    def optional(self, parent: etree._Element, name: str) -> etree._Element | None:
        found = self.children(parent, name)
        if len(found) > 1:
            raise self.fail(found[1], f"a second {name}; the standard allows one here")
        return found[0] if found else None

    def one(self, parent: etree._Element, name: str) -> etree._Element:
        found = self.optional(parent, name)
        if found is None:
            raise self.fail(parent, f"missing; every {etree_name(parent)} has one", name)
        return found

    def choice(self, parent: etree._Element, names: tuple[str, ...]) -> etree._Element:
        """The one child of `parent` among `names` (the schema's choice: exactly one of them)."""
        found = [child for name in names for child in self.children(parent, name)]
        if len(found) != 1:
            wanted = " or ".join(names)
            raise (self.fail(parent, f"missing; {etree_name(parent)} holds one {wanted}", names[0]) if not found
                   else self.fail(found[1], f"{etree_name(parent)} holds exactly one {wanted}, not several"))  # fmt: skip
        return found[0]

    def only(self, parent: etree._Element, part: str) -> etree._Element:
        """`parent`, once no child is one the standard does not name in it (`part`, a key of PARTS)."""
        for child in parent.iterchildren("*"):
            if child.tag[1 : child.tag.find("}")] != self.namespace or etree_name(child) not in PARTS[part]:
                raise self.fail(child, f"not an element of {etree_name(parent)} in camt.053 (misspelt, or in "
                                       "another namespace?)")  # fmt: skip
        return parent

    def code(self, element: etree._Element, allowed: tuple[str, ...] | re.Pattern[str]) -> str:
        """The element's text, exactly one of `allowed` (or a full match of it): codes keep no surrounding space."""
        text = element.text or ""
        fits = allowed.fullmatch(text) is not None if isinstance(allowed, re.Pattern) else text in allowed
        if not fits or len(element):
            wanted = allowed.pattern if isinstance(allowed, re.Pattern) else " or ".join(allowed)
            raise self.fail(element, f"{text!r} is not a valid code here: it must be {wanted}")
        return text

    def amount(self, parent: etree._Element) -> tuple[Decimal, str]:
        """`Amt` signed by `CdtDbtInd`, and its currency."""
        amount = self.one(parent, "Amt")
        text = (amount.text or "").strip(_XML_SPACE)
        if not _AMOUNT.fullmatch(text) or len(amount):
            raise self.fail(amount, f"{amount.text!r} is not an amount: digits with an optional '.' and decimals, "
                                    "no sign, no exponent (the direction is CdtDbtInd)")  # fmt: skip
        currency = amount.get("Ccy")
        if currency is None or not _CURRENCY.fullmatch(currency):
            raise self.fail(amount, f"the currency attribute Ccy is {currency!r}; it must be an ISO 4217 code "
                                    "of three capital letters like EUR")  # fmt: skip
        digits = len(text) - text.index(".") - 1 if "." in text else 0
        if digits > (allowed := self.currency_decimals(currency)):
            raise self.fail(amount, f"{text} has {digits} decimals; {currency} has at most {allowed}")
        value = Decimal(text)
        sign = self.code(self.one(parent, "CdtDbtInd"), DIRECTIONS)
        return (-value if sign == "DBIT" else value), currency

    def currency_decimals(self, currency: str) -> int:
        """ISO 4217's minor-unit digits of `currency`, or the schemas' own limit for a code Babel does not know."""
        if currency not in self.decimals:
            try:
                self.decimals[currency] = currency_digits(currency)
            except ReviewError:
                self.decimals[currency] = SCHEMA_DECIMALS
        return self.decimals[currency]

    def day(self, parent: etree._Element, name: str) -> date | None:
        """The `Dt` or `DtTm` of `parent`'s child `name` (the date as the bank wrote it, whatever its time zone)."""
        holder = self.optional(parent, name)
        if holder is None:
            return None
        stamp = self.choice(holder, ("Dt", "DtTm"))
        text = (stamp.text or "").strip(_XML_SPACE)
        pattern = _DATE if etree_name(stamp) == "Dt" else _DATETIME
        try:
            if not pattern.fullmatch(text) or len(stamp):
                raise ValueError
            datetime.fromisoformat(text) if pattern is _DATETIME else date.fromisoformat(text[:10])
        except ValueError:
            kind = "date like 2026-10-31" if pattern is _DATE else "date and time like 2026-10-31T23:59:00"
            raise self.fail(stamp, f"{stamp.text!r} is not a valid ISO {kind}") from None
        return date.fromisoformat(text[:10])

    def texts(self, element: etree._Element, path: str) -> list[str]:
        return [(found.text or "").strip() for found in element.findall(path, self.ns) if (found.text or "").strip()]

    def read(self, root: etree._Element) -> Statement:
        document = self.only(self.one(self.only(root, "Document"), "BkToCstmrStmt"), "BkToCstmrStmt")
        statements = self.children(document, "Stmt")
        if not statements:
            raise self.fail(document, "missing; a camt.053 document holds at least one statement", "Stmt")
        entries: list[Entry] = []
        balances: list[Entry] = []
        opened: set[str] = set()
        for statement in statements:
            self.only(statement, "Stmt")
            account = self.account(statement)
            stated = self.balances(statement)
            opening = stated.get("OPBD", stated.get("PRCD"))
            if opening is not None and account not in opened:
                opened.add(account)
                balances.append(Entry(opening.line, opening.day - timedelta(days=1), opening.amount, opening.currency,
                                      account, "", "opening balance"))  # fmt: skip
            if (closing := stated.get("CLBD")) is not None:
                balances.append(Entry(closing.line, closing.day, closing.amount, closing.currency, account, "",
                                      "closing balance"))  # fmt: skip
            for entry in self.children(statement, "Ntry"):
                booked = self.entry(entry, account)
                if booked is not None:
                    entries.append(booked)
        return Statement(entries, balances)

    def account(self, statement: etree._Element) -> str:
        """`Acct/Id`: an IBAN or an `Othr/Id` (at most 34 characters)."""
        account = self.only(self.one(statement, "Acct"), "Acct")
        identifier = self.choice(self.only(self.one(account, "Id"), "Acct/Id"), ("IBAN", "Othr"))
        if etree_name(identifier) == "IBAN":
            return self.code(identifier, _IBAN)
        other = self.one(identifier, "Id")
        text = (other.text or "").strip()
        if not text or len(other.text) > 34 or len(other):
            raise self.fail(other, f"{other.text!r} is not an account id (1 to 34 characters)")
        return text

    def balances(self, statement: etree._Element) -> dict[str, Entry]:
        """Every `Bal` checked; the ones read (OPBD, PRCD, CLBD) by type code, each stated at most once."""
        stated: dict[str, Entry] = {}
        for balance in self.children(statement, "Bal"):
            self.only(balance, "Bal")
            kind = self.choice(self.one(self.only(self.one(balance, "Tp"), "Bal/Tp"), "CdOrPrtry"), ("Cd", "Prtry"))
            code = self.code(kind, BALANCE_CODES) if etree_name(kind) == "Cd" else ""
            amount, currency = self.amount(balance)
            day = self.day(balance, "Dt")
            if day is None:
                raise self.fail(balance, "missing; every balance has its date", "Dt")
            if code in stated and code in READ_BALANCES:
                raise self.fail(balance, f"a second {code} balance in one statement; which one holds is unclear")
            stated[code] = Entry(balance.sourceline, day, amount, currency, "")
        return stated

    def status(self, entry: etree._Element) -> str:
        """BOOK, PDNG or INFO (a bare code before version 07); from 07 a `Cd` (`Prtry` statuses read as none)."""
        status = self.one(entry, "Sts")
        if self.version < CHOICE_STATUS:
            return self.code(status, OLD_STATUSES)
        chosen = self.choice(status, ("Cd", "Prtry"))
        return self.code(chosen, STATUSES) if etree_name(chosen) == "Cd" else ""

    def entry(self, entry: etree._Element, account: str) -> Entry | None:
        """The entry read if it is booked (None otherwise); every entry's amount and dates are checked."""
        amount, currency = self.amount(self.only(entry, "Ntry"))
        day = self.day(entry, "BookgDt")
        if self.status(entry) != "BOOK":
            return None
        if day is None:
            raise self.fail(entry, "missing; a booked entry (Sts BOOK) has its booking date", "BookgDt")
        details = [self.only(tx, "TxDtls") for group in self.children(entry, "NtryDtls")
                   for tx in self.children(self.only(group, "NtryDtls"), "TxDtls")]  # fmt: skip
        reference = self.reference(details[0]) if len(details) == 1 else ""
        words = [name for tx in details for name in self.texts(tx, "c:RltdPties//c:Nm")]
        words += [text for tx in details for text in self.texts(tx, "c:RmtInf/c:Ustrd")]
        words += self.texts(entry, "c:AddtlNtryInf")
        return Entry(entry.sourceline, day, amount, currency, account, reference, " ".join(words))

    def reference(self, transaction: etree._Element) -> str:
        """The `EndToEndId` (unless NOTPROVIDED), else the first structured creditor reference `Ref`."""
        refs = self.optional(transaction, "Refs")
        end_to_end = self.identifier(self.only(refs, "Refs"), "EndToEndId") if refs is not None else ""
        if end_to_end and end_to_end != "NOTPROVIDED":
            return end_to_end
        for information in self.children(transaction, "RmtInf"):
            for structured in self.children(self.only(information, "RmtInf"), "Strd"):
                for creditor in self.children(self.only(structured, "Strd"), "CdtrRefInf"):
                    if found := self.identifier(self.only(creditor, "CdtrRefInf"), "Ref"):
                        return found
        return ""

    def identifier(self, parent: etree._Element, name: str) -> str:
        """`parent`'s child `name` if there is one: a reference of 1 to 35 characters (the standard's Max35Text)."""
        element = self.optional(parent, name)
        if element is None:
            return ""
        text = element.text or ""
        if not text.strip() or len(text) > 35 or len(element):
            raise self.fail(element, f"{text!r} is not a reference (1 to 35 characters)")
        return text.strip()


def etree_name(element: etree._Element) -> str:
    """An element's local name (`Amt` for `{urn:...}Amt`)."""
    return element.tag[element.tag.find("}") + 1 :]
