"""Statement and ledger formats (camt.053, MT940, OFX, Beancount): the bundled samples' planted faults are found,
amounts stay exact and signed as the file states them, and a malformed file is refused naming the file and the fault.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest

from nightshift.app.review.errors import ReviewError, ScheduleError
from nightshift.app.review.runner import run_checks_for
from nightshift.app.review.schedule import BUNDLED_DIR, load_schedule, load_schedules
from nightshift.app.review.sources import source_kind

SAMPLES = BUNDLED_DIR / "sample-data"
OPERATING, RESERVE = "DE89370400440532013000", "DE02120300000000202051"
FILES = {"camt053": "camt053/statements.xml", "mt940": "mt940/statements.sta", "ofx": "ofx/statements.ofx",
         "beancount": "beancount/books.beancount"}  # fmt: skip
OCTOBER = (date(2026, 10, 1), date(2026, 10, 31))

# (check, amount, a text the finding's title names) of each fault planted by sample-data/generate_formats.py
PLANTED = [
    ("match", Decimal("-38.50"), "In bank, not in ledger: Bank charges foreign payments"),
    ("match", Decimal("-45.00"), "INV-7004"),
    ("duplicates", Decimal("-1312.60"), "PO-8812"),
    ("match", Decimal("-1312.60"), "In ledger, not in bank: PO-8812"),
    ("variance", Decimal("-1420.00"), "Expenses:Travel"),
]
BALANCE = {"camt053": OPERATING, "mt940": OPERATING, "ofx": OPERATING, "beancount": "Assets:Bank:Operating"}


def planted(review: str) -> list[tuple[str, Decimal, str]]:
    return [*PLANTED, ("balance", Decimal("-100.00"), BALANCE[review])]


def source(kind: str, **options) -> object:
    return source_kind(kind)(name="s", path=options.pop("path", SAMPLES / FILES[kind]), **options)


@pytest.mark.parametrize("review", list(BALANCE))
def test_every_planted_fault_is_found_and_nothing_else(review):
    schedules, errors = load_schedules()
    assert errors == []
    schedule = schedules[review]
    findings = run_checks_for(schedule, schedule.as_of).result.findings
    expected = planted(review)
    assert len(findings) == len(expected), [(f.check, f.title, f.amount) for f in findings]
    for check, amount, named in expected:
        assert any(f.check == check and f.amount == amount and named in f.title for f in findings), (check, named)


@pytest.mark.parametrize("kind", ["camt053", "mt940", "ofx"])
def test_bank_formats_read_the_same_movements_signed_and_dated_as_the_bank_states(kind):
    table = source(kind, account=OPERATING).load(*OCTOBER)
    rows = {(str(table.dates[i]), table.amount(i), table.text["reference"][i]) for i in range(len(table))}
    assert ("2026-10-19", Decimal("500.00"), "INV-7006") in rows
    assert ("2026-10-22", Decimal("-500.00"), "INV-7006") in rows  # the returned payment: RvslInd / RC / negative
    assert ("2026-10-30", Decimal("-38.50"), "") in rows
    # OFX stamps these 00:30 in Berlin (the day before in UTC); the bank's date is kept
    assert ("2026-10-01", Decimal("-2150.00"), "RENT-2026-10") in rows
    assert table.currency == "EUR" and table.scale == 2 and len(table) == 27
    assert sum(table.amount(i) for i in range(len(table))) == Decimal("8055.70")
    camt = source("camt053", account=OPERATING).load(*OCTOBER)
    assert sorted(rows) == sorted((str(camt.dates[i]), camt.amount(i), camt.text["reference"][i])
                                  for i in range(len(camt)))  # fmt: skip


def test_balances_opening_dated_before_its_statement_closing_at_its_end():
    expected = [("2026-08-31", Decimal("24150.00")), ("2026-09-30", Decimal("28013.70")),
                ("2026-10-31", Decimal("32305.70"))]  # fmt: skip
    table = source("camt053", account=OPERATING, rows="balances").load(*OCTOBER)  # OPBD dated 1 September
    assert [(str(table.dates[i]), table.amount(i)) for i in range(len(table))] == expected
    table = source("mt940", account=OPERATING, rows="balances").load(*OCTOBER)  # :60F: dated 31 August
    assert [(str(table.dates[i]), table.amount(i)) for i in range(len(table))] == [("2026-08-30", expected[0][1]),
                                                                                  *expected[1:]]  # fmt: skip
    ofx = source("ofx", rows="balances").load(*OCTOBER)  # closing balances only, two accounts
    assert sorted(set(ofx.text["account"])) == sorted([OPERATING, RESERVE]) and len(ofx) == 4
    beancount = source("beancount", account="Assets:Bank:Operating", rows="balances").load(*OCTOBER)
    assert [(str(beancount.dates[i]), beancount.amount(i)) for i in range(len(beancount))] == [
        ("2026-08-31", Decimal("24150.00")),
        ("2026-09-30", Decimal("28013.70")),
        ("2026-10-31", Decimal("31076.60")),
    ]


def test_beancount_rows_are_postings_to_the_account_with_their_counterpart():
    table = source("beancount", account="Assets:Bank:Operating").load(*OCTOBER)
    rows = [(str(table.dates[i]), table.amount(i), table.text["account"][i], table.text["reference"][i],
             table.text["description"][i]) for i in range(len(table))]  # fmt: skip
    assert ("2026-10-14", Decimal("2450.00"), "Income:Sales", "INV-7004", "Atelier Brandt Invoice INV-7004") in rows
    assert ("2026-10-26", Decimal("-3000.00"), "Assets:Bank:Reserve", "TRF-1026",
            "Lindqvist Design GmbH Transfer to reserve") in rows  # fmt: skip
    everything = source("beancount").load(*OCTOBER)  # every posting, each with its own account
    assert "Expenses:Travel" in set(everything.text["account"]) and sum(everything.amounts.tolist()) == 0


def write(tmp_path: Path, kind: str, old: str, new: str, count: int = 1) -> Path:
    """The sample file of `kind` with `old` replaced by `new` (which must occur)."""
    text = (SAMPLES / FILES[kind]).read_text()
    assert old in text, old
    path = tmp_path / Path(FILES[kind]).name
    path.write_text(text.replace(old, new, count))
    return path


def refused(kind: str, path: Path, **options) -> str:
    with pytest.raises(ReviewError) as caught:
        source(kind, path=path, **options).load(*OCTOBER)
    message = str(caught.value)
    assert str(path) in message
    return message


ENTRY = "/Document/BkToCstmrStmt/Stmt[1]/Ntry[1]"  # the sample's first entry (line 54; its Amt on 56)


def test_camt_malformed_files_are_refused_with_line_and_reason(tmp_path):
    message = refused(
        "camt053", write(tmp_path, "camt053", '<Amt Ccy="EUR">2150.00</Amt>', '<Amt Ccy="EUR">2,150.00</Amt>')
    )
    assert f"line 56: {ENTRY}/Amt: '2,150.00' is not an amount" in message
    message = refused("camt053", write(tmp_path, "camt053", "</GrpHdr>", "</GrpHdr"))
    assert "not well-formed XML" in message
    message = refused("camt053", write(tmp_path, "camt053", "camt.053.001.02", "pain.001.001.03"))
    assert "not a camt.053 statement" in message
    message = refused("camt053", write(tmp_path, "camt053", "camt.053.001.02", "camt.053.001.99"))
    assert "camt.053.001.99 is not a version this reader knows" in message
    message = refused(
        "camt053", write(tmp_path, "camt053", '<Amt Ccy="EUR">2150.00</Amt>', '<Amt Ccy="EUR">2150.005</Amt>')
    )
    assert f"line 56: {ENTRY}/Amt: 2150.005 has 3 decimals; EUR has at most 2" in message


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("2150.00<", "2.15E3<", f"line 56: {ENTRY}/Amt: '2.15E3' is not an amount"),  # exponent
        ("2150.00<", "-2150.00<", f"line 56: {ENTRY}/Amt: '-2150.00' is not an amount"),  # the sign is CdtDbtInd
        ('<Amt Ccy="EUR">2150.00', "<Amt>2150.00", f"line 56: {ENTRY}/Amt: the currency attribute Ccy is None"),
        ("<CdtDbtInd>DBIT</CdtDbtInd>", "", f"line 54: {ENTRY}/CdtDbtInd: missing"),
        ("<CdtDbtInd>DBIT<", "<CdtDbtInd>DEBIT<", f"line 57: {ENTRY}/CdtDbtInd: 'DEBIT' is not a valid code"),
        ("<Dt>2026-09-01</Dt>", "<Dt>2026-02-30</Dt>",  # the opening balance's date
         "line 39: /Document/BkToCstmrStmt/Stmt[1]/Bal[1]/Dt/Dt: '2026-02-30' is not a valid ISO date"),
        ("<Sts>BOOK</Sts>", "<Sts><Cd>BOOK</Cd></Sts>", f"line 58: {ENTRY}/Sts: '' is not a valid code"),  # 07 on
        ("<Cd>OPBD</Cd>", "<Cd>OPEN</Cd>", "line 33: /Document/BkToCstmrStmt/Stmt[1]/Bal[1]/Tp/CdOrPrtry/Cd: 'OPEN'"),
        ("<Ntry>\n        <NtryRef>01001</NtryRef>", "<Ntry>\n        <Entry/>",  # misspelt: never skipped
         f"line 55: {ENTRY}/Entry: not an element of Ntry in camt.053"),
    ],
)  # fmt: skip
def test_camt_each_field_read_is_checked_naming_line_path_and_fault(tmp_path, old, new, expected):
    """What ISO's schema would refuse in a field the reader uses is refused, never read into another figure."""
    assert expected in refused("camt053", write(tmp_path, "camt053", old, new))


