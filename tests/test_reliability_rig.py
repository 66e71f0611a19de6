"""Drive faults on the rig's real disks while the streaming engine generates: a drive whose bandwidth is cut
to almost nothing mid-generation is routed around, and a disk that fails reads (EIO) is read around from
replicas or named with drive and file (root, loop devices, blkio; skipped elsewhere)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bench.helpers.reference import greedy_tokens
from nightshift.engine.bench.layout import replicate_everywhere
from nightshift.engine.io.drives import load_drives
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.reads import ExpertReadError
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.rig.drives import RigSpec, RigState, inside_rig, rig_up
from nightshift.engine.store.importer import import_checkpoint
from nightshift.engine.store.loader import load_store
from tests.helpers.rig import requires_rig
from tests.helpers.stores import tiny_checkpoint
from tests.helpers.waits import wait_for

pytestmark = [pytest.mark.rig, requires_rig, pytest.mark.slow]
STALLED_BPS = 65536  # 64 kB/s, 1/3000 of its healthy rate: a drive that has all but stopped


def replicated_on_rig(rig_place, tmp_path: Path, tokens: int) -> tuple[RigState, Path, list[int]]:
    """A two-disk rig, a tiny qwen3_moe store with every expert on both, and its greedy tokens held in RAM."""
    state = rig_up(
        rig_place.rig_dir, RigSpec(count=2, size_bytes=64 << 20, read_bps=200_000_000), rig_place.drives_file
    )
    store = tmp_path / "store"
    import_checkpoint(tiny_checkpoint(tmp_path, "qwen3_moe"), store, load_drives(rig_place.drives_file))
    replicate_everywhere(store)
    return state, store, greedy_tokens(load_store(store)[0], tokens)


def test_a_drive_stalled_mid_generation_is_routed_around(rig_place, tmp_path):
    state, store, expected = replicated_on_rig(rig_place, tmp_path, 24)
    stalled, healthy = state.drives
    at_cut: dict[str, int] = {}
    with inside_rig(state):
        model, _, stream = load_streaming(store, StreamSettings(cache_bytes=0))

        def bytes_read() -> dict[str, int]:
            return {name: figures.bytes for name, figures in stream.figures().drives.items()}

        def stall_when_reading() -> None:
            wait_for(lambda: bytes_read()[stalled.name] > 0, 300, "a read on the drive to stall", 0.001)
            state.throttle().limit_reads(stalled.major, stalled.minor, STALLED_BPS)
            at_cut.update(bytes_read())

        cutter = threading.Thread(target=stall_when_reading, daemon=True)
        cutter.start()
        try:
            started = time.monotonic()
            tokens = greedy_tokens(model, 24)
            seconds = time.monotonic() - started
            at_end = bytes_read()
        finally:
            stream.close()
    cutter.join(timeout=5)
    assert at_cut, "the generation ended before the drive was stalled"
    after = {name: at_end[name] - at_cut[name] for name in at_end}
    print(f"stalled {stalled.name} at {at_cut}; bytes after the cut {after}; 24 tokens in {seconds:.1f} s")
    assert tokens == expected
    assert after[healthy.name] > 0 and after[stalled.name] * 4 < after[healthy.name]


def test_a_real_io_error_falls_back_to_replicas_or_stops_naming_drive_and_file(rig_place, tmp_path):
    state, store, expected = replicated_on_rig(rig_place, tmp_path, 8)
    broken = state.drives[0]
    # The disk loses all but its first MiB under the mounted file system: reads past it fail with EIO.
    os.truncate(broken.image, 1 << 20)
    subprocess.run(["losetup", "-c", broken.loop], check=True)
    with inside_rig(state):
        # Checked once per file, as `generate` and reviews load a store: this cut-short disk fails whole reads with
        # EIO but returns wrong bytes, with no error, for some part reads (8 KiB at 0, 40 KiB at 8 KiB of a file
        # whose whole read fails), and balanced reads may take a part from it; only the checksum sees those.
        settings = StreamSettings(dispatch="first_replica", verify_checksums="first")
        model, _, stream = load_streaming(store, settings)
        try:
            assert greedy_tokens(model, 8) == expected  # every expert read again from the other disk
            assert stream.figures().reads.fallbacks > 0
        finally:
            stream.close()
        model, _, stream = load_streaming(store, StreamSettings(use_drives=(broken.name,)))
        try:
            with pytest.raises(ExpertReadError) as caught:
                greedy_tokens(model, 8)
        finally:
            stream.close()
    message = str(caught.value)
    assert f"drive {broken.name}" in message and broken.mount in message, message
