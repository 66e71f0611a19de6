"""The service batches runs due together: their narratives generate as one batch, each run still its own.

Each run keeps its own state, report, failure and retry; its text is what it writes alone (greedy); a run
cancelled mid-batch leaves it and the others go on; a kill loses and doubles nothing.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from nightshift.app.cli import main
from nightshift.app.daemon.control import request
from nightshift.app.daemon.runs import RunProgress, RunQueue
from nightshift.app.daemon.service import Service
from nightshift.app.daemon.settings import SettingsError, load_settings
from nightshift.app.daemon.work import execute
from nightshift.app.review.narrative import CONTROL, SharedBatch, read_narrative
from nightshift.app.review.report import render_html
from nightshift.app.review.schedule import load_schedules
from nightshift.engine.generation import GenerationStats
from tests.helpers.dashboard import EARLIER, RUNNING, STATES, frozen_app, service, settled
from tests.helpers.reviews import report_context
from tests.helpers.service import serve, states, user_schedule
from tests.helpers.waits import wait_for

TOKENS = 6


def review(home: Path, model: Path, name: str, tokens: int = TOKENS, narrative: str = "split", width: int = 3,
           findings: int = 10) -> Path:  # fmt: skip
    """The bundled month-end review as `name` on the tiny model: split into `width` answers of `tokens` each, or
    one answer (single); `findings` given to the model (so that reviews' prompts differ)."""
    path = user_schedule(home, model, name, max_tokens=tokens)
    settings = f'narrative = "{narrative}"\nprompt_findings = {findings}'
    if narrative == "split":
        settings += f"\npart_tokens = {tokens}\nbatch_width = {width}"
    path.write_text(path.read_text().replace('narrative = "single"', settings))
    return path


def settings(home: Path, text: str) -> None:
    (home / "service.toml").write_text(text)


def alone(home: Path, names: list[str]) -> dict[str, str]:
    """Each review run alone in the foreground (`execute`, as `review run` does): its narrative's text."""
    queue = RunQueue()
    texts = {}
    for name in names:
        run = queue.claim(queue.enqueue(name), 1)
        finished = execute(queue, run)
        assert finished.state == "done", finished.error
        assert finished.progress.batch == []
        texts[name] = finished.progress.text.strip()
    return texts


@pytest.mark.slow
def test_runs_queued_together_generate_as_one_batch_and_each_writes_what_it_writes_alone(home, tiny_model, capsys):
    review(home, tiny_model, "a", width=3, findings=10)
    review(home, tiny_model, "b", width=2, findings=4)
    review(home, tiny_model, "c", narrative="single", findings=2)
    expected = alone(home, ["a", "b", "c"])
    settings(home, "[service]\nbatch_window = 0\nbatch_width = 3\n")
    queue = RunQueue()
    ids = [queue.enqueue(name) for name in ("a", "b", "c")]
    service = Service({}, work=True)
    service.start()
    try:
        wait_for(lambda: all(queue.get(i).state == "done" for i in ids), 120)
    finally:
        service.stop()
    runs = [queue.get(i) for i in ids]
    for run, name in zip(runs, ("a", "b", "c"), strict=True):
        assert CONTROL.sub("", run.progress.text) == CONTROL.sub("", expected[name]), (
            name
        )  # greedy: the batch changes the time, not the text
        assert run.progress.batch == ids and run.progress.batch_sequences == 3 + 2 + 1
        assert run.progress.batch_tokens_per_s > 0 and run.progress.decode_tokens_per_s > 0
        assert Path(run.report).is_file()
    assert runs[2].progress.generated_tokens <= TOKENS  # its own tokens, not the batch's
    assert main(["jobs"]) == 0
    shown = capsys.readouterr().out
    line = f"batch of runs {', '.join(map(str, ids))} (6 sequences): "
    assert sum(line in row and "tok/s together, this run" in row for row in shown.splitlines()) == 3


@pytest.mark.slow
def test_a_run_that_cannot_share_the_batch_stays_queued_and_one_that_fails_fails_alone(home, tiny_model):
    review(home, tiny_model, "a")
    review(home, tiny_model, "longer", tokens=TOKENS + 1)  # another length per answer: its own batch
    broken = review(home, tiny_model, "broken")  # shares the batch, but its bank statement is missing
    broken.write_text(broken.read_text().replace("bank-statement.csv", "missing.csv"))
    review(home, tiny_model, "b", findings=3)
    settings(home, "[service]\nbatch_window = 0\nbatch_width = 4\n")
    queue = RunQueue()
    ids = [queue.enqueue(name) for name in ("a", "longer", "broken", "b")]
    service = Service({}, work=True)
    service.start()
    try:
        wait_for(lambda: all(queue.get(i).state in ("done", "failed") for i in ids), 120)
    finally:
        service.stop()
    a, longer, failed, b = (queue.get(i) for i in ids)
    assert (a.state, longer.state, failed.state, b.state) == ("done", "done", "failed", "done")
    assert "missing.csv" in failed.error and failed.progress is None  # it failed in its checks, alone
    assert a.progress.batch == b.progress.batch == [ids[0], ids[3]]  # the other two generated together
    assert longer.progress.batch == [] and longer.started >= b.started
    if shutil.which("pdftotext"):
        text = " ".join(subprocess.run(["pdftotext", a.report, "-"], capture_output=True, text=True).stdout.split())
        assert (
            f"shared batch generated with run {ids[3]} (b):" in text and "2 reviews, 6 answers decoded together" in text
        )


def three_queued(home, tiny_model, tokens: int) -> tuple[RunQueue, list[int]]:
    """Three single-narrative reviews that can share one batch of width 3, queued with no window."""
    for name, findings in (("a", 10), ("b", 5), ("c", 3)):
        review(home, tiny_model, name, tokens=tokens, narrative="single", findings=findings)
    settings(home, "[service]\nbatch_window = 0\nbatch_width = 3\n")
    queue = RunQueue()
    return queue, [queue.enqueue(name) for name in ("a", "b", "c")]


@pytest.mark.slow
def test_a_run_cancelled_mid_batch_leaves_it_and_the_others_finish(home, tiny_model):
    queue, ids = three_queued(home, tiny_model, tokens=400)
    service = Service({}, work=True)
    service.start()
    try:
        wait_for(lambda: (queue.get(ids[1]).progress or RunProgress()).generated_tokens > 6, 120)
        assert service.handle({"command": "cancel", "id": ids[1]}) == {"ok": True}
        wait_for(lambda: queue.get(ids[1]).state == "interrupted", 30)
        wait_for(lambda: all(queue.get(i).state != "running" for i in ids), 300)
    finally:
        service.stop()
    # The others finish, whether the cancel lands while they decode or while they write their PDFs (the tiny
    # model decodes the whole batch in about a second: when the others are done is a race, not a claim).
    assert [queue.get(i).state for i in ids] == ["done", "interrupted", "done"]
    assert [run.id for run in queue.recent()][:3] == sorted(ids, reverse=True)  # nothing queued again


@pytest.mark.slow
def test_a_kill_mid_batch_queues_each_run_again_once(home, tiny_model):
    queue, ids = three_queued(home, tiny_model, tokens=4000)
    service = serve(home)
    try:
        wait_for(lambda: all(len((queue.get(i).progress or RunProgress()).batch) == 3 for i in ids))
    finally:
        service.send_signal(signal.SIGKILL)
        service.wait()
    assert [state for _, _, state in states(home)] == ["running"] * 3
    for name, findings in (("a", 10), ("b", 5), ("c", 3)):
        review(home, tiny_model, name, narrative="single", findings=findings)  # the retries finish quickly
    service = serve(home)
    try:
        wait_for(lambda: len(states(home)) == 6 and all(s != "running" and s != "queued" for _, _, s in states(home)))
        assert request("jobs")["ok"]  # the service looks for runs whose process ended while it answers: none again
        assert [(review, state) for _, review, state in states(home)] == [
            ("a", "interrupted"), ("b", "interrupted"), ("c", "interrupted"), ("a", "done"), ("b", "done"), ("c", "done")
        ]  # fmt: skip
        assert queue.get(4).progress.batch == [4, 5, 6]  # the retries share a batch again
    finally:
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=60) == 0


