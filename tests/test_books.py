"""Generated books (bench/helpers/books.py): on every dataset every planted fault is found and no finding is unexplained."""

from __future__ import annotations

import pytest

from bench.helpers.books import LANGUAGES, make_books
from nightshift.app.review.runner import run_checks_for
from nightshift.app.review.schedule import load_schedule

SEEDS = range(20)


def found_and_planted(seed: int, folder, rows_per_month: int | None = None) -> tuple[list, list, str]:
    books = make_books(seed, folder, rows_per_month)
    schedule = load_schedule(books.schedule)
    result = run_checks_for(schedule, schedule.as_of).result
    assert [run.state for run in result.runs] == ["ran"] * 5, books.about
    return sorted((f.check, f.title, f.amount) for f in result.findings), sorted(books.planted), books.about


@pytest.mark.parametrize("seed", SEEDS)
def test_every_planted_fault_is_found_and_nothing_else(tmp_path, seed):
    found, planted, about = found_and_planted(seed, tmp_path)
    assert found == planted, about


def test_the_seeds_make_many_distinct_books(tmp_path):
    abouts = []
    for seed in SEEDS:
        (tmp_path / str(seed)).mkdir()
        abouts.append(make_books(seed, tmp_path / str(seed)).about)
    assert len(set(abouts)) == len(abouts)
    text = "\n".join(abouts)
    for variant in (
        "debit/credit",
        "trailing minus",
        "signed",
        "with references",
        "ledger CSV",
        "ledger SQLite (TEXT)",
        "ledger SQLite (INTEGER minor units)",
        "cp1252",
        "utf-8-sig",
        "'\\t'",
        "';'",
        "bank MT940",
        "bank OFX",
        "ledger Beancount",
        "\\u202f",
    ):
        assert variant in text, variant
    assert {about.split("(")[1][:2] for about in abouts} == set(LANGUAGES)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [8, 14])  # OFX and Beancount; MT940 and SQLite INTEGER minor units
def test_large_generated_books(tmp_path, seed):
    found, planted, about = found_and_planted(seed, tmp_path, rows_per_month=5000)
    assert found == planted, about
