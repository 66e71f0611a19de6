"""The gate every sentence the model writes passes before it reaches a report.

A small model loops ("of the financial statements of the financial statements"), stops mid-sentence at
its token limit, echoes its instructions ("This is a 2-3 sentence executive summary."), writes filler
that names nothing, or writes about another finding than the one it was asked about. Each answer is
split into sentences and each sentence is refused for the first of these it shows:

- cut: the answer ended at the token limit and this, its last sentence, has no end;
- not a sentence: a table row, a heading, a fragment of fewer than three words;
- loop: the same three words twice in it, or over 60 words;
- filler: words about the text itself (summary, sentence, "here is"...), or mostly the words of what
  the model was shown for it (an echo: the prompt's instructions, its list, the finding's own facts,
  which the plain sentence states better);
- repeat: mostly the words of a sentence already kept (anywhere in the narrative);
- figures: a figure not placed in its role (verify.placed: misattributed, unplaced, placeholder), or a
  broken placeholder (`{ref.`);
- no finding / other finding: a finding's sentence must name that finding (a name only it has, such as
  its reference or "Northwind", or one of its figures by placeholder) and no other; a summary sentence
  must name a finding or one of the summary's figures;
- ungrounded (only with `grounding`, a schedule's `[model] grounding`): a word that neither its finding
  nor a reviewer's vocabulary holds (app/review/grounding.py), a claim the review cannot back, or a row
  found in one source only said to be in the other.

A finding whose sentence was refused, or that got none, gets its own plain sentence (facts.j2); a summary
with none left gets its plain one. The report says how many were replaced and why.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nightshift.app.review.grounding import finding_roots, refusal
from nightshift.app.review.roles import PLACEHOLDER, WORDS, cues, stem
from nightshift.app.review.verify import TAG, placed

REASONS = {  # why a sentence was refused, as the report says it
    "cut": "cut at the token limit",
    "not a sentence": "not a sentence",
    "loop": "repeated words",
    "filler": "filler or an echo of the prompt",
    "repeat": "a repeat of an earlier sentence",
    "misattributed": "a figure in another figure's role",
    "unplaced": "a figure that is not its finding's",
    "placeholder": "a placeholder of no figure or a broken one",
    "no finding": "naming no finding",
    "other finding": "about another finding",
    "ungrounded": "words its finding does not hold",
    "empty": "no answer",
}
# A line that starts a list item, a heading, a quote or a table row: a break, where another line break is a space.
LINE_START = re.compile(r"\n(?=\s*(?:#|[-*\u2022>|]|\(?[a-zA-Z0-9]\)\s|\d+\.\s|\**F\d+\**\s*[:.)-]))|\n\s*\n")
MARKUP = re.compile(
    r"\*\*|__|`|^\s*(?:(?:#+|[-*\u2022>]|\(?[a-zA-Z0-9]\)|\d+\.)\s+|\**F\d+\**\s*[:.)-]\s*)", re.MULTILINE
)
SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n+")
META = re.compile(
    r"\b(?:summary|summari[sz]e|sentences?|paragraphs?|bullet|as an ai|language model|i hope|i am|i'm|i will|"
    r"let me|here is|here are|here's|sure|certainly|of course|in conclusion|please note|note that|feel free)\b",
    re.IGNORECASE,
)
WORD = re.compile(r"[^\W_]+|\{[a-z_]+\}", re.IGNORECASE)
MOST = 0.6  # share of a sentence's word triples in sentences kept before that makes it a repeat
ECHO = 0.5  # share of its word triples in what the model was shown that makes it an echo
LONGEST = 60  # words: a longer sentence is a run-on


@dataclass(frozen=True)
class Answer:
    """What the model wrote for one part of the narrative: the summary (`finding` None) or finding n's line."""

    text: str
    finding: int | None
    cut: bool = False  # it ended at the token limit


@dataclass(frozen=True)
class Sentence:
    """A sentence as the report prints it: figures as placeholders, filled from `roles` when shown."""

    text: str
    plain: bool  # the template's own (the model's was refused, or it wrote none)


@dataclass(frozen=True)
class Refusal:
    """A sentence of the model's kept out of the report, and why."""

    finding: int | None
    text: str
    reason: str
    detail: str = ""


