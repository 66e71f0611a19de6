"""Generated books: a seed makes one company's bank statement, ledger and balances, in one of many layouts,
with faults planted on purpose and the findings they must produce.

Each seed picks a company and its language (headers, account names and descriptions in English, German,
French or Spanish), a month, a size, and how each file is written: the bank statement as CSV (delimiter,
date format, decimal and thousands characters, trailing minus, debit/credit columns, encoding with or
without a BOM, with or without references), the ledger and the balances as CSV or SQLite (TEXT decimals or
INTEGER minor units). The books reconcile except for the planted faults (a posting booked twice, bank
charges and a direct debit never booked, a cheque not cleared, an amount keyed wrong, a closing balance
off, an expense that jumps), and `Books.planted` lists the (check, title, amount) each must produce.
The bundled sample (schedules/sample-data) is one such set of books; these are many more.

    books = make_books(7, tmp_path)      # writes the files and books.schedule, the review's TOML
"""

from __future__ import annotations

import calendar
import csv
import random
import sqlite3
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path

CENT = Decimal("0.01")


@dataclass(frozen=True)
class Language:
    """A company's words: the bank's headers, the ledger's names, its accounts and what its rows say."""

    bank: dict[str, str]  # our column -> the bank file's header (date, amount, debit, credit, reference, description)
    ledger: dict[str, str]  # our column -> the ledger's column name (and "table")
    accounts: dict[str, str]  # role -> account name
    says: dict[str, str]  # role -> a row's description
    date_formats: tuple[str, ...]
    numbers: tuple[tuple[str, str], ...]  # (decimal, thousands) the country writes


LANGUAGES = {
    "en": Language(
        {"date": "Date", "amount": "Amount", "debit": "Paid out", "credit": "Paid in", "reference": "Reference",
         "description": "Description"},
        {"table": "entries", "date": "posted", "account": "account", "amount": "amount", "reference": "ref",
         "description": "memo"},
        {"bank": "Bank", "sales": "Sales", "rent": "Rent", "payroll": "Payroll", "travel": "Travel",
         "purchases": "Purchases", "software": "Software", "utilities": "Utilities"},
        {"sales": "Customer receipt", "rent": "Office rent", "payroll": "Salaries", "travel": "Travel expenses",
         "purchases": "Supplier invoice", "software": "Software subscription", "utilities": "Electricity",
         "fee": "Bank charges", "debit": "Direct debit insurance", "cheque": "Cheque to supplier"},
        ("%Y-%m-%d", "%d/%m/%Y", "%m/%d/%Y"),
        ((".", ","), (".", "")),
    ),
    "de": Language(
        {"date": "Buchungstag", "amount": "Betrag", "debit": "Soll", "credit": "Haben", "reference": "Referenz",
         "description": "Verwendungszweck"},
        {"table": "buchungen", "date": "datum", "account": "konto", "amount": "betrag", "reference": "beleg",
         "description": "text"},
        {"bank": "Bankkonto", "sales": "Umsatzerlöse", "rent": "Miete", "payroll": "Löhne", "travel": "Reisekosten",
         "purchases": "Wareneinkauf", "software": "EDV-Kosten", "utilities": "Energie"},
        {"sales": "Zahlung Kunde", "rent": "Büromiete", "payroll": "Gehälter", "travel": "Reisekosten",
         "purchases": "Lieferantenrechnung", "software": "Softwarelizenz", "utilities": "Strom",
         "fee": "Kontoführungsgebühren", "debit": "Lastschrift Versicherung", "cheque": "Scheck an Lieferant"},
        ("%d.%m.%Y", "%Y-%m-%d"),
        ((",", "."), (",", "")),
    ),
    "fr": Language(
        {"date": "Date opération", "amount": "Montant", "debit": "Débit", "credit": "Crédit",
         "reference": "Référence", "description": "Libellé"},
        {"table": "ecritures", "date": "date_ecriture", "account": "compte", "amount": "montant",
         "reference": "piece", "description": "libelle"},
        {"bank": "Banque", "sales": "Ventes", "rent": "Loyer", "payroll": "Salaires", "travel": "Déplacements",
         "purchases": "Achats", "software": "Logiciels", "utilities": "Énergie"},
        {"sales": "Règlement client", "rent": "Loyer bureau", "payroll": "Salaires", "travel": "Frais de déplacement",
         "purchases": "Facture fournisseur", "software": "Abonnement logiciel", "utilities": "Électricité",
         "fee": "Frais bancaires", "debit": "Prélèvement assurance", "cheque": "Chèque fournisseur"},
        ("%d/%m/%Y",),
        ((",", " "), (",", "\u202f"), (",", "")),
    ),
    "es": Language(
        {"date": "Fecha", "amount": "Importe", "debit": "Cargo", "credit": "Abono", "reference": "Referencia",
         "description": "Concepto"},
        {"table": "asientos", "date": "fecha", "account": "cuenta", "amount": "importe", "reference": "documento",
         "description": "concepto"},
        {"bank": "Banco", "sales": "Ventas", "rent": "Alquiler", "payroll": "Nóminas", "travel": "Viajes",
         "purchases": "Compras", "software": "Software", "utilities": "Suministros"},
        {"sales": "Cobro cliente", "rent": "Alquiler oficina", "payroll": "Nóminas", "travel": "Gastos de viaje",
         "purchases": "Factura proveedor", "software": "Suscripción software", "utilities": "Electricidad",
         "fee": "Comisiones bancarias", "debit": "Recibo seguro", "cheque": "Cheque proveedor"},
        ("%d/%m/%Y", "%d-%m-%Y"),
        ((",", "."), (",", "")),
    ),
}  # fmt: skip
COMPANIES = (("Harbour Tools Ltd", "en", "GBP"), ("Larkspur Bakery GmbH", "de", "EUR"),
             ("Atelier Mistral SARL", "fr", "EUR"), ("Olmo Logística SL", "es", "EUR"),
             ("Prairie Signal Inc", "en", "USD"), ("Bergmann Metallbau KG", "de", "EUR"),
             ("Cave du Rhône SA", "fr", "CHF"))  # fmt: skip
