"""Books for the narrative evaluation: generated sets of books of many shapes, each with its review's schedule.

Built on bench/helpers/books.py's generator (a company in English, German, French or Spanish; a bank statement as
CSV in the country's number and date formats, MT940 or OFX; a ledger as CSV, SQLite or Beancount; faults
planted on purpose), it picks seeds so that the set holds every language and every format with many
findings per review (seeds whose faults make at least `MIN_FINDINGS` findings), gives some books 600 postings a month, and
rewrites some CSV bank statements as ISO 20022 camt.053, the one format bench/helpers/books.py does not write.
`held_out` is the German month-end of issue [19]'s outside test (bench/helpers/german.py), written as the
outside tester's books were, not by the generator.

    books = evaluation_books(folder, 22) + held_out(folder)   # [EvaluationBook(schedule, about, planted), ...]
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path

from bench.helpers.books import make_books
from bench.helpers.german import german_books
from nightshift.app.review.schedule import load_schedule

CAMT = "urn:iso:std:iso:20022:tech:xsd:camt.053.001.02"
MIN_FINDINGS = 6  # planted findings a seed needs to be picked (3 to 7 faults are drawn; some make two findings)
LARGE = 600  # postings a month of every LARGE_EVERY-th book
LARGE_EVERY = 5
CAMT_EVERY = 4  # every CAMT_EVERY-th book with a CSV bank statement gets it as camt.053


@dataclass(frozen=True)
class EvaluationBook:
    schedule: Path
    about: str
    planted: int  # findings the planted faults must produce


def evaluation_books(folder: Path, count: int) -> list[EvaluationBook]:
    """`count` sets of books under `folder`, one sub-folder each, from the first seeds with enough findings."""
    books, seed, csv_banks = [], 0, 0
    while len(books) < count:
        trial = folder / f"seed-{seed}"
        trial.mkdir(parents=True, exist_ok=True)
        rows = LARGE if (len(books) + 1) % LARGE_EVERY == 0 else None
        made = make_books(seed, trial, rows)
        seed += 1
        if len(made.planted) < MIN_FINDINGS:
            continue
        about = made.about
        if "bank CSV" in about:
            csv_banks += 1
            if csv_banks % CAMT_EVERY == 0:
                as_camt053(made.schedule)
                about = re.sub(r"bank CSV [^;]*", "bank camt.053", about)
        books.append(EvaluationBook(made.schedule, about, len(made.planted)))
    return books


def held_out(folder: Path) -> list[EvaluationBook]:
    """The books the generator did not write: the German month-end (a balance off by -100.00, bank charges not
    in the ledger)."""
    german = folder / "held-out-german"
    german.mkdir(parents=True, exist_ok=True)
    about = "German month-end (outside test): bank CSV ; 1.234,56 with total rows, ledger CSV, balances by month"
    return [EvaluationBook(german_books(german), about, 2)]


def as_camt053(schedule_file: Path) -> None:
    """Rewrite the schedule's CSV bank statement as a camt.053 file of the same booked entries."""
    schedule = load_schedule(schedule_file)
    bank = schedule.sources["bank"]
    table = bank.load(schedule.as_of - timedelta(days=400), schedule.as_of + timedelta(days=400))
    rows = [{**table.row(i), "date": date.fromisoformat(str(table.row(i)["date"]))} for i in range(len(table))]
    currency = table.currency or "EUR"
    path = schedule_file.parent / "bank.camt053.xml"
    path.write_bytes(_camt053(rows, currency))
    text = schedule_file.read_text(encoding="utf-8")
    start = text.index("[sources.bank]")
    end = text.index("\n[", start + 1)
    schedule_file.write_text(
        text[:start] + f'[sources.bank]\ntype = "camt053"\npath = "{path.name}"\n' + text[end:], encoding="utf-8"
    )


def _camt053(rows: list[dict], currency: str) -> bytes:
    """One statement of every row as a booked entry, opening and closing balances around them."""
    ET.register_namespace("", CAMT)

    def sub(parent: ET.Element, tags: str, text: str | None = None, **attributes: str) -> ET.Element:
        for tag in tags.split("/"):
            parent = ET.SubElement(parent, f"{{{CAMT}}}{tag}", attributes if tag == tags.split("/")[-1] else {})
        parent.text = text
        return parent

    document = ET.Element(f"{{{CAMT}}}Document")
    message = sub(document, "BkToCstmrStmt")
    sub(message, "GrpHdr/MsgId", "EVAL-CAMT")
    statement = sub(message, "Stmt")
    sub(statement, "Id", "EVAL-1")
    sub(statement, "Acct/Id/IBAN", "DE02120300000000202051")
    first, last = min(row["date"] for row in rows), max(row["date"] for row in rows)
    opening = Decimal("10000.00")
    for code, amount, day in (("OPBD", opening, first), ("CLBD", opening + sum(r["amount"] for r in rows), last)):
        balance = sub(statement, "Bal")
        sub(balance, "Tp/CdOrPrtry/Cd", code)
        sub(balance, "Amt", f"{abs(amount):.2f}", Ccy=currency)
        sub(balance, "CdtDbtInd", "CRDT" if amount >= 0 else "DBIT")
        sub(balance, "Dt/Dt", day.isoformat())
    for row in rows:
        entry = sub(statement, "Ntry")
        sub(entry, "Amt", f"{abs(row['amount']):.2f}", Ccy=currency)
        sub(entry, "CdtDbtInd", "CRDT" if row["amount"] >= 0 else "DBIT")
        sub(entry, "Sts", "BOOK")
        sub(entry, "BookgDt/Dt", row["date"].isoformat())
        details = sub(entry, "NtryDtls/TxDtls")
        sub(details, "Refs/EndToEndId", row.get("reference") or "NOTPROVIDED")
        sub(details, "RmtInf/Ustrd", row.get("description") or "")
    ET.indent(document)
    return ET.tostring(document, encoding="utf-8", xml_declaration=True) + b"\n"
