"""Generated books: a seed makes one company's bank statement, ledger and balances, in one of many layouts,
with faults planted on purpose and the findings they must produce.

Each seed picks a company and its language (headers, account names and descriptions in English, German,
French or Spanish), a currency, a month, a size, and how each file is written: the bank statement as CSV
(delimiter, date format, decimal and thousands characters, trailing minus, debit/credit columns, encoding
with or without a BOM, with or without references), SWIFT MT940 or OFX; the ledger and its balances as CSV,
SQLite (TEXT decimals or INTEGER minor units) or a Beancount file (its balance assertions are the
balances). The books reconcile except for the planted faults (a posting booked twice, bank charges and a
direct debit never booked, a cheque not cleared, an amount keyed wrong, a closing balance off, an expense
that jumps), and `Books.planted` lists the (check, title, amount) each must produce. The bundled sample
(schedules/sample-data) is one such set of books; these are many more.

    books = make_books(7, tmp_path)      # writes the files and books.schedule, the review's TOML
"""

from __future__ import annotations

import calendar
import copy
import csv
import random
import sqlite3
import unicodedata
import xml.etree.ElementTree as ET
from collections.abc import Iterator
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


@dataclass(frozen=True)
class Layout:
    """How one company's files are written, drawn from the seed."""

    bank: str  # "csv", "mt940" or "ofx"
    ledger: str  # "csv", "sqlite" or "beancount"
    references: bool  # the bank states references
    decimal: str = "."
    thousands: str = ""
    date_format: str = "%Y-%m-%d"
    trailing: bool = False  # negative amounts written 12.50-
    pair: bool = False  # debit and credit columns instead of a signed amount
    encoding: str = "utf-8"
    delimiter: str = ","
    minor: bool = False  # SQLite amounts as INTEGER minor units

    @classmethod
    def draw(cls, rng: random.Random, code: str, words: Language) -> Layout:
        draw = rng.random()
        bank = "mt940" if draw < 0.15 else ("ofx" if draw < 0.3 else "csv")
        ledger = rng.choice(("csv", "sqlite", "sqlite", "beancount"))
        decimal, thousands = rng.choice(words.numbers)
        return cls(
            bank, ledger, rng.random() < 0.6, decimal, thousands, rng.choice(words.date_formats),
            code == "de" and rng.random() < 0.4, rng.random() < 0.35,
            rng.choice(("utf-8", "utf-8-sig", "cp1252")) if thousands != "\u202f" else "utf-8",
            "," if decimal == "." else rng.choice((";", "\t")), ledger == "sqlite" and rng.random() < 0.5,
        )  # fmt: skip

    def accounts(self, words: Language) -> dict[str, str]:
        return BEANCOUNT_ACCOUNTS if self.ledger == "beancount" else words.accounts

    def says(self, words: Language, role: str) -> str:
        """A row's description as the bank writes it (MT940 allows no accents)."""
        text = words.says[role]
        return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode() if self.bank == "mt940" else text

    def about(self) -> str:
        if self.bank != "csv":
            bank = f"bank {self.bank.upper()}"
        else:
            amounts = "debit/credit" if self.pair else ("trailing minus" if self.trailing else "signed")
            bank = (f"bank CSV {self.encoding} {self.delimiter!r} {self.date_format} {self.decimal!r}/"
                    f"{self.thousands!r} {amounts}")  # fmt: skip
        ledger = {"csv": "ledger CSV", "beancount": "ledger Beancount",
                  "sqlite": f"ledger SQLite ({'INTEGER minor units' if self.minor else 'TEXT'})"}[self.ledger]  # fmt: skip
        return f"{bank}{' with references' if self.references else ''}; {ledger}"


BEANCOUNT_ACCOUNTS = {"bank": "Assets:Bank", "sales": "Income:Sales", "rent": "Expenses:Rent",
                      "payroll": "Expenses:Payroll", "travel": "Expenses:Travel", "purchases": "Expenses:Purchases",
                      "software": "Expenses:Software", "utilities": "Expenses:Utilities"}  # fmt: skip