FAULTS = ("duplicate", "fee", "debit", "cheque", "differs", "balance", "variance")


@dataclass
class Entry:
    """One ledger posting and, unless planted otherwise, its bank line."""

    day: date
    amount: Decimal
    role: str
    reference: str
    bank_day: date | None = None
    bank_amount: Decimal | None = None
    in_ledger: bool = True


@dataclass
class Books:
    seed: int
    schedule: Path
    about: str
    planted: list[tuple[str, str, Decimal]] = field(default_factory=list)  # (check, title, amount)


def _money(rng: random.Random, low: float, high: float) -> Decimal:
    return Decimal(rng.randint(int(low * 100), int(high * 100))) * CENT


def _business_days(year: int, month: int) -> list[date]:
    days = calendar.monthrange(year, month)[1]
    return [date(year, month, d) for d in range(1, days + 1) if date(year, month, d).weekday() < 5]


def _month_before(year: int, month: int) -> tuple[int, int]:
    return (year - 1, 12) if month == 1 else (year, month - 1)


def _amount_text(amount: Decimal, decimal: str, thousands: str, trailing: bool) -> str:
    whole, cents = f"{abs(amount):.2f}".split(".")
    groups = []
    while len(whole) > 3:
        whole, groups = whole[:-3], [whole[-3:], *groups]
    number = thousands.join([whole, *groups]) + decimal + cents
    if amount >= 0:
        return number
    return number + "-" if trailing else "-" + number


@dataclass(frozen=True)
class Usual:
    """What a company pays and receives in a usual month; each month varies it by at most 4 %."""

    receipts: list[Decimal]
    purchases: list[Decimal]
    travel: list[Decimal]
    utilities: Decimal

    @classmethod
    def draw(cls, rng: random.Random, receipts: int) -> Usual:
        return cls([_money(rng, 200, 5000) for _ in range(receipts)], [-_money(rng, 2000, 4000) for _ in range(3)],
                   [-_money(rng, 280, 330) for _ in range(2)], -_money(rng, 395, 430))  # fmt: skip


def _varied(rng: random.Random, amount: Decimal) -> Decimal:
    return (amount * Decimal(rng.uniform(0.96, 1.04))).quantize(CENT)


