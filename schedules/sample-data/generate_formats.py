"""Writes the statement and ledger formats' sample data (deterministic): python generate_formats.py

One company's books for September and October 2026, Lindqvist Design GmbH,
with two bank accounts (operating and reserve), written as the bank exports
them (camt.053, MT940, OFX) and as the company keeps its books (Beancount,
with balance assertions). The books reconcile except for these planted faults,
which the bundled reviews camt053, mt940, ofx and beancount find
(tests/test_formats_reviews.py):

- bank charges 38.50 on 30 October in the bank, never booked;
- INV-7004 received as 2,405.00, booked as 2,450.00;
- PO-8812 (1,312.60) paid once, booked twice;
- the October statement's closing balance of the operating account 100.00 above
  opening + movements (the bank files), and the 1 November balance assertion
  100.00 above the books (the Beancount ledger);
- travel 520.00 in September, 1,940.00 in October.

A returned customer payment (INV-7006 in, then reversed) exercises reversal
marks: camt RvslInd, MT940 RC, a negative OFX TRNAMT.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from pathlib import Path
from xml.etree import ElementTree as ET

HERE = Path(__file__).resolve().parent
COMPANY = "Lindqvist Design GmbH"
BIC = "COBADEFFXXX"
CURRENCY = "EUR"


@dataclass(frozen=True)
class Account:
    iban: str
    ledger: str
    opening: Decimal  # end of 31 August 2026


OPERATING = Account("DE89370400440532013000", "Assets:Bank:Operating", Decimal("24150.00"))
RESERVE = Account("DE02120300000000202051", "Assets:Bank:Reserve", Decimal("10000.00"))


@dataclass(frozen=True)
class Move:
    """One movement: as the bank books it and as the ledger books it (`booked` None: never booked)."""

    day: date
    amount: Decimal
    reference: str
    party: str
    text: str
    counter: str  # the ledger's other account
    booked: Decimal | None = Decimal("NaN")  # NaN: booked as `amount`; None: not booked; else this amount
    times_booked: int = 1
    reversal: bool = False

    @property
    def ledger_amount(self) -> Decimal | None:
        return self.amount if self.booked is not None and self.booked.is_nan() else self.booked


def d(month: int, day: int) -> date:
    return date(2026, month, day)


def D(text: str) -> Decimal:
    return Decimal(text)


OPERATING_MOVES = [
    Move(d(9, 1), D("-2150.00"), "RENT-2026-09", "Hafenhaus Immobilien KG", "Rent September", "Expenses:Rent"),
    Move(d(9, 3), D("3480.00"), "INV-6991", "Harbor Studios AG", "Invoice INV-6991", "Income:Sales"),
    Move(d(9, 7), D("-289.00"), "SUB-0926", "Figma Inc", "Design seats September", "Expenses:Software"),
    Move(d(9, 9), D("1920.00"), "INV-6992", "Nordlicht Verlag", "Invoice INV-6992", "Income:Sales"),
    Move(d(9, 11), D("-310.00"), "TRV-0911", "DB Fernverkehr AG", "Train Hamburg-Munich", "Expenses:Travel"),
    Move(d(9, 15), D("-1284.40"), "PO-8790", "Papier Union GmbH", "Paper and proofs", "Expenses:Materials"),
    Move(d(9, 17), D("4150.00"), "INV-6993", "Kieler Werft GmbH", "Invoice INV-6993", "Income:Sales"),
    Move(d(9, 18), D("-1190.00"), "PO-8795", "Druckerei Moser", "Print run catalogue", "Expenses:Materials"),
    Move(d(9, 21), D("-210.00"), "TRV-0921", "Hotel Adler", "Hotel Munich", "Expenses:Travel"),
    Move(d(9, 24), D("-3000.00"), "TRF-0924", COMPANY, "Transfer to reserve", RESERVE.ledger),
    Move(d(9, 28), D("2760.00"), "INV-6994", "Atelier Brandt", "Invoice INV-6994", "Income:Sales"),
    Move(d(9, 30), D("-12.90"), "", "", "Account fee September", "Expenses:BankCharges"),
    Move(d(10, 1), D("-2150.00"), "RENT-2026-10", "Hafenhaus Immobilien KG", "Rent October", "Expenses:Rent"),
    Move(d(10, 5), D("3480.00"), "INV-7001", "Harbor Studios AG", "Invoice INV-7001", "Income:Sales"),
    Move(d(10, 7), D("-289.00"), "SUB-1026", "Figma Inc", "Design seats October", "Expenses:Software"),
    Move(d(10, 8), D("1920.00"), "INV-7002", "Nordlicht Verlag", "Invoice INV-7002", "Income:Sales"),
    Move(d(10, 9), D("-640.00"), "TRV-1009", "Deutsche Lufthansa AG", "Flight Hamburg-Oslo", "Expenses:Travel"),
    Move(d(10, 13), D("-1300.00"), "TRV-1013", "Hotel Continental Oslo", "Hotel Oslo, trade fair", "Expenses:Travel"),
    Move(
        d(10, 14), D("2405.00"), "INV-7004", "Atelier Brandt", "Invoice INV-7004", "Income:Sales", booked=D("2450.00")
    ),  # planted: received 2,405.00, booked 2,450.00
    Move(d(10, 16), D("4150.00"), "INV-7003", "Kieler Werft GmbH", "Invoice INV-7003", "Income:Sales"),
    Move(d(10, 19), D("500.00"), "INV-7006", "Studio Halm", "Invoice INV-7006", "Income:Sales"),
    Move(
        d(10, 21),
        D("-1312.60"),
        "PO-8812",
        "Papier Union GmbH",
        "Paper and proofs",
        "Expenses:Materials",
        times_booked=2,
    ),  # planted: booked twice
    Move(d(10, 22), D("-500.00"), "INV-7006", "Studio Halm", "Returned: account closed", "Income:Sales", reversal=True),
    Move(d(10, 26), D("-3000.00"), "TRF-1026", COMPANY, "Transfer to reserve", RESERVE.ledger),
    Move(d(10, 29), D("980.00"), "INV-7005", "Studio Halm", "Invoice INV-7005", "Income:Sales"),
    Move(d(10, 30), D("-12.90"), "", "", "Account fee October", "Expenses:BankCharges"),
    Move(
        d(10, 30), D("-38.50"), "", "", "Bank charges foreign payments", "Expenses:BankCharges", booked=None
    ),  # planted: never booked
]
RESERVE_MOVES = [
    Move(d(9, 24), D("3000.00"), "TRF-0924", COMPANY, "Transfer from operating", OPERATING.ledger),
    Move(d(9, 30), D("4.17"), "", "", "Interest September", "Income:Interest"),
    Move(d(10, 26), D("3000.00"), "TRF-1026", COMPANY, "Transfer from operating", OPERATING.ledger),
    Move(d(10, 30), D("5.43"), "", "", "Interest October", "Income:Interest"),
]
BOOKS = {OPERATING: OPERATING_MOVES, RESERVE: RESERVE_MOVES}
MONTHS = (9, 10)
WRONG_CLOSING = (OPERATING, 10, D("100.00"))  # planted: the October statement's closing balance is 100.00 high
WRONG_ASSERTION = (OPERATING, d(11, 1), D("100.00"))  # planted: the 1 November assertion is 100.00 high


@dataclass(frozen=True)
class Period:
    account: Account
    month: int
    opening: Decimal
    closing: Decimal  # as stated (with the planted error)
    moves: list[Move]

    @property
    def first(self) -> date:
        return d(self.month, 1)

    @property
    def last(self) -> date:
        return d(self.month, calendar.monthrange(2026, self.month)[1])


def periods() -> list[Period]:
    """Monthly statements per account, each opening with the previous one's true closing balance."""
    result = []
    for account, moves in BOOKS.items():
        balance = account.opening
        for month in MONTHS:
            mine = [move for move in moves if move.day.month == month]
            closing = balance + sum((move.amount for move in mine), Decimal(0))
            stated = closing + (WRONG_CLOSING[2] if (account, month) == WRONG_CLOSING[:2] else 0)
            result.append(Period(account, month, balance, stated, mine))
            balance = closing
    return result