CAMT_V08 = """<?xml version="1.0" encoding="UTF-8"?>
<Document xmlns="urn:iso:std:iso:20022:tech:xsd:camt.053.001.08">
  <BkToCstmrStmt>
    <GrpHdr><MsgId>M1</MsgId><CreDtTm>2026-11-01T06:00:00+01:00</CreDtTm></GrpHdr>
    <Stmt>
      <Id>S1</Id>
      <CreDtTm>2026-10-31T23:00:00+01:00</CreDtTm>
      <Acct><Id><Othr><Id>0532013000</Id></Othr></Id><Ccy>CHF</Ccy></Acct>
      <Bal><Tp><CdOrPrtry><Cd>PRCD</Cd></CdOrPrtry></Tp><Amt Ccy="CHF">12.50</Amt><CdtDbtInd>DBIT</CdtDbtInd><Dt><Dt>2026-09-30</Dt></Dt></Bal>
      <Bal><Tp><CdOrPrtry><Cd>CLBD</Cd></CdOrPrtry></Tp><Amt Ccy="CHF">87.50</Amt><CdtDbtInd>CRDT</CdtDbtInd><Dt><DtTm>2026-10-31T23:59:00+01:00</DtTm></Dt></Bal>
      <Ntry>
        <Amt Ccy="CHF">100.00</Amt><CdtDbtInd>CRDT</CdtDbtInd><Sts><Cd>BOOK</Cd></Sts>
        <BookgDt><Dt>2026-10-02</Dt></BookgDt>
        <BkTxCd><Prtry><Cd>X</Cd></Prtry></BkTxCd>
        <NtryDtls><TxDtls><Refs><EndToEndId>NOTPROVIDED</EndToEndId></Refs><Amt Ccy="CHF">100.00</Amt><CdtDbtInd>CRDT</CdtDbtInd>
          <RmtInf><Strd><CdtrRefInf><Ref>RF18539007547034</Ref></CdtrRefInf></Strd></RmtInf></TxDtls></NtryDtls>
      </Ntry>
      <Ntry>
        <Amt Ccy="CHF">999.00</Amt><CdtDbtInd>DBIT</CdtDbtInd><Sts><Cd>PDNG</Cd></Sts>
        <BkTxCd><Prtry><Cd>X</Cd></Prtry></BkTxCd>
      </Ntry>
    </Stmt>
  </BkToCstmrStmt>
</Document>
"""