@pytest.mark.parametrize(("text", "message"), [
    ("[service]\nbatch_width = 0\n", "from 1 to 64"), ("[service]\nbatch_width = 2.5\n", "whole number"),
    ("[service]\nbatch_window = -1\n", "from 0 to 3600"), ("[service]\nbatch_window = true\n", "seconds"),
    ("[service]\nbatch_size = 4\n", "unknown key"), ("[serve]\n", "unknown key"), ("[service\n", "not readable"),
])  # fmt: skip
def test_service_settings_are_checked(home, text, message):
    home.mkdir(parents=True)
    settings(home, text)
    with pytest.raises(SettingsError, match=message):
        load_settings()


def test_service_settings_default_without_a_file(home):
    assert (load_settings().batch_window, load_settings().batch_width) == (60.0, 4)


def test_the_report_names_the_runs_that_shared_its_batch_and_the_rates(month_end):
    schedule, checked = month_end
    stats = GenerationStats(prompt_tokens=40, generated_tokens=12, time_to_first_token=30.0, elapsed=40.0)
    narrative = read_narrative("The month closed.\nF1: one payment is missing.", stats)
    narrative.shared = SharedBatch(((3, "month-end"), (4, "daily"), (5, "weekly")), 9, 23, 2.7, (0.9, 1.0, 0.8),
                                   (11.0, 12.0, 10.0), own=0)  # fmt: skip
    html = render_html(schedule.report_template, report_context(schedule, checked, narrative))
    assert (
        "generated with run 4 (daily), run 5 (weekly): 3 reviews, 9 answers decoded together in 23&nbsp;steps" in html
    )
    assert "writing 0.9&nbsp;tok/s (this review's answers' tokens after their first" in html
    assert "read at 11.0&nbsp;tokens/s" in html
    assert html.count("tok/s") == 1  # one writing rate for the run, its own (issue [24])