def _month_entries(rng: random.Random, year: int, month: int, usual: Usual, first: int) -> list[Entry]:
    """A month's postings: receipts, rent, payroll, software, utilities, purchases and travel."""
    days = _business_days(year, month)
    tag = f"{month:02d}{year % 100:02d}"
    entries = [
        Entry(rng.choice(days), _varied(rng, a), "sales", f"INV-{first + n}") for n, a in enumerate(usual.receipts)
    ]
    entries += [Entry(days[0], Decimal("-4500.00"), "rent", f"RENT-{tag}"),
                Entry(days[-3], Decimal("-18250.00"), "payroll", f"PAY-{tag}"),
                Entry(days[4], Decimal("-289.00"), "software", f"SW-{tag}"),
                Entry(days[9], _varied(rng, usual.utilities), "utilities", f"UT-{tag}")]  # fmt: skip
    entries += [
        Entry(rng.choice(days), _varied(rng, a), "purchases", f"PO-{first + n}") for n, a in enumerate(usual.purchases)
    ]
    entries += [
        Entry(rng.choice(days), _varied(rng, a), "travel", f"TR-{first + n}") for n, a in enumerate(usual.travel)
    ]
    return entries


def _account(words: Language, role: str) -> str:
    return words.accounts["purchases" if role == "cheque" else role]


def make_books(seed: int, folder: Path, rows_per_month: int | None = None) -> Books:
    """Write one company's books for a month and the month before, with faults planted; see the module doc."""
    rng = random.Random(seed)
    company, code, currency = COMPANIES[seed % len(COMPANIES)]
    words = LANGUAGES[code]
    year, month = rng.randint(2024, 2027), rng.randint(1, 12)
    before = _month_before(year, month)
    rows = rows_per_month or rng.choice((20, 40, 120))
    # Both months vary the same usual amounts by at most 4 %, so only planted changes cross the variance threshold.
    usual = Usual.draw(rng, rows - 9)
    entries = _month_entries(rng, *before, usual, 4000)
    current = _month_entries(rng, year, month, usual, 4000 + rows)
    entries += current
    for entry in entries:
        entry.bank_day = entry.day + timedelta(days=rng.choice((0, 0, 1, 1, 2)))
        entry.bank_amount = entry.amount
    days = _business_days(year, month)
    label = f"{calendar.month_name[before[1]]} {before[0]}"
    faults = rng.sample(FAULTS, rng.randint(3, len(FAULTS)))
    bank_references = rng.random() < 0.6
    books = Books(seed, folder / f"books-{seed}.toml", "")
    receipts_now = [e for e in current if e.role == "sales"]
    rng.shuffle(receipts_now)
    extra_balance = Decimal(0)
    for fault in sorted(faults):
        if fault == "duplicate":
            twice = receipts_now.pop()
            entries.append(Entry(twice.day, twice.amount, "sales", twice.reference, in_ledger=True))
            books.planted += [("duplicates", f"2 identical rows in ledger: {twice.reference}", twice.amount),
                              ("match", f"In ledger, not in bank: {twice.reference}", twice.amount)]  # fmt: skip
        elif fault in ("fee", "debit"):
            amount = -_money(rng, 5, 60) if fault == "fee" else -_money(rng, 800, 2500)
            reference = f"DD-{rng.randint(10000, 99999)}" if fault == "debit" and bank_references else ""
            day = rng.choice(days)
            entries.append(Entry(day, amount, fault, reference, day, amount, in_ledger=False))
            books.planted.append(("match", f"In bank, not in ledger: {reference or words.says[fault]}", amount))
        elif fault == "cheque":
            amount, reference = -_money(rng, 300, 1500), f"CHQ-{rng.randint(1000, 9999)}"
            entries.append(Entry(rng.choice(days), amount, "cheque", reference))
            books.planted.append(("match", f"In ledger, not in bank: {reference}", amount))
        elif fault == "differs":
            wrong = receipts_now.pop()
            wrong.bank_amount = wrong.amount - _money(rng, 5, 99)
            if bank_references:
                books.planted.append(("match", f"Amount differs for reference {wrong.reference}",
                                      wrong.bank_amount - wrong.amount))  # fmt: skip
            else:
                books.planted += [("match", f"In bank, not in ledger: {words.says['sales']}", wrong.bank_amount),
                                  ("match", f"In ledger, not in bank: {wrong.reference}", wrong.amount)]  # fmt: skip
        elif fault == "balance":
            extra_balance = _money(rng, 10, 500)
            books.planted.append(("balance", f"{words.accounts['bank']}: opening + movements does not equal closing",
                                  -extra_balance))  # fmt: skip
        elif fault == "variance":
            travel = [e for e in current if e.role == "travel"]
            factor = Decimal(rng.choice((3, 4, 5)))
            for entry in travel:
                entry.amount = entry.bank_amount = entry.amount * factor
            now = sum(e.amount for e in travel)
            was = sum(e.amount for e in entries if e.role == "travel" and (e.day.year, e.day.month) == before)
            percent = ((abs(now) - abs(was)) / abs(was) * 100).quantize(Decimal("1"))
            books.planted.append(("variance", f"account {words.accounts['travel']}: up {percent}% against {label}",
                                  now - was))  # fmt: skip
    opening = _money(rng, 20000, 90000)
    books.about = _write(rng, books, folder, company, code, currency, words, entries, opening, extra_balance,
                         (year, month), bank_references)  # fmt: skip
    return books