def test_camt_version_08_choice_status_other_account_id_and_datetime_balances(tmp_path):
    """Version 08's status is a choice (Sts/Cd), its ids may be Othr/Id, a balance may be stamped DtTm, PRCD opens."""
    path = tmp_path / "v08.xml"
    path.write_text(CAMT_V08)
    entries = source("camt053", path=path).load(*OCTOBER)  # the pending entry (999.00) moves no balance
    assert [(str(entries.dates[0]), entries.amount(0), entries.text["reference"][0])] == [
        ("2026-10-02", Decimal("100.00"), "RF18539007547034")
    ]  # the structured reference: EndToEndId NOTPROVIDED
    assert entries.currency == "CHF" and set(entries.text["account"]) == {"0532013000"}
    balances = source("camt053", path=path, rows="balances").load(*OCTOBER)
    assert [(str(balances.dates[i]), balances.amount(i)) for i in range(2)] == [
        ("2026-09-29", Decimal("-12.50")),
        ("2026-10-31", Decimal("87.50")),
    ]


def test_mt940_malformed_files_are_refused_with_line_and_reason(tmp_path):
    # mt-940 alone reads "38.5X0" as 38 with the rest taken for the reference
    message = refused("mt940", write(tmp_path, "mt940", "D38,50NTRF", "D38.5X0NTRF"))
    assert "line 63" in message and "no transaction type" in message
    for tag in (":62F:C261031EUR32305,70", ":61:2610211021D1312,60"):  # mt-940 glues these to the text before
        message = refused("mt940", write(tmp_path, "mt940", tag, tag[1:]))
        assert "looks like a tag without its leading colon" in message and tag[1:20] in message
    message = refused("mt940", write(tmp_path, "mt940", ":62F:C261031EUR32305,70\n", ""))
    assert "line 31" in message and "has no closing balance (:62F: or :62M:)" in message
    message = refused("mt940", write(tmp_path, "mt940", "D1312,60", "Q1312,60"))
    assert "not readable as MT940" in message and "Q1312,60" in message