def details(move: Move) -> str:
    return " ".join(part for part in (move.party, move.text) if part)


# camt.053.001.02 ---------------------------------------------------------------------------------------------------

CAMT_NS = "urn:iso:std:iso:20022:tech:xsd:camt.053.001.02"


def sub(parent: ET.Element, tag: str, text: str | None = None, **attributes: str) -> ET.Element:
    element = ET.SubElement(parent, f"{{{CAMT_NS}}}{tag}", attributes)
    if text is not None:
        element.text = text
    return element


def path(parent: ET.Element, tags: str, text: str | None = None, **attributes: str) -> ET.Element:
    *outer, last = tags.split("/")
    for tag in outer:
        parent = sub(parent, tag)
    return sub(parent, last, text, **attributes)


def camt_balance(statement: ET.Element, code: str, amount: Decimal, day: date) -> None:
    balance = sub(statement, "Bal")
    path(balance, "Tp/CdOrPrtry/Cd", code)
    sub(balance, "Amt", f"{abs(amount):.2f}", Ccy=CURRENCY)
    sub(balance, "CdtDbtInd", "CRDT" if amount >= 0 else "DBIT")
    path(balance, "Dt/Dt", day.isoformat())


def camt053() -> bytes:
    ET.register_namespace("", CAMT_NS)
    document = ET.Element(f"{{{CAMT_NS}}}Document")
    message = sub(document, "BkToCstmrStmt")
    header = sub(message, "GrpHdr")
    sub(header, "MsgId", "LDG-CAMT-20261102")
    sub(header, "CreDtTm", "2026-11-02T06:10:00")
    for number, period in enumerate(periods(), start=1):
        statement = sub(message, "Stmt")
        sub(statement, "Id", f"{period.account.iban[-6:]}-2026-{period.month:02d}")
        sub(statement, "ElctrncSeqNb", str(period.month))
        sub(statement, "CreDtTm", f"{period.last.isoformat()}T23:30:00")
        times = sub(statement, "FrToDt")
        sub(times, "FrDtTm", f"{period.first.isoformat()}T00:00:00")
        sub(times, "ToDtTm", f"{period.last.isoformat()}T23:59:59")
        account = sub(statement, "Acct")
        path(account, "Id/IBAN", period.account.iban)
        sub(account, "Ccy", CURRENCY)
        path(account, "Ownr/Nm", COMPANY)
        path(account, "Svcr/FinInstnId/BIC", BIC)
        camt_balance(statement, "OPBD", period.opening, period.first)
        camt_balance(statement, "CLBD", period.closing, period.last)
        for index, move in enumerate(period.moves, start=1):
            entry = sub(statement, "Ntry")
            sub(entry, "NtryRef", f"{number:02d}{index:03d}")
            sub(entry, "Amt", f"{abs(move.amount):.2f}", Ccy=CURRENCY)
            sub(entry, "CdtDbtInd", "CRDT" if move.amount > 0 else "DBIT")
            if move.reversal:
                sub(entry, "RvslInd", "true")
            sub(entry, "Sts", "BOOK")
            path(entry, "BookgDt/Dt", move.day.isoformat())
            path(entry, "ValDt/Dt", move.day.isoformat())
            sub(entry, "AcctSvcrRef", f"2026{move.day:%m%d}{index:05d}")
            family = path(entry, "BkTxCd/Domn", None)
            sub(family, "Cd", "PMNT")
            fmly = sub(family, "Fmly")
            sub(fmly, "Cd", "RCDT" if move.amount > 0 else "ICDT")
            sub(fmly, "SubFmlyCd", "ESCT")
            transaction = path(entry, "NtryDtls/TxDtls")
            path(transaction, "Refs/EndToEndId", move.reference or "NOTPROVIDED")
            if move.party:
                side = "Dbtr" if move.amount > 0 else "Cdtr"
                path(transaction, f"RltdPties/{side}/Nm", move.party)
            path(transaction, "RmtInf/Ustrd", move.text)
            sub(entry, "AddtlNtryInf", "SEPA CREDIT TRANSFER" if move.party else "CHARGES")
    ET.indent(document)
    return ET.tostring(document, encoding="utf-8", xml_declaration=True) + b"\n"


