"""The run catalogue keeps every run (losses too), refuses unproven ones, compares and exports them."""

from __future__ import annotations

import csv
import io
import json

import pytest

from nightshift.engine.instruments.assertions import AssertionFailed, Proof
from nightshift.engine.instruments.catalogue import Catalogue, CatalogueError, Run, compare, fingerprint


def run(verdict: str, tok_s: float, **config) -> Run:
    return Run(
        kind="ab",
        model="m",
        config={"split_reads": False, **config},
        figures={"tokens_per_s": tok_s},
        verdict=verdict,
        counters={"split_reads": 3 if config.get("split_reads") else 0},
    )


def test_runs_are_kept_newest_first_with_fingerprints(tmp_path):
    cat = Catalogue(tmp_path / "runs.sqlite")
    a = cat.record(run("baseline", 10.0))
    b = cat.record(run("loss", 9.0, split_reads=True), [Proof("split", "split_reads")])
    assert [r.id for r in cat.runs()] == [b, a]
    assert cat.get(b).verdict == "loss"  # losses are kept
    assert cat.get(a).fingerprint == fingerprint({"split_reads": False}) != cat.get(b).fingerprint
    assert [r.id for r in Catalogue(tmp_path / "runs.sqlite").runs(kind="ab", limit=1)] == [b]  # persisted


def test_a_run_whose_setting_did_not_fire_is_refused(tmp_path):
    cat = Catalogue(tmp_path / "runs.sqlite")
    with pytest.raises(AssertionFailed, match="split: counter split_reads = 0"):
        cat.record(run("win", 12.0), [Proof("split", "split_reads")])
    assert cat.runs() == []


def test_compare_gives_ratios_and_export_round_trips(tmp_path):
    cat = Catalogue(tmp_path / "runs.sqlite")
    a, b = cat.record(run("baseline", 10.0)), cat.record(run("win", 12.5, split_reads=True))
    assert compare(cat.get(a), cat.get(b)) == [("tokens_per_s", 10.0, 12.5, 1.25)]
    exported = json.loads(cat.export("json"))
    assert [r["id"] for r in exported] == [a, b] and exported[1]["figures"] == {"tokens_per_s": 12.5}
    rows = list(csv.DictReader(io.StringIO(cat.export("csv"))))
    assert json.loads(rows[1]["config"])["split_reads"] is True
    with pytest.raises(CatalogueError, match="choose json or csv"):
        cat.export("xml")
    with pytest.raises(CatalogueError, match="no run 99"):
        cat.get(99)


def test_a_damaged_catalogue_file_is_named(tmp_path):
    path = tmp_path / "runs.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(CatalogueError, match="not a usable run catalogue"):
        Catalogue(path)