def test_ofx_malformed_files_are_refused_with_line_and_reason(tmp_path):
    for bad in ("NaN", "1e3"):  # ofxtools itself accepts both
        message = refused("ofx", write(tmp_path, "ofx", "<TRNAMT>-2150.00", f"<TRNAMT>{bad}"))
        assert "line 6" in message and f"TRNAMT {bad!r} is not a plain decimal amount" in message
    message = refused("ofx", write(tmp_path, "ofx", "<TRNAMT>-2150.00</TRNAMT>", ""))
    assert "does not fit the OFX specification" in message and "trnamt" in message
    path = tmp_path / "not.ofx"
    path.write_text("Date;Amount\n01.10.2026;12,00\n")
    assert "not readable as OFX" in refused("ofx", path)


def test_beancount_errors_refused_with_line_but_a_failed_assertion_is_a_balance(tmp_path):
    message = refused("beancount", write(tmp_path, "beancount", "  Expenses:Rent\n", "  Expenses:Rnet\n"))
    assert "line 20" in message and "Expenses:Rnet" in message
    message = refused(
        "beancount", write(tmp_path, "beancount", 'option "title"', 'include "other.beancount"\noption "title"')
    )
    assert "includes other files" in message
    message = refused("beancount", write(tmp_path, "beancount", 'option "title"', 'plugin "os"\noption "title"'))
    assert "loads plugins ['os']" in message
    path = tmp_path / "latin1.beancount"
    path.write_bytes((SAMPLES / FILES["beancount"]).read_text().replace("GmbH", "Gesellschaft für").encode("latin-1"))
    assert "is not UTF-8 text; Beancount files are UTF-8" in refused("beancount", path)


def test_currencies_are_never_mixed_and_an_unknown_account_is_named(tmp_path):
    path = write(tmp_path, "mt940", "EUR", "USD", count=1)  # the first statement's opening balance
    message = refused("mt940", path, rows="balances")
    assert "balances in EUR, USD" in message and "never added up" in message
    message = refused("camt053", SAMPLES / FILES["camt053"], account=OPERATING, currency="USD")
    assert "an amount in EUR, but the source's `currency` is USD" in message
    message = refused("ofx", SAMPLES / FILES["ofx"], account="DE00000000000000000000")
    assert (
        f"no entries for account 'DE00000000000000000000'; the accounts with balances are: {RESERVE}, {OPERATING}"
        in message
    )