def test_the_dashboard_shows_which_runs_share_a_batch(user_zone, monkeypatch):
    batched = replace(RUNNING.progress, batch=[7, 8, 9], batch_sequences=9)
    runs = [replace(RUNNING, id=run_id, review=name, progress=batched)
            for run_id, name in ((7, "month-end"), (8, "daily"), (9, "weekly"))]  # fmt: skip
    monkeypatch.setitem(STATES, "batch", (service([*runs, EARLIER]), 7))

    async def drive() -> tuple[str, str]:
        app = frozen_app("batch")
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.press("1")
            live = await settled(pilot)
            await pilot.press("2")
            return live, await settled(pilot)

    live, queue = asyncio.run(drive())
    assert "batch of runs 7, 8, 9 (9 sequences); figures for the whole batch" in live
    assert "run 7: month-end" in live and "96/160 tokens" in live  # the batch's figures, said so above
    assert queue.count("batch of runs 7, 8, 9 (9 sequences)") == 3


def test_the_worker_waits_for_a_run_due_within_the_window_and_no_longer(home, tiny_model, wall):
    """A run taken up at 18:29:40 waits for one due at 18:30 (inside the 60 s window), then starts at once."""
    for name in ("a", "b"):
        path = review(home, tiny_model, name)
        text = re.sub(r"(?m)^when = .*$", 'when = "every day at 18:30"', path.read_text())
        text = re.sub(r"(?m)^calendar = .*\n", "", text)  # a holiday calendar needs a business-day `when`
        path.write_text(re.sub(r"(?m)^timezone = .*$", 'timezone = "UTC"', text))
    schedules, errors = load_schedules()
    assert not errors
    wall.set(datetime(2026, 10, 28, 18, 29, 40, tzinfo=UTC))
    service = Service({"b": schedules["b"]}, work=False)
    service.start()
    try:
        queue = RunQueue()
        first = queue.claim(queue.enqueue("a"), os.getpid())
        taken: list = []
        looks = threading.Semaphore(0)
        due_within = service._due_within

        def looked(key: tuple, seconds: float) -> bool:
            due = due_within(key, seconds)
            looks.release()
            return due

        service._due_within = looked  # counts the worker's looks at what falls due
        worker = threading.Thread(target=lambda: taken.extend(service._batch_with(first)))
        worker.start()
        assert looks.acquire(timeout=30) and looks.acquire(timeout=30)  # b due within the window: it looked again
        assert worker.is_alive() and not taken  # b is due within the window: waited for
        wall.set(datetime(2026, 10, 28, 18, 30, tzinfo=UTC))
        service.scheduler.check_now()
        worker.join(10)
        assert not worker.is_alive()  # b is taken; nothing else is due within the window
        assert [(run.review, run.state) for run in taken] == [("b", "running")]
        assert service._batch_with(first) == []  # nothing queued or due: no wait
    finally:
        service.stop()
