"""Drive faults under a scheduled review: a damaged replica is caught and another serves, and an expert with
no readable replica fails the job with the drive and file named (in the run queue and the report index),
without hanging or writing a report."""

from __future__ import annotations

from pathlib import Path

import pytest

from nightshift.app.cli import main
from nightshift.app.daemon.runs import RunQueue
from nightshift.app.review.index import read_index
from nightshift.engine.bench.layout import replicate_everywhere
from nightshift.engine.store.manifest import read_manifest
from tests.helpers.service import user_schedule
from tests.helpers.stores import import_tiny, tiny_checkpoint


@pytest.fixture
def replicated_store(tmp_path) -> Path:
    """A tiny qwen3_moe store on two drives, every expert on both."""
    store = import_tiny(tmp_path, tiny_checkpoint(tmp_path, "qwen3_moe"), "store")
    replicate_everywhere(store)
    return store


@pytest.mark.slow
def test_a_corrupt_replica_is_named_by_verify_and_the_review_uses_the_other(home, replicated_store, capsys):
    layer = read_manifest(replicated_store).layers[-1]
    damaged = dict(read_manifest(replicated_store).replica_paths(layer.layer, 0))["d0"]
    data = bytearray(damaged.read_bytes())
    data[100] ^= 0xFF
    damaged.write_bytes(bytes(data))
    assert main(["model", "verify", str(replicated_store)]) != 0
    error = capsys.readouterr().err
    assert str(damaged) in error and "drive d0" in error and "checksum mismatch" in error
    user_schedule(home, replicated_store, "moe", max_tokens=4)
    assert main(["review", "run", "moe"]) == 0
    (run,) = RunQueue().recent()
    assert run.state == "done" and Path(run.report).is_file()


def test_an_expert_with_no_readable_replica_fails_the_job_naming_drive_and_file(home, replicated_store, capsys):
    manifest = read_manifest(replicated_store)
    layer = manifest.layers[-1]
    gone = manifest.replica_paths(layer.layer, 0)
    for _, path in gone:
        path.unlink()
    user_schedule(home, replicated_store, "moe", max_tokens=4)
    assert main(["review", "run", "moe"]) == 1
    (run,) = RunQueue().recent()
    assert run.state == "failed" and any(str(path) in run.error for _, path in gone), run.error
    assert "internal error" not in run.error
    assert main(["jobs"]) == 0
    assert "failed" in capsys.readouterr().out
    assert not (home / "reports" / "moe").exists() or not list((home / "reports" / "moe").iterdir())
    (entry,) = read_index()  # the report index records the failure and its reason too
    assert entry.failed and entry.run == run.id and entry.reason == run.error
    assert main(["reports", "list"]) == 0
    assert f"FAILED (run {run.id}" in capsys.readouterr().out