# MT940 -------------------------------------------------------------------------------------------------------------


def mt_amount(amount: Decimal) -> str:
    return f"{abs(amount):.2f}".replace(".", ",")


def mt_balance(tag: str, amount: Decimal, day: date) -> str:
    return f":{tag}:{'C' if amount >= 0 else 'D'}{day:%y%m%d}{CURRENCY}{mt_amount(amount)}"


def mt940() -> bytes:
    messages = []
    for number, period in enumerate(periods(), start=1):
        lines = [
            f":20:STMT{number:04d}",
            f":25:{period.account.iban}",
            f":28C:{period.month:05d}/001",
            # :60F: dated with the previous statement's closing date (the SWIFT rule).
            mt_balance("60F", period.opening, date.fromordinal(period.first.toordinal() - 1)),
        ]
        for move in period.moves:
            mark = ("RC" if move.reversal else "D") if move.amount < 0 else "C"
            reference = move.reference or "NONREF"
            lines.append(f":61:{move.day:%y%m%d}{move.day:%m%d}{mark}{mt_amount(move.amount)}NTRF{reference}")
            lines.append(f":86:{details(move)}"[: 65 + 4])
        lines.append(mt_balance("62F", period.closing, period.last))
        messages.append("\r\n".join(lines) + "\r\n-")
    return ("\r\n".join(messages) + "\r\n").encode("ascii")


# OFX 2.2 (XML) -----------------------------------------------------------------------------------------------------


