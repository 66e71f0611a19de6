"""Snapshot tests: every dashboard screen's layout at 80x24 and 160x50, from frozen data.

The feed is replaced by one that returns the same `Snapshot` (a running job,
two drives, a paused schedule, reports) and the refresh timer is set beyond the
test, so exactly one refresh is applied and the plots' histories are fixed.
Update after an intended layout change with `pytest tests/test_tui_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import math

import pytest

from nightshift.app.daemon.control import Jobs
from nightshift.app.daemon.runs import Run as QueueRun
from nightshift.app.review.index import IndexEntry
from nightshift.app.tui.app import Dashboard
from nightshift.app.tui.feed import CatalogueView, DriveRow, Memory, ServiceState, Snapshot
from nightshift.app.tui.widgets.plot import History
from nightshift.engine import Run

GiB = 1 << 30
TEXT = ("The month closed with two unmatched bank lines and one posting entered twice. "
        "F1: the card settlement of 4 812.50 has no ledger entry yet; F2: rent was posted twice on the 3rd.")  # fmt: skip

RUNS = [
    QueueRun.from_dict({"as_of": None, "due": None, "pid": None, **run})
    for run in [
        {"id": 7, "review": "month-end", "origin": "manual", "state": "running", "created": "2026-11-30T22:00:00+00:00",
         "started": "2026-11-30T22:00:01+00:00", "finished": None, "report": None, "error": None,
         "progress": {"prompt_tokens": 812, "generated_tokens": 96, "time_to_first_token": 4.21, "elapsed": 17.9,
                      "decode_tokens_per_s": 6.87, "max_tokens": 160, "text": TEXT,
                      "drive_bytes": {"nvme0": 9_400_000_000, "usb1": 1_200_000_000}, "cache_hits": 1830,
                      "prefetch_recall": 0.874}},
        {"id": 6, "review": "weekly", "origin": "schedule", "state": "queued", "created": "2026-11-30T21:59:00+00:00",
         "started": None, "finished": None, "report": None, "error": None, "progress": None},
        {"id": 5, "review": "daily", "origin": "schedule", "state": "done", "created": "2026-11-30T18:30:00+00:00",
         "started": "2026-11-30T18:30:01+00:00", "finished": "2026-11-30T18:31:05+00:00",
         "report": "/home/u/.local/share/nightshift/reports/daily/daily-2026-11-30.pdf", "error": None, "progress": None},
        {"id": 4, "review": "daily", "origin": "retry", "state": "failed", "created": "2026-11-29T18:30:00+00:00",
         "started": "2026-11-29T18:30:01+00:00", "finished": "2026-11-29T18:30:02+00:00", "report": None,
         "error": "bank-statement.csv: no such file", "progress": None},
    ]
]  # fmt: skip
REPORTS = [
    IndexEntry(id=n, review=review, title=title, period=period, created=created, findings=findings,
               by_severity={"high": high, "medium": findings - high, "low": 0}, unverified_numbers=unverified,
               seconds=seconds, path=f"/home/u/.local/share/nightshift/reports/{review}/{review}-{n}.pdf",
               missing=missing)
    for n, review, title, period, created, findings, high, unverified, seconds, missing in [
        (1, "month-end", "Month-end review", "October 2026", "2026-10-30T22:04:11+00:00", 6, 2, 0, 212.4, False),
        (2, "weekly", "Weekly review", "week 44, 2026", "2026-11-06T17:02:40+00:00", 3, 0, 1, 98.0, True),
        (3, "daily", "Daily review", "30 November 2026", "2026-11-30T18:31:05+00:00", 2, 1, 0, 64.2, False),
    ]
]  # fmt: skip
BENCH_RUNS = [
    Run("decode", "/models/kimi-tiny", {"prefetch": prefetch, "split_reads": split, "draft_depth": 2},
        {"tokens_per_s": tok_s, "roofline_fraction": roof, "ms_per_token": 1000 / tok_s}, verdict,
        id=n, recorded_at=f"2026-11-29T{hour}:00:00Z", fingerprint=f"f{n:011d}")
    for n, prefetch, split, tok_s, roof, verdict, hour in [
        (3, True, True, 1.21, 0.93, "win", "19"), (2, True, False, 1.09, 0.84, "loss", "18"),
        (1, False, False, 0.97, 0.75, "baseline", "17"),
    ]
]  # fmt: skip
SNAPSHOT = Snapshot(
    drives=[DriveRow("nvme0", "nvme0n1", 1412.6, 2890.0), DriveRow("usb1", "sdb", 187.3, None)],
    memory=Memory(service_bytes=int(3.4 * GiB), total_bytes=24 * GiB, available_bytes=int(17.9 * GiB)),
    cpu_fraction=0.031,
    refresh_hz=9.8,
    service=ServiceState(
        True,
        4242,
        Jobs(RUNS, {"month-end": "2026-12-31T22:00:00+00:00", "weekly": None, "daily": "2026-12-01T18:30:00+00:00"}),
        REPORTS,
    ),
    catalogue=CatalogueView(BENCH_RUNS),
    taken_at=0.0,
)


class FrozenFeed:
    """Stands in for `Feed`: the same snapshot every time, no threads, nothing read from the machine."""

    def collect(self, with_service: bool, service_pid: int | None) -> Snapshot:
        return SNAPSHOT

    def close(self) -> None:
        pass


def frozen_app() -> Dashboard:
    app = Dashboard(feed=FrozenFeed(), tick_s=3600.0)
    for name, scale in (("nvme0", 2400.0), ("usb1", 190.0)):
        app.drive_histories[name] = History()
        for i in range(200):
            app.drive_histories[name].append(scale * (0.55 + 0.45 * math.sin(i / 7.0)))
    for i in range(30):
        app.tokens_history.append(6.0 + math.sin(i / 3.0))
    return app


SCREENS = {"live": "1", "queue": "2", "reports": "3", "runs": "4"}


@pytest.mark.parametrize("size", [(80, 24), (160, 50)], ids=["80x24", "160x50"])
@pytest.mark.parametrize("screen", SCREENS)
def test_screen_layout(snap_compare, screen, size):
    assert snap_compare(frozen_app(), press=["_", SCREENS[screen], "_"], terminal_size=size)


@pytest.mark.slow
def test_dialogs_and_a_compare_at_80x24(snap_compare):
    assert snap_compare(frozen_app(), press=["_", "2", "question_mark", "_"], terminal_size=(80, 24))
    assert snap_compare(frozen_app(), press=["_", "2", "c", "_"], terminal_size=(80, 24))
    assert snap_compare(frozen_app(), press=["_", "4", "m", "down", "down", "m", "_"], terminal_size=(80, 24))