@dataclass
class Gated:
    """The narrative as the report shows it: the summary's sentences, each finding's, and what was refused."""

    summary: list[Sentence] = field(default_factory=list)
    lines: dict[int, list[Sentence]] = field(default_factory=dict)  # finding number -> its sentences
    refused: list[Refusal] = field(default_factory=list)
    written: int = 0  # sentences the model wrote

    @property
    def kept(self) -> int:
        return self.written - sum(r.reason != "empty" for r in self.refused)

    @property
    def reasons(self) -> list[tuple[str, int]]:
        """(reason in words, count), most frequent first."""
        return [(REASONS[reason], n) for reason, n in Counter(r.reason for r in self.refused).most_common()]


@dataclass
class Subject:
    """What a part of the narrative may talk about: its figures' roles, its plain sentence, its own names."""

    roles: Mapping[str, Any]
    plain: str  # placeholders for figures
    names: set[str] = field(default_factory=set)  # word stems only it has among the review's findings
    kind: str = ""  # its figures' kind: words of the kind name it too (KIND_WORDS)

    @property
    def placeholders(self) -> set[str]:
        """Its figures' placeholders that say which finding a sentence is about (not a source's name, say)."""
        return {f"{{{role}}}" for role in self.roles if role not in SHARED_ROLES}


def subjects(figures: list[tuple[str, Mapping[str, Any]]], plains: list[str]) -> list[Subject]:
    """Each finding's subject from its figures' (kind, roles): the names it alone has among the review's
    findings (a reference, "Northwind")."""
    common = {stem(word) for word in COMMON}
    words = [_name_words(roles) - common for _, roles in figures]
    counts = Counter(word for own in words for word in own)
    return [Subject(roles, plain, {w for w in own if counts[w] == 1}, kind)
            for (kind, roles), plain, own in zip(figures, plains, words, strict=True)]  # fmt: skip


def _name_words(roles: Mapping[str, Any]) -> set[str]:
    names = " ".join(value for role, value in roles.items() if isinstance(value, str) and role not in SHARED_ROLES)
    return {stem(word) for word in WORDS.findall(names) if len(word) >= 3} | {
        value.lower() for value in roles.values() if isinstance(value, str) and re.search(r"\d", value)
    }


# Roles every finding of a kind shares (so they name no one finding), and words that name none.
SHARED_ROLES = frozenset({"left", "right", "source", "other", "by", "period", "previous", "days", "check"})
COMMON = frozenset({
    "bank", "ledger", "balance", "statement", "amount", "total", "account", "payment", "entry", "entries", "row", "rows",
    "booked", "posted", "posting", "found", "differ", "difference", "identical", "counted", "twice", "opening",
    "closing", "movements", "change", "issue", "finding", "check", "review", "period", "month", "week", "the", "and",
    "for", "with", "from", "that", "this", "not", "has", "have", "been", "were", "which", "their", "there", "should",
})  # fmt: skip
# Words that say what kind of finding a sentence is about: enough to name its own (the line is its finding's).
KIND_WORDS = {
    "unmatched": ("missing", "counterpart", "unmatched", "booked", "recorded", "cleared", "outstanding"),
    "differs": ("differ", "differs", "difference", "discrepancy", "mismatch"),
    "duplicates": ("duplicate", "duplicated", "twice", "identical", "double"),
    "totals": ("totals", "differ", "difference"),
    "balance": ("balance", "opening", "closing", "roll"),
    "variance": ("change", "changed", "rose", "fell", "increase", "decrease", "jump"),
    "more": ("listed", "more"),
    "not_run": ("run", "ran"),
}


