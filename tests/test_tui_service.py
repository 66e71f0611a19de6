"""The dashboard's figures against real runs: each generation's own provenance, and the default model's
drive and the service's own reads shown with no drives.toml, checked against /proc and the reports."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nightshift.app.tui.app import Dashboard
from nightshift.app.tui.screens import LiveScreen, QueueScreen
from nightshift.engine.io.devices import resolve_device
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import open_model
from nightshift.engine.store.manifest import read_manifest
from tests.helpers.dashboard import select
from tests.helpers.service import serve, user_schedule
from tests.helpers.stores import import_tiny, tiny_checkpoint
from tests.helpers.waits import until

MiB = 1 << 20


def test_each_generation_of_a_loaded_model_reports_its_own_reads(tmp_path):
    """The service keeps a model loaded between runs: a run's bytes, cache hits and recall must be its own."""
    store = import_tiny(tmp_path, tiny_checkpoint(tmp_path, "qwen3_moe"), "store")
    cache = read_manifest(store).expert_bytes // 3  # a cache that holds a third of the experts: hits and reads
    model = open_model(store, stream=StreamSettings(cache_bytes=cache))
    try:
        runs = []
        for question in ("Close the month.", "Which postings were entered twice?"):
            before = model.stream.figures()
            *_, last = model.generate([{"role": "user", "content": question}], max_tokens=12)
            after = model.stream.figures()
            runs.append((last.stats, before, after))
    finally:
        model.close()
    for stats, before, after in runs:
        # Reads still landing (prefetch) after the last token count towards the next run, never this one.
        read = {name: after.drives[name].bytes - before.drives[name].bytes for name in after.drives}
        assert sum(stats.drive_bytes.values()) > 0 and all(stats.drive_bytes[n] <= read[n] for n in read)
        assert stats.cache_hits == after.cache_hits - before.cache_hits
        needed = after.recall_needed - before.recall_needed
        assert stats.prefetch_recall == pytest.approx((after.recall_hits - before.recall_hits) / needed)
    (first, _, _), (second, before, after) = runs
    assert sum(second.drive_bytes.values()) < after.bytes_read  # not the stream's lifetime total
    assert second.cache_hits < after.cache_hits or first.cache_hits == 0


def io_read_bytes(pid: int) -> int:
    """The process's bytes read from storage (Linux), read here independently of the dashboard."""
    text = Path(f"/proc/{pid}/io").read_text()
    return int(re.search(r"^read_bytes: (\d+)", text, re.M).group(1))


def report_bytes(report: str) -> dict[str, int]:
    """The report's "bytes read per drive", read from its PDF."""
    text = subprocess.run(["pdftotext", "-layout", report, "-"], capture_output=True, text=True, check=True).stdout
    line = next(line for line in text.splitlines() if "bytes read per drive" in line)
    return {drive: int(n.replace(",", "")) for drive, n in re.findall(r"(\w+): ([\d,]+)", line)}


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="per-process I/O counters are Linux's")
@pytest.mark.skipif(not shutil.which("pdftotext"), reason="pdftotext (poppler-utils) is not installed")
def test_with_no_drives_toml_a_review_on_the_default_model_shows_its_drive_and_its_own_reads(sparse_store, home):
    store, _ = sparse_store
    (home / "models").mkdir(parents=True)
    (home / "models" / store.name).symlink_to(store)
    user_schedule(home, store, "month", max_tokens=6)
    assert not (home / "drives.toml").exists()
    device = resolve_device(store / "experts").counters_name
    service = serve(home)

    async def drive() -> list[dict]:
        app = Dashboard()
        finished = []
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: app.service is not None and app.service.running, 60, "the service")
            panel = app.screen.query_one("DrivePanel")
            await until(pilot, lambda: device in panel.lines, 30, f"a row for {device}")
            assert f"experts of {store.name}" in panel.lines[device].figures.text
            for _ in (1, 2):
                await pilot.press("2")
                await until(pilot, lambda: isinstance(app.screen, QueueScreen), 30, "the Queue")
                await select(pilot, "#schedules", "month")
                read_before = io_read_bytes(service.pid)
                await pilot.press("n")
                await until(pilot, lambda: app.service.jobs.current is not None, 60, "the run to start")
                await pilot.press("1")
                await until(pilot, lambda: isinstance(app.screen, LiveScreen), 30, "Live")
                panel = app.screen.query_one("DrivePanel")
                ours, own = [], []

                def watched_to_its_end(ours: list = ours, own: list = own) -> bool:  # the rates shown while it lasts
                    if app.service.jobs.current is None:
                        return True
                    ours.append(app.engine_rates.get("store", 0.0))
                    own.append(app.snapshot.service_read_mb_per_s or 0.0)
                    return False

                await until(pilot, watched_to_its_end, 300, "the run to end")
                await until(pilot, lambda: app.service.jobs.runs[0].state == "done", 60, "the run to end")
                run = app.service.jobs.runs[0]
                card = app.screen.query_one("JobPanel").figures.text
                assert f"last run {run.id}" in app.screen.query_one("JobPanel").title.text and "o opens it" in card
                finished.append({"run": run, "ours": max(ours), "own": max(own),
                                 "process": io_read_bytes(service.pid) - read_before,
                                 "memory": app.screen.query_one("#memory").text})  # fmt: skip
        return finished

    try:
        first, second = asyncio.run(drive())
    finally:
        service.terminate()
        assert service.wait(timeout=60) == 0
    for run in (first, second):
        progress = run["run"].progress
        assert f"/proc/{service.pid}/io" in run["memory"]  # the service's own reads, said to be its own
        engine = sum(progress.drive_bytes.values())
        assert engine <= run["process"]  # the engine's direct reads are among the process's own
        assert report_bytes(run["run"].report) == progress.drive_bytes  # the report says this run's bytes
        if engine:  # a run that read experts (not all held in RAM since the model was opened) shows it per drive
            assert run["ours"] > 0
    assert first["own"] > 0  # the service read (opening the model) while the dashboard watched
    # Per run: with the figures summed over the service's life, the second run's bytes (the first's
    # plus its own) would exceed what the process read during it.
