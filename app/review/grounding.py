"""Whether a model sentence says only what its finding holds: each of its content words grounded.

The gate (app/review/gate.py) judges a sentence's form: a false sentence whose figures are placed in their
roles passes it ("The bank is not only opening a new account but also closing the existing one." on a
balance that does not roll). Grounded, a sentence may use only words its finding holds (its plain sentence,
its names and descriptions, its kind's and its figures' cue words), a reviewer's words about any finding
(REVIEW_WORDS: check, confirm, missing, timing, ...) and function words; a summary sentence may use any
finding's. A word neither holds makes a claim the review cannot back, and the sentence is refused. So is a
sentence that puts a row found in one source only on the other side ("not in the bank" of a bank row the
ledger lacks: `swapped`), the one relation a finding's own words cannot rule out.

Words are compared by a crude root (`root`: "closing", "closed" and "close" are one), so a finding's
"booked" grounds "booking".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from nightshift.app.review.roles import CUES, PLACEHOLDER, WORDS


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Words that claim nothing about the books: articles, pronouns, prepositions, auxiliaries, conjunctions.
FUNCTION_WORDS = _words("""
a an the this that these those it its they them their there here we our you your he she his her i me my
and or but nor not no yes so if then than as because since while whereas although though however therefore thus
of in on at to for from by with without within into onto over under about after before between during until up
out off down across against per via upon through
is are was were be been being am has have had having do does did done can could may might must shall should
will would which who whom whose what when where why how whether all any both each either neither every some
such same other another one ones also only just still yet very too more most less least much many few own
""")
# A reviewer's words about any finding: what to do, where things stand, how sure it is.
REVIEW_WORDS = _words("""
check verify confirm investigate review reconcile reconciliation correct correction adjust adjustment fix resolve
error mistake wrong incorrect missing record booked book books entry entries post posted cleared clear
outstanding pending timing transfer paid pay payment received receive receipt deposit withdrawal fee charge
invoice customer supplier vendor match matched matching unmatched discrepancy difference differ amount amounts
figure figures date dates day days statement statements ledger bank account accounts balance balances
transaction transactions duplicate duplicated twice double identical count counted total totals need needs
require required explain explanation unexplained cause caused due source sources period month week year
opening closing movement movements expected actual show shows found appear appears seem seems likely possible
possibly probably please follow ensure make sure action issue issues finding findings high medium low
severity risk significant attention immediately promptly sign row rows value data instead once recent
later earlier late delayed delay overstated understated increase decrease rose fell change changed previous
current threshold limit exceeds above below compared side note item items list listed table report
take took taken charged add added enter entered include included remove removed refund refunded reverse
leave leaves left first last next
""")
SUFFIXES = ("ingly", "edly", "ies", "ing", "ed", "es", "ly", "s")
# "not (found) in the bank", and "is (only) in the ledger" without a not: the side a sentence puts a row on.
NOT_IN = re.compile(r"\bnot\s+(?:\w+\s+)?(?:in|within|on)\s+(?:the\s+|its\s+)?([^\W\d_]+)", re.IGNORECASE)
IS_IN = re.compile(r"\b(?:is|are|was|were|only)\s+(?:(?!not\b)\w+\s+)?(?:in|within)\s+(?:the\s+)?([^\W\d_]+)",
                   re.IGNORECASE)  # fmt: skip


def root(word: str) -> str:
    """A word's crude root: lower case, a possessive, one suffix and a final e dropped ("closing" -> "clos")."""
    word = word.lower().removesuffix("'s")
    for suffix in SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)] + ("y" if suffix == "ies" else "")
            break
    return word.removesuffix("e") if len(word) > 3 else word


def roots(texts: Iterable[str]) -> set[str]:
    """The roots of every word in `texts` (placeholders read as their roles' words: {left_amount})."""
    return {root(word) for text in texts for word in WORDS.findall(text.replace("_", " "))}


REVIEW_ROOTS = roots(REVIEW_WORDS) | roots(FUNCTION_WORDS)


def finding_roots(roles: Mapping[str, Any], plain: str, kind_words: Iterable[str] = ()) -> set[str]:
    """What a finding's sentence may say: its plain sentence, its roles and names, its kind's and figures' cues."""
    names = [value for value in roles.values() if isinstance(value, str)]
    cue_words = [word for role in roles for word in CUES.get(role, ())]
    return roots([plain, *roles, *names, *kind_words, *cue_words])


def ungrounded(sentence: str, allowed: set[str]) -> list[str]:
    """The content words of `sentence` (placeholders aside) whose root neither `allowed` nor REVIEW_ROOTS holds."""
    words = WORDS.findall(PLACEHOLDER.sub(" ", sentence))
    return [w for w in words if len(w) > 2 and root(w) not in allowed and root(w) not in REVIEW_ROOTS]


def swapped(sentence: str, sides: tuple[str, str]) -> str | None:
    """Where a sentence on a row found in one source only (`sides`: where it is, where it is not) says it is not
    in the first or is in the second: "in bank, not in ledger" said of a ledger row. The side it names, or None."""
    where, missing = ({root(word) for word in WORDS.findall(side)} for side in sides)
    for pattern, wrong in ((NOT_IN, where), (IS_IN, missing)):
        named = next((m.group(1) for m in pattern.finditer(sentence) if root(m.group(1)) in wrong), None)
        if named is not None:
            return named
    return None


def refusal(sentence: str, allowed: set[str], sides: tuple[str, str] | None = None) -> tuple[str, str] | None:
    """("ungrounded", its first such words) where `sentence` claims what its finding does not hold, else None;
    `sides`: an unmatched row's (source, other), whose sides the sentence must not swap (`swapped`)."""
    loose = list(dict.fromkeys(ungrounded(sentence, allowed)))
    if loose:
        return "ungrounded", ", ".join(loose[:3])
    side = swapped(sentence, sides) if sides is not None else None
    return ("ungrounded", f"the sides swapped ({side})") if side is not None else None