def make_books(seed: int, folder: Path, rows_per_month: int | None = None) -> Books:
    """Write one company's books for a month and the month before, with faults planted; see the module doc."""
    rng = random.Random(seed)
    company, code, currency = COMPANIES[seed % len(COMPANIES)]
    words = LANGUAGES[code]
    layout = Layout.draw(rng, code, words)
    accounts = layout.accounts(words)
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
            reference = f"DD-{rng.randint(10000, 99999)}" if fault == "debit" and layout.references else ""
            day = rng.choice(days)
            entries.append(Entry(day, amount, fault, reference, day, amount, in_ledger=False))
            label_of = reference or layout.says(words, fault)
            books.planted.append(("match", f"In bank, not in ledger: {label_of}", amount))
        elif fault == "cheque":
            amount, reference = -_money(rng, 300, 1500), f"CHQ-{rng.randint(1000, 9999)}"
            entries.append(Entry(rng.choice(days), amount, "cheque", reference))
            books.planted.append(("match", f"In ledger, not in bank: {reference}", amount))
        elif fault == "differs":
            wrong = receipts_now.pop()
            wrong.bank_amount = wrong.amount - _money(rng, 5, 99)
            if layout.references:
                books.planted.append(("match", f"Amount differs for reference {wrong.reference}",
                                      wrong.bank_amount - wrong.amount))  # fmt: skip
            else:
                books.planted += [("match", f"In bank, not in ledger: {layout.says(words, 'sales')}",
                                   wrong.bank_amount),
                                  ("match", f"In ledger, not in bank: {wrong.reference}", wrong.amount)]  # fmt: skip
        elif fault == "balance":
            extra_balance = _money(rng, 10, 500)
            books.planted.append(("balance", f"{accounts['bank']}: opening + movements does not equal closing",
                                  -extra_balance))  # fmt: skip
        elif fault == "variance":
            travel = [e for e in current if e.role == "travel"]
            factor = Decimal(rng.choice((3, 4, 5)))
            for entry in travel:
                entry.amount = entry.bank_amount = entry.amount * factor
            now = sum(e.amount for e in travel)
            was = sum(e.amount for e in entries if e.role == "travel" and (e.day.year, e.day.month) == before)
            percent = ((abs(now) - abs(was)) / abs(was) * 100).quantize(Decimal("1"))
            books.planted.append(("variance", f"account {accounts['travel']}: up {percent}% against {label}",
                                  now - was))  # fmt: skip
    files = Files(books.seed, folder, company, currency, words, layout, (year, month))
    sources = files.bank(entries, rng) + files.ledger(entries, _money(rng, 20000, 90000), extra_balance)
    books.schedule.write_text(files.schedule(sources), encoding="utf-8")
    faults_found = sorted({check for check, _, _ in books.planted})
    books.about = f"{company} ({code}, {currency}, {rows} postings a month): {layout.about()}; faults {faults_found}"
    return books


