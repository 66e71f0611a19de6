"""`nightshift serve --hosts`: the service on rank 0 writes its reviews' narratives over a pipeline of hosts.

Slow: a real service (a subprocess) with 2 local ranks (ring backend on localhost, each rank with its own
drives) writes a review whose narrative equals the one a single process writes; a rank killed mid-run
fails that run with the host named (in the queue and the report index), and the service goes on with the
next run. Quick: the hosts file as serve reads it, and what the service says of its hosts.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from nightshift.app.cli import main
from nightshift.app.daemon.control import request
from nightshift.app.daemon.runs import RunQueue
from nightshift.app.review.index import read_index
from nightshift.engine.distributed.hosts import PipelineError
from nightshift.engine.distributed.model import Cluster
from nightshift.engine.io.drives import Drive
from nightshift.engine.store.importer import ImportOptions, import_checkpoint
from nightshift.engine.store.synth import synthesize
from tests.helpers.hosts import hosts_file, place_by_hosts
from tests.helpers.service import serve as serve_with
from tests.helpers.service import states, user_schedule
from tests.helpers.waits import wait_for


@pytest.fixture(scope="module")
def hosts_store(tmp_path_factory) -> Path:
    """A tiny qwen3_moe store placed over two local hosts (hosts.json next to it), its context widened so a
    review's prompt fits. Each worker builds its own (not `built_once`): a test finds leftover ranks anywhere on
    the machine by the store's path, and the other worker's ranks must not be among them."""
    root = tmp_path_factory.mktemp("served")
    src = synthesize("qwen3_moe", "tiny", root / "src", seed=1, layers=4)
    drives = [Drive(f"d{i}", root / f"import{i}") for i in range(2)]
    import_checkpoint(src, root / "q", drives, ImportOptions(trunk_bits=16))
    config = json.loads((root / "q" / "config.json").read_text())
    (root / "q" / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    place_by_hosts(root / "q", hosts_file(root, root / "q", 2))
    return root / "q"


def serve(home: Path, hosts: Path) -> subprocess.Popen:
    """`nightshift serve --hosts` on `home`, once it answers on its socket."""
    return serve_with(home, "--hosts", str(hosts))


def stop(service: subprocess.Popen) -> None:
    service.send_signal(signal.SIGTERM)
    assert service.wait(timeout=60) == 0


def narrative_of(run_id: int) -> str:
    return RunQueue().get(run_id).progress.text


def generated(run_id: int) -> int:
    progress = RunQueue().get(run_id).progress
    return progress.generated_tokens if progress is not None else 0


def ranks_of(service: subprocess.Popen) -> dict[str, psutil.Process]:
    """The service's worker processes by MLX_RANK."""
    found = {}
    for child in psutil.Process(service.pid).children(recursive=True):
        try:
            rank = child.environ().get("MLX_RANK")  # the worker, not the shell that started it
            if rank is not None and "distributed.worker" in " ".join(child.cmdline()):
                found[rank] = child
        except psutil.Error:
            continue
    return found


def split_schedule(home: Path, store: Path, name: str) -> None:
    """The bundled month-end review with its default split narrative (a batch of chats), short answers."""
    path = user_schedule(home, store, name, max_tokens=6)
    path.write_text(path.read_text().replace('narrative = "single"\n', "part_tokens = 6\n"))


@pytest.mark.slow
def test_serve_over_two_hosts_writes_the_narrative_one_process_writes(home, hosts_store, capsys):
    split_schedule(home, hosts_store, "alone")
    assert main(["review", "run", "alone"]) == 0  # one process, in the foreground: run 1
    capsys.readouterr()
    split_schedule(home, hosts_store, "split")
    user_schedule(home, hosts_store, "single", max_tokens=12)
    service = serve(home, hosts_store.parent / "hosts.json")
    try:
        hosts = request("jobs")["hosts"]
        assert [h["host"] for h in hosts] == ["host 127.0.0.1 (rank 0)", "host 127.0.0.1 (rank 1)"]
        assert main(["review", "run", "split", "--no-wait"]) == 0  # run 2: its chats as one batch
        wait_for(lambda: [s for _, _, s in states(home)] == ["done", "done"], 300)
    finally:
        stop(service)
    assert narrative_of(2) == narrative_of(1) and narrative_of(1)
    # Each host read its own drives (the run's figures carry every host's).
    read = {d for d, n in RunQueue().get(2).progress.drive_bytes.items() if n}
    assert {d[:2] for d in read} == {"h0", "h1"}
    # One prompt (a single narrative) over the hosts equals one process too.
    assert main(["review", "run", "single"]) == 0  # run 3, one process
    service = serve(home, hosts_store.parent / "hosts.json")
    try:
        assert main(["review", "run", "single", "--no-wait"]) == 0  # run 4, over the hosts
        wait_for(lambda: [s for _, _, s in states(home)][3:] == ["done"], 300)
    finally:
        stop(service)
    assert narrative_of(4) == narrative_of(3) and narrative_of(3)


