"""The adversarial narrative bank: hand-written narratives about the bundled month-end review, each number in
them right or wrong on purpose. A wrong one refuses its sentence (verify.placed); a right one is rebuilt as its
role's placeholder, so the report prints the finding's own figure. Since [19] "right" means the right figure in
the right role of what the line is about: an F<n> line states finding n's figures, the summary only its own
(how many findings, how many high, the period).

The month-end findings of the sample data, as the model is given them (most severe first):
  F1 In ledger, not in bank: INV-5010  1,918.40 (30 Oct)     F5 Amount differs for INV-5004: -45.00
  F2 2 identical rows in ledger: INV-5010  1,918.40              (ledger 1,250.00 on 27 Oct, bank 1,205.00 on 28 Oct)
  F3 In bank, not in ledger: DD-77120 (Northwind Insurance)  F6 Travel: up 261% (-640.00 -> -2,310.00, -1,670.00)
     -1,480.00 (9 Oct)                                       F7 In ledger, not in bank: CHQ-1042  -830.00 (28 Oct)
  F4 Bank balance: opening 119,857.25 + movements 56,618.21  F8 In bank, not in ledger: BANK CHARGES OCT  -45.00
     = 176,475.46, closing 176,575.46: -100.00                  (30 Oct)
"""

from __future__ import annotations

import re
from datetime import date
from decimal import Decimal

import pytest

from nightshift.app.review.checks import Figures
from nightshift.app.review.narrative import by_severity
from nightshift.app.review.roles import PLACEHOLDER, cues, written
from nightshift.app.review.verify import _tokens, matches, placed

# (narrative, the numbers in it that are wrong); every other number in it is right.
BANK = [
    # right: each finding's own figures, in the forms people write them
    ("F3: The Northwind Insurance direct debit of 1,480.00 was never booked.", []),
    ("F8: Bank charges of 45.00 on 30 October 2026 are not in the ledger.", []),
    ("F4: Closing balance 176,575.46 is 100.00 above opening 119,857.25 plus movements 56,618.21.", []),
    ("F6: Travel rose from 640.00 to 2,310.00, up 261%.", []),
    ("F2: Two identical rows of 1,918.40 for INV-5010.", []),
    ("F5: INV-5004 is 1,250.00 in the ledger and 1,205.00 in the bank, a difference of -45.00.", []),
    ("F7: Cheque CHQ-1042 for 830.00 has not cleared.", []),
    ("October 2026 has 8 findings, 5 of them high.", []),
    ("F6: Travel is up 260.9% on September 2026.", []),
    ("F1: INV-5010, 1,918.40, on 2026-10-30 has no bank line within 3 days.", []),
    ("F3: \u22121,480.00 left the bank on 9 October.", []),
    ("F6: Travel doubled to 2,310.", []),
    ("F8: Charges of forty-five were taken.", []),
    ("F3: 1.480,00 was debited.", []),
    ("F4: A difference of 100.", []),
    ("F3: The debit of 1480.00 on Oct 9.", []),
    ("F6: Travel changed by -1,670.00.", []),
    ("F5: INV-5004 on 28 October 2026 against 27 October 2026.", []),
    ("F2: INV-5010 was posted twice, so 1,918.40 is counted twice.", []),
    ("F1: See also F2.", []),
    ("F3: EUR -1,480.00 on 09.10.2026.", []),
    # another finding's amount
    ("F8: Bank charges of 1,480.00 were not booked.", ["1,480.00"]),
    ("Bank charges of 1,480.00 were not booked.", ["1,480.00"]),
    ("A bank charge of 1,480.00 was not booked.", ["1,480.00"]),
    ("The travel increase of 1,480.00 needs approval.", ["1,480.00"]),
    ("Insurance of 45.00 was debited and bank charges of 1,480.00 were taken.", ["45.00", "1,480.00"]),
    ("F7: The cheque of 1,918.40 has not cleared.", ["1,918.40"]),
    ("F6: from 460.00 to 2,310.00", ["460.00"]),
    # flipped sign
    ("F4: The balance is off by +100.00.", ["+100.00"]),
    ("F3: A debit of +1,480.00 is missing.", ["+1,480.00"]),
    ("Travel changed by +1,670.00.", ["+1,670.00"]),
    ("F6: Travel -261%.", ["-261%"]),
    ("The balance is off by -1,000.00.", ["-1,000.00"]),
    ("F1: INV-5010 (1,918.40) has no bank line.", ["(1,918.40)"]),  # accounting brackets: a negative amount
    # rounding
    ("F2: Two identical rows of 1,918 each.", ["1,918"]),
    ("F4: Off by 100.50.", ["100.50"]),
    ("F6: Travel up 262%.", ["262%"]),
    ("F6: Travel is up 260%.", ["260%"]),
    # swapped digits
    ("F5: A difference of 54.00.", ["54.00"]),
    ("F7: Cheque for 803.00 not cleared.", ["803.00"]),
    ("F6: Travel rose 216%.", ["216%"]),
    ("F4: The closing balance is 176,575.64.", ["176,575.64"]),
    # a percentage as an amount, an amount as a percentage
    ("F6: Travel is up 261.00.", ["261.00"]),
    ("F8: Charges are 45% of the total.", ["45%"]),
    ("F5: a 45.00 difference, which is 3.7% of the invoice.", ["3.7%"]),
    ("Sales are down 18%.", ["18%"]),
    # numbers in words
    ("F2: Three identical rows.", ["Three"]),
    ("F3: One thousand four hundred and eight was debited.", ["One thousand four hundred and eight"]),
    ("F8: Charges of fifty-four were taken.", ["fifty-four"]),
    # small integers
    ("F2: 3 identical rows.", ["3"]),
    ("There are 7 findings.", ["7"]),
    ("About 12 transactions are affected.", ["12"]),
    ("The ledger has 86 rows.", ["86"]),
    # references, tags, dates
    ("F1: INV-5011 has no bank line.", ["INV-5011"]),
    ("F9: Something of 45.00.", ["45.00"]),
    ("F8: Booked on 31 October 2026.", ["31 October 2026"]),
    ("F3: Debited on 2026-10-19.", ["2026-10-19"]),
    ("F1: Posted on 30.11.2026.", ["30.11.2026"]),
    ("F1: 1,918.40 on 29 October.", ["29 October"]),
    ("Travel went up in November 2026.", ["November 2026"]),
    # invented figures
    ("About 7,777 is at risk.", ["7,777"]),
    ("F4: Movements were 56,681.21.", ["56,681.21"]),
]