def ofx() -> bytes:
    """One response with a statement per account and month (OFX states only closing balances: LEDGERBAL).

    Bookings are stamped 00:30 in Berlin, the day before in UTC: the reader keeps the bank's own date.
    """
    statements = []
    for number, period in enumerate(periods(), start=1):
        transactions = []
        for index, move in enumerate(period.moves, start=1):
            kind = "CREDIT" if move.amount > 0 else ("FEE" if not move.party else "DEBIT")
            reference = f"<REFNUM>{move.reference}</REFNUM>" if move.reference else ""
            name = f"<NAME>{move.party}</NAME>" if move.party else ""
            transactions.append(
                f"<STMTTRN><TRNTYPE>{kind}</TRNTYPE><DTPOSTED>{move.day:%Y%m%d}003000.000[+1:CET]</DTPOSTED>"
                f"<TRNAMT>{move.amount:.2f}</TRNAMT><FITID>{number:02d}{index:04d}</FITID>{reference}{name}"
                f"<MEMO>{move.text}</MEMO></STMTTRN>"
            )
        statements.append(
            f"<STMTTRNRS><TRNUID>{number}</TRNUID><STATUS><CODE>0</CODE><SEVERITY>INFO</SEVERITY></STATUS>"
            f"<STMTRS><CURDEF>{CURRENCY}</CURDEF><BANKACCTFROM><BANKID>37040044</BANKID>"
            f"<ACCTID>{period.account.iban}</ACCTID><ACCTTYPE>CHECKING</ACCTTYPE></BANKACCTFROM>"
            f"<BANKTRANLIST><DTSTART>{period.first:%Y%m%d}</DTSTART><DTEND>{period.last:%Y%m%d}</DTEND>\n"
            + "\n".join(transactions)
            + f"\n</BANKTRANLIST><LEDGERBAL><BALAMT>{period.closing:.2f}</BALAMT>"
            f"<DTASOF>{period.last:%Y%m%d}235900.000[+1:CET]</DTASOF></LEDGERBAL></STMTRS></STMTTRNRS>"
        )
    head = ('<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n'
            '<?OFX OFXHEADER="200" VERSION="220" SECURITY="NONE" OLDFILEUID="NONE" NEWFILEUID="NONE"?>\n')  # fmt: skip
    body = (
        "<OFX><SIGNONMSGSRSV1><SONRS><STATUS><CODE>0</CODE><SEVERITY>INFO</SEVERITY></STATUS>"
        "<DTSERVER>20261102061000.000[+1:CET]</DTSERVER><LANGUAGE>ENG</LANGUAGE></SONRS></SIGNONMSGSRSV1>\n"
        "<BANKMSGSRSV1>\n" + "\n".join(statements) + "\n</BANKMSGSRSV1></OFX>\n"
    )
    return (head + body).encode("utf-8")


# Beancount ---------------------------------------------------------------------------------------------------------


def beancount() -> bytes:
    accounts = sorted({account.ledger for account in BOOKS} | {m.counter for moves in BOOKS.values() for m in moves}
                      | {"Equity:Opening-Balances"})  # fmt: skip
    lines = [f'option "title" "{COMPANY}"', f'option "operating_currency" "{CURRENCY}"', ""]
    lines += [f"2026-01-01 open {account} {CURRENCY}" for account in accounts] + [""]
    lines += ['2026-08-31 * "Opening balances"']
    for account in BOOKS:
        lines.append(f"  {account.ledger}  {account.opening:.2f} {CURRENCY}")
    lines += ["  Equity:Opening-Balances", ""]
    postings = []  # (day, text) of every transaction, the transfers once (from the operating side)
    for account, moves in BOOKS.items():
        for move in moves:
            if move.ledger_amount is None or (account is RESERVE and move.counter == OPERATING.ledger):
                continue
            link = f" ^{move.reference}" if move.reference else ""
            payee = move.party or "Bank"
            for _ in range(move.times_booked):
                postings.append((move.day, "\n".join([
                    f'{move.day.isoformat()} * "{payee}" "{move.text}"{link}',
                    f"  {account.ledger}  {move.ledger_amount:.2f} {CURRENCY}",
                    f"  {move.counter}",
                ])))  # fmt: skip
    for _, text in sorted(postings, key=lambda item: item[0]):
        lines += [text, ""]
    for account, moves in BOOKS.items():
        balance = account.opening
        for month in (*MONTHS, 11):
            day = d(month, 1)
            booked = sum((m.ledger_amount * m.times_booked for m in moves  # type: ignore[operator]
                          if m.day < day and m.ledger_amount is not None), Decimal(0))  # fmt: skip
            stated = balance + booked + (WRONG_ASSERTION[2] if (account, day) == WRONG_ASSERTION[:2] else 0)
            lines.append(f"{day.isoformat()} balance {account.ledger}  {stated:.2f} {CURRENCY}")
    return ("\n".join(lines) + "\n").encode("utf-8")


FILES = {
    "camt053/statements.xml": camt053,
    "mt940/statements.sta": mt940,
    "ofx/statements.ofx": ofx,
    "beancount/books.beancount": beancount,
}


def main() -> None:
    for name, write in FILES.items():
        target = HERE / name
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(write())
        print(f"wrote {target}")


if __name__ == "__main__":
    main()
