"""A German month-end as nobody on the project wrote it (issue [19]'s outside test): a Sparkasse-like bank
statement with an unmapped Währung and running Saldo and a dated total row after each month, a ledger CSV, and
month-end balances by month with no account column. October's closing balance is 100.00 above the rows and the
bank's charges of 12.50 are not in the ledger. tests/test_misread.py and the narrative evaluation
(bench/narrative_books.py) read it."""

from __future__ import annotations

from pathlib import Path

# A German bank statement (Sparkasse-like): semicolons, 1.234,56, an unmapped Währung and running Saldo, and a
# dated total row after each month. September's rows end on the balance of 30 September.
KONTO = """Buchungstag;Wertstellung;Buchungstext;Verwendungszweck;Betrag;Währung;Saldo
02.09.2026;02.09.2026;Miete;RENT-0926;-2.500,00;EUR;6.500,00
10.09.2026;10.09.2026;Gutschrift;RE-4700;3.500,00;EUR;10.000,00
30.09.2026;;Summe September;;1.000,00;EUR;
01.10.2026;01.10.2026;Miete;RENT-1026;-2.500,00;EUR;7.500,00
05.10.2026;05.10.2026;Gutschrift;RE-4711;4.200,00;EUR;11.700,00
12.10.2026;12.10.2026;Lastschrift;STROM-10;-310,40;EUR;11.389,60
15.10.2026;15.10.2026;Gutschrift;RE-4712;1.850,00;EUR;13.239,60
20.10.2026;20.10.2026;Überweisung;LI-220;-3.120,75;EUR;10.118,85
28.10.2026;28.10.2026;Gehälter;GEH-1026;-6.000,00;EUR;4.118,85
30.10.2026;30.10.2026;Kontoführungsgebühren;;-12,50;EUR;4.106,35
31.10.2026;;Summe Oktober;;-5.893,65;EUR;
"""
BUCHUNGEN = """Datum;Konto;Beleg;Text;Betrag
02.09.2026;Miete;RENT-0926;Büromiete;-2.500,00
10.09.2026;Umsatzerlöse;RE-4700;Zahlung Kunde;3.500,00
01.10.2026;Miete;RENT-1026;Büromiete;-2.500,00
05.10.2026;Umsatzerlöse;RE-4711;Zahlung Kunde;4.200,00
12.10.2026;Energie;STROM-10;Strom;-310,40
15.10.2026;Umsatzerlöse;RE-4712;Zahlung Kunde;1.850,00
20.10.2026;Wareneinkauf;LI-220;Lieferantenrechnung;-3.120,75
28.10.2026;Löhne;GEH-1026;Gehälter;-6.000,00
"""
# Month-end balances as the bank states them: by month, no account column; October's is 100.00 above the rows.
SALDEN = "Monat;Kontostand\n08.2026;9.000,00\n09.2026;10.000,00\n10.2026;4.206,35\n"
GERMAN = """name = "monatsabschluss"
when = "last business day of the month at 20:00"
calendar = "DE-BY"
timezone = "Europe/Berlin"
materiality = "1000.00"

[window]
period = "month"
as_of = 2026-10-30

[sources.bank]
type = "csv"
path = "konto.csv"
delimiter = ";"
date_format = "%d.%m.%Y"
decimal = ","
thousands = "."
currency = "EUR"
columns = { date = "Buchungstag", amount = "Betrag", reference = "Verwendungszweck", description = "Buchungstext" }

[sources.ledger]
type = "csv"
path = "buchungen.csv"
delimiter = ";"
date_format = "%d.%m.%Y"
decimal = ","
thousands = "."
currency = "EUR"
columns = { date = "Datum", amount = "Betrag", reference = "Beleg", account = "Konto", description = "Text" }

[sources.saldo]
type = "csv"
path = "salden.csv"
delimiter = ";"
date_format = "%m.%Y"
decimal = ","
thousands = "."
currency = "EUR"
account = "Bank"
columns = { date = "Monat", amount = "Kontostand" }

[[checks]]
type = "match"
left = "bank"
right = "ledger"

[[checks]]
type = "balance"
balances = "saldo"
movements = "bank"
account = "Bank"
"""


def german_books(folder: Path, schedule: str = GERMAN) -> Path:
    for name, text in (("konto.csv", KONTO), ("buchungen.csv", BUCHUNGEN), ("salden.csv", SALDEN)):
        (folder / name).write_text(text, encoding="utf-8")
    (folder / "monatsabschluss.toml").write_text(schedule, encoding="utf-8")
    return folder / "monatsabschluss.toml"
