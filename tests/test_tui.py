"""The dashboard driven with the Pilot against a real service (its own process) running a tiny real model.

Every screen is exercised as a user would: keys, the queue's actions (run now,
cancel with confirmation, pause/resume), the reports list opening a PDF, the
runs and help screens, starting the scheduler in-process, and drive rates from
a real drives.toml while the drive is read.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from nightshift.app.daemon.lock import InstanceLock, ServiceRunningError
from nightshift.app.paths import catalogue_file
from nightshift.app.tui.app import Dashboard
from nightshift.app.tui.screens import ConfirmScreen, HelpScreen, LiveScreen, QueueScreen, ReportsScreen, RunsScreen
from nightshift.app.tui.widgets.keys import KeyBar
from nightshift.app.viewer import VIEWER_VARIABLE
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.io.ceilings import Ceilings, DriveCeiling, ProbeCell
from nightshift.engine.io.direct import aligned_buffer, open_direct
from nightshift.engine.io.drives import Drive, format_drives
from tests.helpers.dashboard import cells, select, text
from tests.helpers.service import serve, user_schedule
from tests.helpers.waits import until

MiB = 1 << 20


def run_state(app: Dashboard, review: str) -> str | None:
    runs = [run for run in (app.service.jobs.runs if app.service else []) if run.review == review]
    return runs[0].state if runs else None


@pytest.fixture
def endless_model(tiny_model, tmp_path) -> Path:
    """The tiny model with an end-of-text token it cannot produce, so a run lasts until cancelled.

    (The random tiny model may otherwise pick its end token within a few steps.)
    """
    model = Path(shutil.copytree(tiny_model, tmp_path / "endless"))
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|not-in-the-vocabulary|>"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


@pytest.mark.slow
def test_every_screen_against_a_running_service(home, tiny_model, endless_model, tmp_path, monkeypatch):
    user_schedule(home, endless_model, "long", max_tokens=7000)  # runs until cancelled
    user_schedule(home, tiny_model, "short", max_tokens=4)
    opened = tmp_path / "opened.txt"
    viewer = f"{sys.executable} -c \"import pathlib, sys; pathlib.Path(r'{opened}').write_text(sys.argv[1])\""
    monkeypatch.setenv(VIEWER_VARIABLE, viewer)
    service = serve(home)

    async def drive() -> None:
        app = Dashboard()
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.service is not None and app.service.running, 30, "the service")
            await until(pilot, lambda: isinstance(app.screen, LiveScreen), 30, "the LiveScreen")
            assert f"pid {service.pid}" in text(app, "#banner")
            assert text(app, "#memory").startswith("service ") and "service — " not in text(app, "#memory")
            assert "reads" in text(app, "#memory")  # the service's own read rate

            # Queue: the schedules (bundled and the user's) with their next run; run the long one now.
            await pilot.press("2")
            await until(pilot, lambda: isinstance(app.screen, QueueScreen), 30, "the QueueScreen")
            await until(
                pilot, lambda: {"long", "short", "month-end"} <= {row[0] for row in cells(app, "#schedules")}, 30
            )
            assert all(row[1] not in ("—", "paused") for row in cells(app, "#schedules"))
            await select(pilot, "#schedules", "long")
            await pilot.press("n")
            await until(pilot, lambda: run_state(app, "long") == "running", 60, "the run to start")

            # Live: the running job with its figures, text and a tokens/s history.
            await pilot.press("1")
            await until(pilot, lambda: len(app.tokens_history) >= 2, 60, "two progress records")
            assert text(app, "#job .title").startswith("run 1: long (manual")
            figures = app.screen.query_one("JobPanel").figures.text
            assert "/7000" in figures and "tok/s" in figures and "ETA" in figures and "max_tokens 7000" in figures
            assert app.screen.query_one("JobPanel").text.text == app.service.jobs.current.progress.text

            # Cancel asks first: "no" keeps it running, "yes" ends it.
            await pilot.press("2")
            await until(pilot, lambda: isinstance(app.screen, QueueScreen), 30, "the QueueScreen")
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, "the ConfirmScreen")
            await pilot.press("n")
            await until(pilot, lambda: isinstance(app.screen, QueueScreen), 30, "the QueueScreen")
            said_no = app.service
            await until(pilot, lambda: app.service is not said_no, 30, "the queue read after the answer")
            assert run_state(app, "long") == "running" and app.service.jobs.cancelling is None
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, "the ConfirmScreen")
            await pilot.press("y")
            await until(pilot, lambda: run_state(app, "long") == "interrupted", 60, "the cancel")
            assert cells(app, "#runs")[0][:3] == ["1", "interrupted", "long"]
            assert any("run 1 (long) interrupted" in n.message for n in app._notifications)  # the end is announced

            # Pause and resume a schedule.
            await select(pilot, "#schedules", "short")
            await pilot.press("p")
            await until(pilot, lambda: app.service.jobs.next_runs.get("short") is None, 30, "the pause")
            await until(pilot, lambda: ["short", "paused"] in cells(app, "#schedules"), 30)
            await pilot.press("p")
            await until(pilot, lambda: app.service.jobs.next_runs.get("short") is not None, 30, "the resume")

            # A short run writes a report; the Reports screen lists it and opens it in the viewer.
            await pilot.press("n")
            await until(pilot, lambda: run_state(app, "short") == "done", 120, "the short run")
            await pilot.press("3")
            await until(pilot, lambda: isinstance(app.screen, ReportsScreen), 30, "the ReportsScreen")
            await until(pilot, lambda: len(cells(app, "#reports")) == 1, 30)
            report = app.service.reports[0]
            assert cells(app, "#reports")[0][1:2] + cells(app, "#reports")[0][3:] == [
                str(report.run), "short", report.period, str(report.findings), "ok"]  # fmt: skip
            assert f"{report.findings} findings" in text(app, "#summary") and report.path in text(app, "#summary")
            await pilot.press("o")
            await until(pilot, lambda: opened.exists() and opened.read_text() == report.path, 30, "the viewer")

            # Runs: nothing benchmarked in this data dir yet, and it says so; help lists this screen's keys too.
            await pilot.press("4")
            await until(pilot, lambda: isinstance(app.screen, RunsScreen), 30, "the RunsScreen")
            await until(pilot, lambda: "no benchmark runs recorded yet" in text(app, "#compare"), 30)
            await pilot.press("2")
            await until(pilot, lambda: isinstance(app.screen, QueueScreen), 30, "the QueueScreen")
            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen), 30, "the HelpScreen")
            assert "Pause/resume" in str(app.screen.query_one("#keys").render())
            assert "Open PDF" in str(app.screen.query_one("#keys").render())  # every screen's keys
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, QueueScreen), 30, "the QueueScreen")

    try:
        asyncio.run(drive())
    finally:
        service.terminate()
        assert service.wait(timeout=60) == 0


@pytest.mark.slow
def test_without_a_service_it_offers_to_start_the_scheduler_under_the_same_lock(home):
    async def drive() -> None:
        app = Dashboard()
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.service is not None, 30, "the first refresh")
            assert "no service running" in text(app, "#banner") and "s starts the scheduler" in text(app, "#banner")
            await pilot.press("2")
            await until(pilot, lambda: app.screen.query(KeyBar) and app.screen.query_one(KeyBar).offered, 30, "keys")
            offered = app.screen.query_one(KeyBar).offered
            assert "s" in offered and "n" not in offered and "p" not in offered  # n, p need a service to ask
            await pilot.press("n")  # does nothing, as the bar says
            await pilot.press("s")
            await until(pilot, lambda: app.service.running, 30, "the in-process scheduler")
            assert "in this dashboard" in text(app, "#banner")
            with pytest.raises(ServiceRunningError):
                InstanceLock().acquire()  # a second dashboard or `nightshift serve` cannot run jobs too
            await until(pilot, lambda: "s" not in app.screen.query_one(KeyBar).offered, 30, "s to leave the keys")
            await pilot.press("s")  # a second start does nothing: the key is not offered
            await pilot.pause()  # the key handled, before the next frame
        assert app.own_service is not None and not (home / "nightshift.sock").exists()

    asyncio.run(drive())
    lock = InstanceLock()
    lock.acquire()  # released when the dashboard quit
    lock.release()


def test_drive_rows_follow_drives_toml_live_and_show_reads_against_the_probed_ceiling(home, tmp_path):
    root = tmp_path / "drive"
    root.mkdir()
    home.mkdir(parents=True, exist_ok=True)
    cell = ProbeCell(MiB, 4, 100, 1.0, 400e6, 0.001, 0.002)
    Ceilings("2026-11-29T20:00:00+00:00", "test", [DriveCeiling("disk0", str(root), "x", "direct", [cell])]).save(
        home / "drive_ceilings.json"
    )
    data = root / "data.bin"
    data.write_bytes(os.urandom(32 * MiB))

    async def drive() -> None:
        app = Dashboard()
        async with app.run_test(size=(80, 24)) as pilot:
            note = lambda: app.screen.query_one("DrivePanel").note  # noqa: E731
            await until(pilot, lambda: "no drives.toml" in note().text and note().display, 30, "what to do")
            assert "import a model" in note().text and "write drives.toml" in note().text
            (home / "drives.toml").write_text(format_drives([Drive("disk0", root)]))  # noticed without a restart
            await until(pilot, lambda: "disk0" in app.drive_histories, 30, "the new drive's rates")
            before = len(app.drive_histories["disk0"])
            with open_direct(data) as f:  # real reads around the page cache: the device counters see them
                buffer = aligned_buffer(MiB)
                for offset in range(0, 32 * MiB, MiB):
                    f.read_into(buffer, offset)
            await until(pilot, lambda: max(app.drive_histories["disk0"], default=0) > 0, 30, "a read rate")
            await until(pilot, lambda: len(app.drive_histories["disk0"]) >= before + 3, 30, "three more plot points")
            line = app.screen.query_one("DriveLine")
            assert line.figures.text.startswith("disk0") and "MB/s device" in line.figures.text
            assert line.plot.scale() == 400.0 and "/400 MB/s" in str(line.plot.render())  # the probed ceiling

    asyncio.run(drive())


def test_runs_screen_filters_the_catalogue_and_compares_two_runs(home):
    catalogue = Catalogue(catalogue_file())
    for tok_s, prefetch, verdict in ((1.0, False, "baseline"), (1.25, True, "win"), (0.8, True, "loss")):
        catalogue.record(Run("decode", "/models/tiny", {"prefetch": prefetch}, {"tokens_per_s": tok_s}, verdict))

    async def drive() -> None:
        app = Dashboard()
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("4")
            await until(pilot, lambda: [row[0] for row in cells(app, "#catalogue")] == ["3", "2", "1"], 30, "the runs")
            assert cells(app, "#catalogue")[1][2:5] == ["decode", "win", "1.25"]
            await pilot.press("slash", *"loss")
            await until(pilot, lambda: [row[0] for row in cells(app, "#catalogue")] == ["3"], 30, "the filter")
            await pilot.press(*["backspace"] * 4, "enter")  # back to the list: keys are the app's again
            await pilot.press("3")
            await until(pilot, lambda: isinstance(app.screen, ReportsScreen), 30, "the ReportsScreen")
            await pilot.press("4")
            await until(pilot, lambda: isinstance(app.screen, RunsScreen), 30, "the RunsScreen")
            assert app.screen.query_one("#filter").value == ""
            await select(pilot, "#catalogue", "1")
            await pilot.press("m")
            await select(pilot, "#catalogue", "2")
            await pilot.press("m")
            compare = text(app, "#compare").splitlines()
            assert compare[0].split() == ["figure", "run", "1", "(baseline)", "run", "2", "(win)", "b/a"]
            assert compare[1].split() == ["tokens_per_s", "1", "1.25", "1.250"]
            assert compare[2].split() == ["config", "prefetch", "False", "True"]

    asyncio.run(drive())