@pytest.mark.slow
def test_a_host_killed_mid_run_fails_that_run_naming_it_and_the_service_goes_on(home, hosts_store):
    user_schedule(home, hosts_store, "long", max_tokens=4000)
    user_schedule(home, hosts_store, "short", max_tokens=4)
    service = serve(home, hosts_store.parent / "hosts.json")
    try:
        assert main(["review", "run", "long", "--no-wait"]) == 0
        wait_for(lambda: generated(1) >= 3)
        ranks = ranks_of(service)
        assert set(ranks) == {"0", "1"}
        ranks["1"].kill()
        wait_for(lambda: states(home)[0][2] == "failed", 120)
        error = RunQueue().get(1).error
        assert "host 127.0.0.1 (rank 1) exited with code" in error and "nothing was written" in error
        assert [(e.state, e.run) for e in read_index()] == [("failed", 1)]
        assert "rank 1" in read_index()[0].reason
        assert not ranks_of(service)  # every rank of the failed run was ended
        assert main(["review", "run", "short", "--no-wait"]) == 0  # the service goes on: the next run is done
        wait_for(lambda: [s for _, _, s in states(home)] == ["failed", "done"], 300)
        assert not list((home / "reports" / "long").glob("*.pdf*"))  # nothing half-written
    finally:
        stop(service)


def test_serve_refuses_a_wrong_hosts_file_before_starting(home, tmp_path, capsys):
    one = tmp_path / "hosts.json"
    one.write_text(json.dumps({"hosts": [{"ssh": "a", "ips": ["10.0.0.1"], "drives": {"x": "/x"}}]}))
    assert main(["serve", "--hosts", str(one)]) != 0
    assert "at least two hosts" in capsys.readouterr().err
    assert request("ping") is None  # no service was started


def test_the_cluster_says_its_hosts_and_refuses_a_model_that_is_not_a_store(tmp_path):
    hosts = [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "drives": {f"h{r}d0": f"/d{r}"}} for r in range(2)]
    (tmp_path / "hosts.json").write_text(json.dumps({"hosts": hosts}))
    cluster = Cluster.load(tmp_path / "hosts.json")
    assert cluster.describe() == [
        {"host": "host 127.0.0.1 (rank 0)", "drives": ["h0d0"]},
        {"host": "host 127.0.0.1 (rank 1)", "drives": ["h1d0"]},
    ]
    (tmp_path / "model").mkdir()
    with pytest.raises(PipelineError, match="not a store"):
        cluster.open(tmp_path / "model")


HOSTS = [
    {"host": "host 127.0.0.1 (rank 0)", "drives": ["h0d0", "h0d1"]},
    {"host": "host mac-b.local (rank 1)", "drives": ["h1d0"]},
]


def test_the_hosts_panel_shows_every_hosts_drives_and_hides_without_hosts():
    from textual.app import App

    from nightshift.app.tui.widgets.hosts import HostsPanel

    class One(App):
        def compose(self):
            yield HostsPanel(id="hosts")

    async def drive() -> None:
        app = One()
        async with app.run_test(size=(120, 20)) as pilot:
            panel = app.query_one(HostsPanel)
            panel.show(HOSTS, {"h0d0": 5_000_000, "h0d1": 3_000_000, "h1d0": 9_000_000}, {"h0d0": 2.5, "h1d0": 4.0})
            await pilot.pause()
            assert panel.display and [line.text for line in panel.lines] == [
                "host 127.0.0.1 (rank 0): 2.5 MB/s · h0d0 2.5 MB/s, 5 MB read · h0d1 — MB/s, 3 MB read",
                "host mac-b.local (rank 1): 4.0 MB/s · h1d0 4.0 MB/s, 9 MB read",
            ]
            panel.show(HOSTS[:1], {}, {})  # a host fewer (hosts.json changed), no run reading
            await pilot.pause()
            assert len(panel.lines) == 1 and panel.note.display
            panel.show([], {}, {})  # the service runs on this machine alone
            await pilot.pause()
            assert not panel.display

    asyncio.run(drive())


@pytest.mark.slow
def test_the_dashboard_shows_every_hosts_drives_while_a_run_reads_them(home, hosts_store):
    from nightshift.app.tui.app import Dashboard
    from nightshift.app.tui.widgets.hosts import HostsPanel
    from tests.helpers.waits import until

    user_schedule(home, hosts_store, "long", max_tokens=4000)
    service = serve(home, hosts_store.parent / "hosts.json")

    def reading(app: Dashboard, rank: int) -> bool:
        """Rank `rank`'s line shows a rate for one of its drives (a figure, not the dash of no record)."""
        lines = app.screen.query_one(HostsPanel).lines
        return len(lines) == 2 and f"h{rank}d" in lines[rank].text and " — MB/s" not in lines[rank].text.split("·")[1]

    async def drive() -> None:
        app = Dashboard()
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.service is not None and app.service.running, 60, "the service")
            assert main(["review", "run", "long", "--no-wait"]) == 0
            await until(pilot, lambda: reading(app, 0) and reading(app, 1), 120, "both hosts' drive rates")
            assert app.screen.query_one(HostsPanel).display

    try:
        asyncio.run(drive())
    finally:
        stop(service)
    # The service stopped mid-run: the run is interrupted (queued again) and no rank is left anywhere.
    assert states(home)[0][2] == "interrupted"
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(hosts_store) in " ".join(p.info["cmdline"] or [])]