def test_a_format_source_option_typo_names_the_nearest_key(tmp_path):
    text = (BUNDLED_DIR / "camt053.toml").read_text().replace('rows = "balances"', 'row = "balances"')
    text = text.replace('"sample-data/', f'"{SAMPLES}/')
    (tmp_path / "camt053.toml").write_text(text)
    with pytest.raises(
        ScheduleError,
        match=re.escape("field `sources.statement_balances.row`: is not a known key; the nearest known key is `rows`"),
    ):
        load_schedule(tmp_path / "camt053.toml")
    (tmp_path / "camt053.toml").write_text(text.replace('row = "balances"', 'rows = "closing"'))
    with pytest.raises(ScheduleError, match=r"rows.*'closing'; use \"entries\""):
        load_schedule(tmp_path / "camt053.toml")


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("pdftotext"), reason="pdftotext (poppler-utils) is not installed")
@pytest.mark.parametrize("review", list(BALANCE))
def test_each_format_goes_through_the_month_end_checks_to_a_pdf(review, home):
    """The checks and the report without the model (its narrative left empty): the quickest real path to a PDF."""
    from nightshift.app.review.narrative import Narrative, build_prompt
    from nightshift.app.review.runner import write_report

    schedule = load_schedules()[0][review]
    checked = run_checks_for(schedule, schedule.as_of)
    prompt = build_prompt(schedule.prompt_template, schedule.title, checked.window.label, checked.result,
                          schedule.generation.prompt_findings)  # fmt: skip
    entry = write_report(schedule, schedule.as_of, checked, prompt, Narrative(""), "none", time.monotonic())
    report = Path(entry.path)
    assert report.read_bytes().startswith(b"%PDF")
    text = " ".join(subprocess.run(["pdftotext", str(report), "-"], capture_output=True, text=True).stdout.split())
    for _, _, named in planted(review):
        assert named in text
    assert FILES[review].split("/")[-1] in text  # the provenance lists the file read


def test_a_check_over_files_stating_two_currencies_is_refused(tmp_path):
    """Neither source declares a currency; each file states its own, and a check never compares EUR with USD."""
    (tmp_path / "books.beancount").write_text((SAMPLES / FILES["beancount"]).read_text().replace(" EUR", " USD"))
    text = (BUNDLED_DIR / "beancount.toml").read_text().replace('"sample-data/camt053/', f'"{SAMPLES}/camt053/')
    (tmp_path / "mixed.toml").write_text(text.replace('"sample-data/beancount/books.beancount"', '"books.beancount"'))
    schedule = load_schedule(tmp_path / "mixed.toml")
    with pytest.raises(ReviewError, match=r"check 1 \(match\) compares bank in EUR, ledger in USD"):
        run_checks_for(schedule, schedule.as_of)


def test_qfx_in_ofx_1_sgml_with_intuit_tags_reads_as_the_xml_file(tmp_path):
    """The sample as OFX 1.02 SGML (leaf elements left open, a v1 header) with QFX's private INTU.BID."""
    text = (SAMPLES / FILES["ofx"]).read_text()
    body = re.sub(r"</(TRNTYPE|DTPOSTED|TRNAMT|FITID|REFNUM|NAME|MEMO|CODE|SEVERITY|DTSERVER|LANGUAGE|TRNUID|CURDEF"
                  r"|BANKID|ACCTID|ACCTTYPE|DTSTART|DTEND|BALAMT|DTASOF)>", "", text[text.index("<OFX>"):])  # fmt: skip
    header = ("OFXHEADER:100\nDATA:OFXSGML\nVERSION:102\nSECURITY:NONE\nENCODING:USASCII\nCHARSET:1252\n"
              "COMPRESSION:NONE\nOLDFILEUID:NONE\nNEWFILEUID:NONE\n\n")  # fmt: skip
    path = tmp_path / "statements.qfx"
    path.write_text(header + body.replace("<SONRS>", "<SONRS><INTU.BID>3000", 1))
    for rows in ("entries", "balances"):
        sgml, xml = source("ofx", path=path, rows=rows).load(*OCTOBER), source("ofx", rows=rows).load(*OCTOBER)
        assert sgml.dates.tolist() == xml.dates.tolist() and sgml.amounts.tolist() == xml.amounts.tolist()
        assert sgml.text["reference"].tolist() == xml.text["reference"].tolist()
