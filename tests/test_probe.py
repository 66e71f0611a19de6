"""Direct reads, the drive probe, its stored ceilings and `nightshift drives probe`."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile

import pytest

from nightshift.app.cli import main
from nightshift.engine.errors import NoSpaceError
from nightshift.engine.io.ceilings import CEILINGS_FILE, Ceilings, CeilingsFileError
from nightshift.engine.io.counters import DriveReadCounters
from nightshift.engine.io.direct import O_DIRECT_MODE, DirectReadError, aligned_buffer, open_direct
from nightshift.engine.io.drives import Drive, format_drives
from nightshift.engine.io.probe import PROBE_FILE, probe_drive
from nightshift.engine.rig.fio import compare_with_fio

KiB, MiB = 1 << 10, 1 << 20


def test_direct_reads_return_the_file_bytes(tmp_path):
    data = os.urandom(3 * MiB + 4 * KiB)
    (tmp_path / "f").write_bytes(data)
    buffer = aligned_buffer(MiB)
    with open_direct(tmp_path / "f") as f:
        if os.uname().sysname == "Linux":
            assert f.mode == O_DIRECT_MODE
        assert f.read_into(buffer, MiB) == MiB and bytes(buffer) == data[MiB : 2 * MiB]
        assert f.read_into(buffer, 3 * MiB) == 4 * KiB and bytes(buffer[: 4 * KiB]) == data[3 * MiB :]
        with pytest.raises(DirectReadError, match="aligned offset and length"):
            f.read_into(buffer, 100)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(DirectReadError, match=re.escape(f"cannot open {tmp_path / 'nope'}")):
        open_direct(tmp_path / "nope")


def test_probe_measures_every_cell_counts_its_reads_and_cleans_up(tmp_path):
    counters = DriveReadCounters(["d"])
    ceiling = probe_drive(Drive("d", tmp_path), (4 * KiB, 64 * KiB), (1, 2), 0.05, MiB, counters)
    assert [(c.read_bytes, c.queue_depth) for c in ceiling.cells] == [(4096, 1), (4096, 2), (65536, 1), (65536, 2)]
    assert all(c.reads > 0 and c.bytes_per_s > 0 and c.p99_latency_s >= c.mean_latency_s / 10 for c in ceiling.cells)
    done = counters.snapshot()[0]
    assert done.reads == sum(c.reads for c in ceiling.cells) and done.in_flight == 0
    assert done.bytes == sum(c.reads * c.read_bytes for c in ceiling.cells)
    assert not (tmp_path / PROBE_FILE).exists()
    assert ceiling.best() in ceiling.cells and ceiling.cell(65536, 2) is ceiling.cells[3]


def test_probe_refuses_a_file_the_drive_has_no_room_for(tmp_path):
    too_big = shutil.disk_usage(tmp_path).free + MiB
    with pytest.raises(NoSpaceError, match=r"drive d .* MiB free"):
        probe_drive(Drive("d", tmp_path), file_bytes=too_big)
    assert not (tmp_path / PROBE_FILE).exists()


def test_ceilings_round_trip_and_bad_files_are_named(tmp_path):
    ceiling = probe_drive(Drive("d", tmp_path), (4 * KiB,), (1,), 0.02, MiB)
    saved = Ceilings("2026-11-29T20:00:00+00:00", "outside any rig", [ceiling])
    saved.save(tmp_path / CEILINGS_FILE)
    assert Ceilings.load(tmp_path / CEILINGS_FILE) == saved
    (tmp_path / "bad.json").write_text('{"drives": 3}')
    with pytest.raises(CeilingsFileError, match="not a drive ceilings file"):
        Ceilings.load(tmp_path / "bad.json")
    with pytest.raises(CeilingsFileError, match="run `nightshift drives probe`"):
        Ceilings.load(tmp_path / "none.json")


def test_cli_probe_prints_a_table_and_stores_it_next_to_the_drives_file(home, tmp_path, capsys):
    (tmp_path / "d0").mkdir()
    (tmp_path / "d1").mkdir()
    home.mkdir()
    (home / "drives.toml").write_text(format_drives([Drive("d0", tmp_path / "d0"), Drive("d1", tmp_path / "d1")]))
    assert main(["drives", "probe", "--sizes", "4K,1M", "--depths", "1,2", "--seconds", "0.05", "--file-mib", "2"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split("\t") == ["drive", "read", "qd1 MB/s", "qd2 MB/s", "mode"]
    assert [row.split("\t")[:2] for row in table[1:]] == [
        ["d0", "4 KiB"],
        ["d0", "1 MiB"],
        ["d1", "4 KiB"],
        ["d1", "1 MiB"],
    ]
    stored = json.loads((home / CEILINGS_FILE).read_text())
    assert [d["name"] for d in stored["drives"]] == ["d0", "d1"] and len(stored["drives"][0]["cells"]) == 4
    assert main(["drives", "show"]) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == ["drive", "d0", "d1"]


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--sizes", "4K,1000", "must be a positive multiple of 4K"),
        ("--sizes", "big", "is not a size like 256K"),
        ("--depths", "0", "must be at least 1"),
    ],
)
def test_cli_probe_names_bad_options(home, capsys, option, value, message):
    assert main(["drives", "probe", option, value]) == 1
    assert message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (Debian package `fio`)")
def test_fio_reads_the_same_file_as_the_probe(tmp_path):
    (agreement,) = compare_with_fio(Drive("d", tmp_path), [(64 * KiB, 2)], seconds=1)
    assert agreement.fio_bytes_per_s > 0 and agreement.probe_bytes_per_s > 0
    assert not (tmp_path / PROBE_FILE).exists()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs a tmpfs at /dev/shm")
def test_a_drive_without_a_block_device_is_still_probed():
    with tempfile.TemporaryDirectory(dir="/dev/shm") as root:
        ceiling = probe_drive(Drive("shm", root), (4 * KiB,), (1,), 0.02, MiB)
    assert ceiling.device.startswith("none") and ceiling.cells[0].reads > 0