@dataclass
class Files:
    """Writes one company's files in its layout and the schedule that reads them."""

    seed: int
    folder: Path
    company: str
    currency: str
    words: Language
    layout: Layout
    period: tuple[int, int]

    @property
    def end(self) -> date:
        return date(*self.period, calendar.monthrange(*self.period)[1])

    def bank(self, entries: list[Entry], rng: random.Random) -> str:
        """The bank statement (every entry with a bank line); returns its [sources.bank] table."""
        lines = sorted((e for e in entries if e.bank_day is not None), key=lambda e: (e.bank_day, e.reference))
        if self.layout.bank != "csv":
            statements = list(_statements(lines, _money(rng, 5000, 50000)))
            write, suffix = (self._mt940, "sta") if self.layout.bank == "mt940" else (self._ofx, "ofx")
            path = self.folder / f"bank-{self.seed}.{suffix}"
            path.write_text(write(statements), encoding="utf-8", newline="")
            return f'[sources.bank]\ntype = "{self.layout.bank}"\npath = "{path.name}"\ncurrency = "{self.currency}"\n'
        layout, words = self.layout, self.words
        header = [words.bank["date"], *(words.bank[c] for c in (("debit", "credit") if layout.pair else ("amount",)))]
        header += [words.bank["reference"]] if layout.references else []
        header.append(words.bank["description"])
        path = self.folder / f"bank-{self.seed}.csv"
        with path.open("w", newline="", encoding=layout.encoding) as out:
            writer = csv.writer(out, delimiter=layout.delimiter)
            writer.writerow(header)
            for entry in lines:
                text = _amount_text(abs(entry.bank_amount), layout.decimal, layout.thousands, layout.trailing)
                signed = _amount_text(entry.bank_amount, layout.decimal, layout.thousands, layout.trailing)
                amounts = ([text, ""] if entry.bank_amount < 0 else ["", text]) if layout.pair else [signed]
                references = [entry.reference] if layout.references else []
                writer.writerow([entry.bank_day.strftime(layout.date_format), *amounts, *references,
                                 words.says[entry.role]])  # fmt: skip
        columns = {"date": words.bank["date"], "description": words.bank["description"]}
        amounts = ("debit", "credit") if layout.pair else ("amount",)
        columns |= {c: words.bank[c] for c in amounts} | (
            {"reference": words.bank["reference"]} if layout.references else {}
        )
        return (f'[sources.bank]\ntype = "csv"\npath = "{path.name}"\nencoding = "{layout.encoding}"\n'
                f'delimiter = "{_toml(layout.delimiter)}"\ndate_format = "{layout.date_format}"\n'
                f'decimal = "{layout.decimal}"\nthousands = "{_toml(layout.thousands)}"\n'
                f'negative = ["{"trailing" if layout.trailing else "leading"}"]\ncurrency = "{self.currency}"\n'
                f"columns = {_table(columns)}\n")  # fmt: skip

    def _mt940(self, statements: list[Statement]) -> str:
        """SWIFT MT940: per statement :60F: opening, a :61: and :86: per line, :62F: closing."""
        out = []
        for number, (first, last, lines, opening, closing) in enumerate(statements, start=1):
            out += [f":20:STMT{number:04d}", f":25:{self.account}", f":28C:{number:05d}/001",
                    _mt_balance("60F", opening, first - timedelta(days=1), self.currency)]  # fmt: skip
            for entry in lines:
                mark = "D" if entry.bank_amount < 0 else "C"
                reference = entry.reference if self.layout.references and entry.reference else "NONREF"
                out += [f":61:{entry.bank_day:%y%m%d}{entry.bank_day:%m%d}{mark}{_mt_amount(entry.bank_amount)}"
                        f"NTRF{reference}", f":86:{self.layout.says(self.words, entry.role)}"]  # fmt: skip
            out += [_mt_balance("62F", closing, last, self.currency), "-"]
        return "\r\n".join(out) + "\r\n"

    def _ofx(self, statements: list[Statement]) -> str:
        """OFX 2 (XML): a statement per month, each line a STMTTRN (REFNUM the reference, MEMO the text)."""
        status = _element("STATUS", _element("CODE", "0"), _element("SEVERITY", "INFO"))
        responses = []
        for number, (first, last, lines, _, closing) in enumerate(statements, start=1):
            moves = [
                _element("STMTTRN", _element("TRNTYPE", "DEBIT" if e.bank_amount < 0 else "CREDIT"),
                         _element("DTPOSTED", f"{e.bank_day:%Y%m%d}"), _element("TRNAMT", f"{e.bank_amount:.2f}"),
                         _element("FITID", f"{number:02d}{index:05d}"),
                         _element("REFNUM", e.reference) if self.layout.references and e.reference else None,
                         _element("MEMO", self.layout.says(self.words, e.role)))
                for index, e in enumerate(lines, start=1)
            ]  # fmt: skip
            account = _element("BANKACCTFROM", _element("BANKID", "60161331"), _element("ACCTID", self.account),
                               _element("ACCTTYPE", "CHECKING"))  # fmt: skip
            listed = _element("BANKTRANLIST", _element("DTSTART", f"{first:%Y%m%d}"), _element("DTEND", f"{last:%Y%m%d}"),
                              *moves)  # fmt: skip
            held = _element("LEDGERBAL", _element("BALAMT", f"{closing:.2f}"), _element("DTASOF", f"{last:%Y%m%d}"))
            responses.append(_element("STMTTRNRS", _element("TRNUID", str(number)), copy.deepcopy(status),
                                      _element("STMTRS", _element("CURDEF", self.currency), account, listed, held)))  # fmt: skip
        signon = _element("SIGNONMSGSRSV1", _element("SONRS", status, _element("DTSERVER", f"{self.end:%Y%m%d}"),
                                                     _element("LANGUAGE", "ENG")))  # fmt: skip
        head = ('<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n<?OFX OFXHEADER="200" VERSION="220" '
                'SECURITY="NONE" OLDFILEUID="NONE" NEWFILEUID="NONE"?>\n')  # fmt: skip
        return head + ET.tostring(_element("OFX", signon, _element("BANKMSGSRSV1", *responses)), encoding="unicode")

    @property
    def account(self) -> str:
        return f"GB{self.seed:02d}NWBK60161331926819"

    def ledger(self, entries: list[Entry], opening: Decimal, extra: Decimal) -> str:
        """The ledger and the bank account's balances (end of the month before last, last month, this month)."""
        posted = sorted((e for e in entries if e.in_ledger), key=lambda e: (e.day, e.reference))
        before = _month_before(*self.period)
        closing_before = opening + sum(e.amount for e in posted if (e.day.year, e.day.month) == before)
        closing = closing_before + sum(e.amount for e in posted if (e.day.year, e.day.month) == self.period) + extra
        balances = [(date(*before, 1) - timedelta(days=1), opening),
                    (date(*before, calendar.monthrange(*before)[1]), closing_before), (self.end, closing)]  # fmt: skip
        return {"csv": self._ledger_csv, "sqlite": self._ledger_sqlite, "beancount": self._beancount}[
            self.layout.ledger
        ](posted, balances)

    def _account(self, role: str) -> str:
        return self.layout.accounts(self.words)["purchases" if role == "cheque" else role]

    def _ledger_sqlite(self, posted: list[Entry], balances: list[tuple[date, Decimal]]) -> str:
        names, minor, bank = self.words.ledger, self.layout.minor, self._account("bank")
        path = self.folder / f"ledger-{self.seed}.sqlite"
        with sqlite3.connect(path) as db:
            db.execute(f"CREATE TABLE {names['table']} ({names['date']} TEXT, {names['account']} TEXT, "
                       f"{names['amount']} {'INTEGER' if minor else 'TEXT'}, {names['reference']} TEXT, "
                       f"{names['description']} TEXT)")  # fmt: skip
            db.executemany(f"INSERT INTO {names['table']} VALUES (?, ?, ?, ?, ?)", [
                (e.day.isoformat(), self._account(e.role), int(e.amount * 100) if minor else str(e.amount),
                 e.reference, self.words.says[e.role]) for e in posted])  # fmt: skip
            db.execute("CREATE TABLE saldo (account TEXT, day TEXT, balance TEXT)")
            db.executemany("INSERT INTO saldo VALUES (?, ?, ?)", [(bank, d.isoformat(), str(a)) for d, a in balances])
        common = f'type = "sqlite"\npath = "{path.name}"\ncurrency = "{self.currency}"\n'
        return (f'[sources.ledger]\n{common}' + ('integer_amounts = "minor units"\n' if minor else "")
                + f'query = """\nSELECT {names["date"]} AS date, {names["amount"]} AS amount, {names["reference"]} '
                f'AS reference, {names["account"]} AS account, {names["description"]} AS description\n'
                f'FROM {names["table"]} WHERE {names["date"]} BETWEEN :start AND :end\n"""\n\n'
                f'[sources.balances]\n{common}query = "SELECT day AS date, balance AS amount, account FROM saldo"\n')  # fmt: skip

    def _ledger_csv(self, posted: list[Entry], balances: list[tuple[date, Decimal]]) -> str:
        names, ours = self.words.ledger, ("date", "account", "amount", "reference", "description")
        path, balance_path = self.folder / f"ledger-{self.seed}.csv", self.folder / f"balances-{self.seed}.csv"
        with path.open("w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)
            writer.writerow([names[c] for c in ours])
            writer.writerows([e.day.isoformat(), self._account(e.role), str(e.amount), e.reference,
                              self.words.says[e.role]] for e in posted)  # fmt: skip
        with balance_path.open("w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)
            writer.writerow(["date", "account", "balance"])
            writer.writerows([day.isoformat(), self._account("bank"), str(amount)] for day, amount in balances)
        return (f'[sources.ledger]\ntype = "csv"\npath = "{path.name}"\ncurrency = "{self.currency}"\n'
                f"columns = {_table({c: names[c] for c in ours})}\n\n"
                f'[sources.balances]\ntype = "csv"\npath = "{balance_path.name}"\ncurrency = "{self.currency}"\n'
                'columns = { date = "date", amount = "balance", account = "account" }\n')  # fmt: skip

    def _beancount(self, posted: list[Entry], balances: list[tuple[date, Decimal]]) -> str:
        """Transactions linked by reference (^INV-4001); `balance` directives assert at the start of the next day."""
        bank, currency = self._account("bank"), self.currency
        lines = [f'option "title" "{self.company}"', f'option "operating_currency" "{currency}"', ""]
        lines += [f"2000-01-01 open {account} {currency}" for account in sorted(set(BEANCOUNT_ACCOUNTS.values()))]
        lines += ["2000-01-01 open Equity:Opening-Balances", ""]
        first, opening = balances[0]
        lines += [f'{first.isoformat()} * "Opening balance"', f"  {bank}  {opening:.2f} {currency}",
                  "  Equity:Opening-Balances", ""]  # fmt: skip
        for e in posted:
            narration = self.words.says[e.role].replace('"', "'")
            lines += [f'{e.day.isoformat()} * "{narration}" ^{e.reference}', f"  {bank}  {e.amount:.2f} {currency}",
                      f"  {self._account(e.role)}", ""]  # fmt: skip
        lines += [f"{(day + timedelta(days=1)).isoformat()} balance {bank}  {amount:.2f} {currency}"
                  for day, amount in balances[1:]]  # fmt: skip
        path = self.folder / f"books-{self.seed}.beancount"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        common = f'type = "beancount"\npath = "{path.name}"\naccount = "{bank}"\n'
        return f'[sources.ledger]\n{common}\n[sources.balances]\n{common}rows = "balances"\n'

    def schedule(self, sources: str) -> str:
        return f'''# {self.company}: generated books (bench/helpers/books.py, seed {self.seed})
name = "books-{self.seed}"
title = "{self.company}: month-end review"
when = "last business day of the month at 22:00"
timezone = "Europe/London"
materiality = "1000.00"

[window]
period = "month"
as_of = {self.end.isoformat()}

{sources}
[[checks]]
type = "match"
left = "bank"
right = "ledger"
date_tolerance_days = 3
use_reference = {"true" if self.layout.references else "false"}

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
account = "{self._account("bank")}"

[[checks]]
type = "variance"
source = "ledger"
by = "account"
threshold_pct = 50
min_change = "500.00"
'''


Statement = tuple[date, date, list[Entry], Decimal, Decimal]  # first and last day, lines, opening, closing


def _statements(lines: list[Entry], opening: Decimal) -> Iterator[Statement]:
    """The bank lines as monthly statements, each with its opening and closing balance."""
    for month in sorted({(e.bank_day.year, e.bank_day.month) for e in lines}):
        mine = [e for e in lines if (e.bank_day.year, e.bank_day.month) == month]
        closing = opening + sum(e.bank_amount for e in mine)
        yield date(*month, 1), date(*month, calendar.monthrange(*month)[1]), mine, opening, closing
        opening = closing


def _element(tag: str, *children: ET.Element | str | None) -> ET.Element:
    """An XML element with text (a str) or child elements (None skipped)."""
    element = ET.Element(tag)
    for child in children:
        if isinstance(child, str):
            element.text = child
        elif child is not None:
            element.append(child)
    return element


def _mt_amount(amount: Decimal) -> str:
    return f"{abs(amount):.2f}".replace(".", ",")


def _mt_balance(tag: str, amount: Decimal, day: date, currency: str) -> str:
    return f":{tag}:{'C' if amount >= 0 else 'D'}{day:%y%m%d}{currency}{_mt_amount(amount)}"


def _toml(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\u202f", "\\u202F")


def _table(mapping: dict[str, str]) -> str:
    return "{ " + ", ".join(f'{key} = "{value}"' for key, value in mapping.items()) + " }"