def _write(rng: random.Random, books: Books, folder: Path, company: str, code: str, currency: str, words: Language,
           entries: list[Entry], opening: Decimal, extra: Decimal, period: tuple[int, int],
           bank_references: bool) -> str:  # fmt: skip
    """The files in a layout the seed picks, and the schedule that reads them; returns the layout in words."""
    year, month = period
    end = date(year, month, calendar.monthrange(year, month)[1])
    before = _month_before(year, month)
    start_before = date(*before, 1)
    decimal, thousands = rng.choice(words.numbers)
    date_format = rng.choice(words.date_formats)
    trailing = code == "de" and rng.random() < 0.4
    pair = rng.random() < 0.35
    encoding = rng.choice(("utf-8", "utf-8-sig", "cp1252")) if thousands != "\u202f" else "utf-8"
    delimiter = "," if decimal == "." else rng.choice((";", "\t"))
    header = [words.bank["date"], *(words.bank[c] for c in (("debit", "credit") if pair else ("amount",)))]
    header += [words.bank["reference"]] if bank_references else []
    header.append(words.bank["description"])
    bank_rows = []
    for entry in sorted((e for e in entries if e.bank_day is not None), key=lambda e: (e.bank_day, e.reference)):
        text = _amount_text(abs(entry.bank_amount), decimal, thousands, trailing)
        amounts = ([text, ""] if entry.bank_amount < 0 else ["", text]) if pair else [
            _amount_text(entry.bank_amount, decimal, thousands, trailing)]  # fmt: skip
        row = [entry.bank_day.strftime(date_format), *amounts]
        row += [entry.reference if entry.role not in ("fee",) else ""] if bank_references else []
        row.append(words.says[entry.role])
        bank_rows.append(row)
    bank = folder / f"bank-{books.seed}.csv"
    with bank.open("w", newline="", encoding=encoding) as out:
        writer = csv.writer(out, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(bank_rows)
    columns = {"date": words.bank["date"], "description": words.bank["description"]}
    columns |= (
        {"debit": words.bank["debit"], "credit": words.bank["credit"]} if pair else {"amount": words.bank["amount"]}
    )
    columns |= {"reference": words.bank["reference"]} if bank_references else {}
    negative = '["trailing"]' if trailing else '["leading"]'
    bank_toml = (f'type = "csv"\npath = "{bank.name}"\nencoding = "{encoding}"\ndelimiter = "{_toml(delimiter)}"\n'
                 f'date_format = "{date_format}"\ndecimal = "{decimal}"\nthousands = "{_toml(thousands)}"\n'
                 f'negative = {negative}\ncurrency = "{currency}"\ncolumns = {_table(columns)}\n')  # fmt: skip
    posted = sorted((e for e in entries if e.in_ledger), key=lambda e: (e.day, e.reference))
    closing_before = opening + sum(e.amount for e in posted if (e.day.year, e.day.month) == before)
    closing = closing_before + sum(e.amount for e in posted if (e.day.year, e.day.month) == period) + extra
    balances = [(start_before - timedelta(days=1), opening), (date(*before, calendar.monthrange(*before)[1]),
                                                               closing_before), (end, closing)]  # fmt: skip
    bank_account = words.accounts["bank"]
    sql = rng.random() < 0.6
    names = words.ledger
    if sql:
        minor = rng.random() < 0.5
        ledger = folder / f"ledger-{books.seed}.sqlite"
        with sqlite3.connect(ledger) as db:
            kind = "INTEGER" if minor else "TEXT"
            db.execute(f"CREATE TABLE {names['table']} ({names['date']} TEXT, {names['account']} TEXT, "
                       f"{names['amount']} {kind}, {names['reference']} TEXT, {names['description']} TEXT)")  # fmt: skip
            db.executemany(f"INSERT INTO {names['table']} VALUES (?, ?, ?, ?, ?)", [
                (e.day.isoformat(), _account(words, e.role),
                 int(e.amount * 100) if minor else str(e.amount), e.reference, words.says[e.role]) for e in posted])  # fmt: skip
            db.execute("CREATE TABLE saldo (account TEXT, day TEXT, balance TEXT)")
            db.executemany("INSERT INTO saldo VALUES (?, ?, ?)",
                           [(bank_account, day.isoformat(), str(amount)) for day, amount in balances])  # fmt: skip
        ledger_toml = (f'type = "sqlite"\npath = "{ledger.name}"\ncurrency = "{currency}"\n'
                       + ('integer_amounts = "minor units"\n' if minor else "")
                       + f'query = """\nSELECT {names["date"]} AS date, {names["amount"]} AS amount, '
                       f'{names["reference"]} AS reference, {names["account"]} AS account, '
                       f'{names["description"]} AS description\nFROM {names["table"]} WHERE {names["date"]} '
                       'BETWEEN :start AND :end\n"""\n')  # fmt: skip
        balances_toml = (
            f'type = "sqlite"\npath = "{ledger.name}"\ncurrency = "{currency}"\n'
            'query = "SELECT day AS date, balance AS amount, account FROM saldo"\n'
        )
        layout = f"ledger SQLite ({'INTEGER minor units' if minor else 'TEXT'})"
    else:
        ledger = folder / f"ledger-{books.seed}.csv"
        with ledger.open("w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)
            writer.writerow([names[c] for c in ("date", "account", "amount", "reference", "description")])
            writer.writerows([e.day.isoformat(), _account(words, e.role),
                              str(e.amount), e.reference, words.says[e.role]] for e in posted)  # fmt: skip
        balance_file = folder / f"balances-{books.seed}.csv"
        with balance_file.open("w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)
            writer.writerow(["date", "account", "balance"])
            writer.writerows([day.isoformat(), bank_account, str(amount)] for day, amount in balances)
        ledger_toml = (f'type = "csv"\npath = "{ledger.name}"\ncurrency = "{currency}"\n'
                       f'columns = {_table({c: names[c] for c in ("date", "account", "amount", "reference", "description")})}\n')  # fmt: skip
        balances_toml = (
            f'type = "csv"\npath = "{balance_file.name}"\ncurrency = "{currency}"\n'
            'columns = { date = "date", amount = "balance", account = "account" }\n'
        )
        layout = "ledger CSV"
    books.schedule.write_text(f'''# {company}: generated books (tests/books.py, seed {books.seed})
name = "books-{books.seed}"
title = "{company}: month-end review"
when = "last business day of the month at 22:00"
timezone = "Europe/London"
materiality = "1000.00"

[window]
period = "month"
as_of = {end.isoformat()}

[sources.bank]
{bank_toml}
[sources.ledger]
{ledger_toml}
[sources.balances]
{balances_toml}
[[checks]]
type = "match"
left = "bank"
right = "ledger"
date_tolerance_days = 3
use_reference = {"true" if bank_references else "false"}

[[checks]]
type = "duplicates"
source = "ledger"

[[checks]]
type = "totals"
source = "ledger"
by = "account"

[[checks]]
type = "balance"
balances = "balances"
movements = "ledger"
account = "{bank_account}"

[[checks]]
type = "variance"
source = "ledger"
by = "account"
threshold_pct = 50
min_change = "500.00"
''', encoding="utf-8")  # fmt: skip
    amounts = "debit/credit" if pair else ("trailing minus" if trailing else "signed")
    return (f"{company} ({code}, {currency}, {len(posted)} postings): bank CSV {encoding} {delimiter!r} "
            f"{date_format} {decimal!r}/{thousands!r} {amounts}{' with references' if bank_references else ''}; "
            f"{layout}; faults {sorted({check for check, _, _ in books.planted})}")  # fmt: skip


def _toml(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\u202f", "\\u202F")


def _table(mapping: dict[str, str]) -> str:
    return "{ " + ", ".join(f'{key} = "{value}"' for key, value in mapping.items()) + " }"
