"""bench/peer_fair.py's pieces that need no rig: where greedy runs part, which read-ahead applies to a model's files."""

from __future__ import annotations

import sys

import pytest

from bench.peer_fair import main, read_ahead_files
from nightshift.engine.bench.decode import first_difference


def test_first_difference_names_the_first_step_that_parts():
    assert first_difference([5, 6, 7], [5, 6, 7]) is None
    assert first_difference([5, 6, 7], [5, 6, 7, 8]) == 3  # one that ends early parts where it ends
    assert first_difference([5, 6, 7], [5, 9, 7]) == 1
    assert first_difference([1], [2]) == 0


@pytest.mark.skipif(sys.platform != "linux", reason="sysfs read-ahead is Linux's")
def test_the_read_ahead_of_a_files_device_is_found_or_refused_by_name(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    try:
        files = read_ahead_files(tmp_path)
    except SystemExit as exc:  # a file system on no block device (tmpfs, overlay): said so, with the path
        assert "no read-ahead setting" in str(exc) and str(tmp_path) in str(exc)
        return
    assert len(files) == 1 and int(files[0].read_text()) >= 0


@pytest.mark.parametrize(
    ("extra", "said"),
    [(["--auto"], "give the limits with --limits"), (["--limits", "700", "--shares", "0.1,0.25"], "one per share")],
)
def test_auto_and_given_limits_are_refused_without_one_limit_per_share(monkeypatch, tmp_path, extra, said):
    argv = ["peer_fair", str(tmp_path), "--llama", f"striped={tmp_path}", "--peer-python", sys.executable, *extra]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match=said):
        main()