# Right figures the contract refuses since [19]: the summary states only its own figures (a finding's amount
# belongs in that finding's line), and a figure after a source's name is that source's (the bank shows 1,205.00).
STRICTER = [
    ("The bank shows 1,480.00 not in the ledger and the balance is off by 100.00.", "unplaced"),
    ("F5: The bank is (45.00) short.", "misattributed"),
    ("Sales are down 8% and Purchases up 7%.", "unplaced"),
    ("The ledger has 68 rows in October 2026, 65 matched.", "unplaced"),
    ("We expected 1,480.00 for insurance but the charges were 45.00.", "unplaced"),
    ("Travel went from 640.00 to 2,310.00.", "unplaced"),
    ("The insurance debits of 1,480.00 and the charge of 45.00 are missing.", "unplaced"),
    # a figure in another figure's role (issue [19]'s outside test found these marked "verified")
    ("F5: The bank shows 1,250.00 for INV-5004.", "misattributed"),
    ("F4: The discrepancy is 176,475.46.", "misattributed"),
    ("F6: Travel rose above the threshold of 261%.", "misattributed"),
    ("F4: The opening balance is 176,575.46.", "misattributed"),
]


def checked(findings: list, narrative: str) -> tuple[str, dict, str | None]:
    """The sentence rebuilt against what it is about (an F<n> line: finding n; else the summary), its roles, and
    why it was refused."""
    tag = re.match(r"F(\d+): ", narrative)
    summary = {"findings": len(findings), **by_severity(findings)}
    roles = {"period": "October 2026", "previous": "September 2026",
             **(findings[int(tag.group(1)) - 1].figures.roles if tag and int(tag.group(1)) <= len(findings)
                else summary)}  # fmt: skip
    text, problem = placed(narrative[tag.end() :] if tag else narrative, roles, cues(roles), len(findings))
    return text, roles, None if problem is None else problem.reason


def test_the_bank_is_large_enough_and_covers_each_kind_of_wrong_number():
    assert len(BANK) >= 40 and sum(bool(wrong) for _, wrong in BANK) >= 30


@pytest.mark.parametrize(("narrative", "wrong"), BANK, ids=[text[:40] for text, _ in BANK])
def test_every_wrong_number_refuses_its_sentence_and_every_right_one_is_its_role(month_end, narrative, wrong):
    findings = month_end[1].result.findings
    assert any(t.kind != "words" or t.value is not None for t in _tokens(narrative)), "it states no number"
    text, roles, reason = checked(findings, narrative)
    if wrong:
        assert reason in ("unplaced", "misattributed"), text
        return
    assert reason is None, text
    assert not re.search(r"\d", re.sub(r"\bF\d\b", "", PLACEHOLDER.sub("", text)))  # no digit of the model's left
    written_numbers = [t for t in _tokens(narrative[3:] if narrative[:1] == "F" else narrative) if t.kind != "other"]
    placed_roles = [m.group(1) for m in PLACEHOLDER.finditer(text)]
    for token, role in zip(written_numbers, placed_roles):  # each figure stands for the role whose value it is
        assert matches(token, roles[role]) or token.text.upper().startswith("F"), (token.text, role)


@pytest.mark.parametrize(("narrative", "reason"), STRICTER, ids=[text[:40] for text, _ in STRICTER])
def test_a_figure_outside_its_line_or_role_is_refused(month_end, narrative, reason):
    assert checked(month_end[1].result.findings, narrative)[2] == reason


def test_a_written_sign_must_be_the_findings_own():
    """'-100.00' passed for +100.00 (issue 17): a signed number states only a figure of that sign."""
    roles = Figures("balance", {"account": "Bank", "difference": Decimal("100.00"),
                                "closing_date": date(2026, 10, 31)}).roles  # fmt: skip
    for text in ("off by -100.00", "The balance is off by -100.00.", "off by (100.00)"):
        assert placed(text, roles, cues(roles))[1] is not None, text
    text, problem = placed("off by 100.00, +100.00 in all", roles, cues(roles))
    assert problem is None and text == "off by {difference}, {difference} in all"
    assert written(roles["difference"]) == "100.00"