class Gate:
    """Gates one review's answers: `subjects[n - 1]` is finding n's, `summary` the summary's."""

    def __init__(self, subjects: list[Subject], summary: Subject, asked: Callable[[int | None], str],
                 grounding: bool = False):  # fmt: skip
        """`asked(finding)`: what the model was shown when it wrote about `finding` (None: the summary), which a
        sentence must not echo. `grounding`: refuse a sentence with a word its finding does not hold."""
        self.subjects, self.summary, self.asked = subjects, summary, asked
        self.cues = [cues(subject.roles) for subject in subjects]
        self.summary_cues = cues(summary.roles)
        self.seen: set[tuple[str, ...]] = set()
        self.grounding = grounding
        self.grounds = [finding_roots(s.roles, s.plain, KIND_WORDS.get(s.kind, ())) for s in subjects]
        self.summary_grounds = finding_roots(summary.roles, summary.plain).union(*self.grounds)
        self.sides = [(s.roles["source"], s.roles["other"]) if s.kind == "unmatched" else None for s in subjects]

    def grounds_of(self, finding: int | None) -> set[str]:
        """The word roots a sentence on `finding` (None: the summary) may use (app/review/grounding.py)."""
        return self.summary_grounds if finding is None else self.grounds[finding - 1]

    def gate(self, answers: list[Answer], findings_shown: Iterable[int]) -> Gated:
        """The narrative from `answers`: every finding in `findings_shown` gets a line (its own plain sentence
        where the model's were refused or missing)."""
        out = Gated()
        for answer in answers:
            refused = len(out.refused)
            kept = self._sentences(answer, out)
            if answer.finding is None:
                out.summary.extend(kept)
                continue
            if not kept and len(out.refused) == refused:
                out.refused.append(Refusal(answer.finding, answer.text, "empty"))
            plain = [Sentence(self.subjects[answer.finding - 1].plain, True)] if len(out.refused) > refused else []
            out.lines.setdefault(answer.finding, []).extend(plain + kept)
        for number in findings_shown:
            if not out.lines.get(number):
                out.lines[number] = [Sentence(self.subjects[number - 1].plain, True)]
        if not out.summary:
            out.summary.append(Sentence(self.summary.plain, True))
        out.lines = dict(sorted(out.lines.items()))
        return out

    def _sentences(self, answer: Answer, out: Gated) -> list[Sentence]:
        lines = LINE_START.sub("\n\n", answer.text).split("\n\n")
        text = "\n".join(" ".join(line.split()) for line in lines)
        pieces = [piece.strip() for piece in SENTENCE_END.split(MARKUP.sub("", text)) if piece.strip()]
        shown = _triples(self.asked(answer.finding))
        kept = []
        for at, piece in enumerate(pieces):
            out.written += 1
            cut = answer.cut and at == len(pieces) - 1 and not re.search(r"[.!?][\"')\]]*$", piece)
            problem = ("cut", "") if cut else self._problem(piece, answer.finding, shown)
            if isinstance(problem, tuple):
                out.refused.append(Refusal(answer.finding, piece, *problem))
                continue
            self.seen |= _triples(problem)
            kept.append(Sentence(problem if re.search(r"[.!?]$", problem) else problem + ".", False))
        return kept

    def _problem(self, sentence: str, finding: int | None, shown: set[tuple[str, ...]]) -> tuple[str, str] | str:
        """Why `sentence` is refused (reason, detail), or the sentence with its figures as placeholders;
        `shown`: the word triples of what the model was shown."""
        words = [word.lower() for word in WORD.findall(sentence)]
        triples = _triples(sentence)
        if len(words) < 3 or sentence.count("|") >= 2:
            return "not a sentence", ""
        if re.search(r"[{}\[\]]", PLACEHOLDER.sub("", sentence)):
            return "placeholder", "a broken placeholder"
        if len(triples) < len(words) - 2 or len(words) > LONGEST:
            return "loop", ""
        if META.search(sentence):
            return "filler", ""
        if triples and len(triples & shown) >= ECHO * len(triples):
            return "filler", "an echo of the prompt"
        if triples and len(triples & self.seen) >= MOST * len(triples):
            return "repeat", ""
        subject = self.summary if finding is None else self.subjects[finding - 1]
        cue_words = self.summary_cues if finding is None else self.cues[finding - 1]
        text, problem = placed(sentence, subject.roles, cue_words, len(self.subjects))
        if problem is not None:
            return problem.reason, problem.detail
        sides = None if finding is None else self.sides[finding - 1]
        grounded = refusal(text, self.grounds_of(finding), sides) if self.grounding else None
        return self._naming(text, finding) or grounded or text

    def _naming(self, text: str, finding: int | None) -> tuple[str, str] | None:
        """Why `text` names no finding or another than its own (a summary sentence: none at all), or None."""
        present = {stem(w) for w in WORDS.findall(text)}
        holders = {m.group() for m in PLACEHOLDER.finditer(text)}
        tags = {int(m.group(1)) for m in (TAG.match(w) for w in re.findall(r"\bF\d+\b", text)) if m}
        named = {n for n, subject in enumerate(self.subjects, 1) if subject.names & present} | tags
        own = self.summary if finding is None else self.subjects[finding - 1]
        if finding is None:
            return None if named or own.placeholders & holders else ("no finding", "")
        if named - {finding}:
            return "other finding", f"names F{min(named - {finding})}"
        kind = {stem(word) for word in KIND_WORDS.get(own.kind, ())}
        return None if finding in named or own.placeholders & holders or kind & present else ("no finding", "")


def _triples(text: str) -> set[tuple[str, ...]]:
    words = [word.lower() for word in WORD.findall(text)]
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}
