"""The control socket: a Unix socket in the data dir, owner-only, one JSON request and reply per connection.

Bounded on both ends: a connection that sends no request within `CONNECTION_TIMEOUT_S` is closed,
at most `MAX_CONNECTIONS` are served at once (more are told the service is busy), a request is
at most `MAX_REQUEST` bytes; a client gives up after its timeout with a message saying why (the
service stopped or busy), never a traceback.

The CLI and the dashboard ask the running service through it; when no service
answers, `request` returns None and the caller works on the data dir directly.
Replies carry runs and report index entries as JSON; the functions below
`request` ask for one thing each and parse the reply back into the queue's and
the index's dataclasses.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from nightshift.app.daemon.runs import Run, RunQueue
from nightshift.app.paths import control_socket, ensure_data_dir
from nightshift.app.review.index import IndexEntry, clip
from nightshift.engine.errors import NightshiftError

log = logging.getLogger("nightshift.control")
Handler = Callable[[dict[str, Any]], dict[str, Any]]
MAX_REQUEST = 1 << 16
MAX_REPLY = 1 << 24  # a client reads at most this much of a reply
MAX_CONNECTIONS = 16  # served at once; more are answered "busy" and closed
CONNECTION_TIMEOUT_S = 5.0  # a connection silent this long is closed
BACKLOG = 64  # connections the kernel holds for the server before a client's connect fails


class ServiceUnreachable(NightshiftError):
    """The service's socket is there but it did not answer in time (stopped, busy, stuck)."""


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = BACKLOG
    handle_request_json: Handler

    def __init__(self, path: str, handler: type[socketserver.BaseRequestHandler]):
        super().__init__(path, handler)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):  # a flood of connections: said and closed, no thread each
            with suppress(OSError):
                request.settimeout(0.1)
                request.sendall(json.dumps({"ok": False, "error": BUSY}).encode() + b"\n")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _Connection(socketserver.StreamRequestHandler):
    timeout = CONNECTION_TIMEOUT_S  # for reading the request and writing the reply

    def handle(self) -> None:
        try:
            line = self.rfile.readline(MAX_REQUEST)
        except OSError:  # silent past the timeout, or gone: nothing to answer
            return
        try:
            if len(line) >= MAX_REQUEST and not line.endswith(b"\n"):
                raise ValueError(f"a request is at most {MAX_REQUEST} bytes on one line")
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
            reply = self.server.handle_request_json(request)
        except (ValueError, TypeError, ArithmeticError) as exc:  # a field of the wrong type or out of range
            reply = {"ok": False, "error": f"bad request: {exc}"}
        except NightshiftError as exc:
            reply = {"ok": False, "error": str(exc)}
        except Exception as exc:  # a bug: answered, the traceback in the log, the server goes on
            log.exception("control request failed")
            reply = {"ok": False, "error": f"internal error: {exc!r}; see the service's log"}
        with suppress(OSError):  # the client left
            self.wfile.write(json.dumps(reply, default=str).encode() + b"\n")


class ControlServer:
    """Serves `handler` on the socket from a background thread; the socket file is 0600."""

    def __init__(self, handler: Handler, path: Path | None = None):
        self.path = path or control_socket()
        self.path.unlink(missing_ok=True)  # a stale socket of a killed service (we hold the instance lock)
        ensure_data_dir()  # 0700 if it makes it; a folder the user already had keeps its mode (warned)
        previous = os.umask(0o177)
        try:
            self.server = _Server(str(self.path), _Connection)
        finally:
            os.umask(previous)
        os.chmod(self.path, 0o600)
        self.server.handle_request_json = handler
        self.thread = threading.Thread(target=self.server.serve_forever, name="control", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.path.unlink(missing_ok=True)


def _connect(path: Path, deadline: float) -> socket.socket | None:
    """A connection to the service's socket; None when no service listens there. Busy: tried until `deadline`."""
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            connection.connect(str(path))
            return connection
        except (ConnectionRefusedError, FileNotFoundError):
            connection.close()
            return None  # the socket of a service that is gone
        except BlockingIOError:  # its listen backlog is full: it is busy (or stopped) and may catch up
            connection.close()
            if time.monotonic() >= deadline:
                raise ServiceUnreachable(
                    f"the service at {path} is not taking connections (its backlog is full: busy, or stopped); "
                    "try again, or look at nightshift.log in the data dir"
                ) from None
            time.sleep(0.05)
        except PermissionError:
            connection.close()
            raise NightshiftError(f"cannot connect to {path}: permission denied (another user's service?)") from None
        except BaseException:
            connection.close()
            raise


BUSY = "busy: too many connections at once; try again"


def request(command: str, timeout: float = 10.0, **arguments: Any) -> dict[str, Any] | None:
    """Ask the running service; None when none is running. Errors it reports become NightshiftError.

    A busy service is asked again until `timeout`; one that does not answer within it (stopped with
    SIGSTOP, stuck, flooded) is `ServiceUnreachable`, with what to do.
    """
    path = control_socket()
    deadline = time.monotonic() + timeout
    while True:
        if not path.exists():
            return None
        reply = _exchange(path, deadline, timeout, {"command": command, **arguments})
        if reply is None or reply.get("error") != BUSY or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if reply is not None and not reply.get("ok", False):
        raise NightshiftError(f"the service says: {reply.get('error', 'no answer')}")
    return reply


def _exchange(path: Path, deadline: float, timeout: float, message: dict[str, Any]) -> dict[str, Any] | None:
    """One request and its reply; None when no service listens."""
    connection = _connect(path, deadline)
    if connection is None:
        return None
    try:
        with connection, connection.makefile("rb") as replies:
            connection.sendall(json.dumps(message).encode() + b"\n")
            line = replies.readline(MAX_REPLY)
    except (BrokenPipeError, ConnectionResetError):  # closed before reading: the service is turning connections away
        return {"ok": False, "error": BUSY}
    except TimeoutError:
        raise ServiceUnreachable(
            f"the service at {path} did not answer within {timeout:.0f} s: it may be stopped (SIGSTOP), busy or "
            "stuck; look at nightshift.log in the data dir, or restart it"
        ) from None
    except OSError as exc:
        raise ServiceUnreachable(f"lost the connection to the service at {path}: {exc.strerror or exc}") from None
    try:
        reply = json.loads(line)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise ServiceUnreachable(f"the service at {path} closed the connection without a whole answer; try again")
    return reply


@dataclass(frozen=True)
class Jobs:
    """The queue: runs (waiting and running first, then the latest finished) and each schedule's next run.

    A schedule's next run is an ISO time, or None while it is paused.
    """

    runs: list[Run]
    next_runs: dict[str, str | None]
    cancelling: int | None = None  # the running run asked to stop (it stops at its next token)
    worker_restarts: int = 0  # times the watchdog found the worker thread dead and started a new one
    worker_error: str | None = None  # the last failure the worker met (it goes on once the cause clears)
    schedule_errors: list[str] = field(default_factory=list)  # schedule files that did not load
    repairs: list[str] = field(default_factory=list)  # the SQLite files found damaged at the service's start
    hosts: list[dict] = field(default_factory=list)  # serve --hosts: each host ("host") and its drive names

    def notices(self) -> list[str]:
        """What is wrong beside the runs, a line each, for `nightshift jobs` and the dashboard."""
        lines = [f"repaired at the service's start: {repair}" for repair in self.repairs]
        if self.worker_restarts:
            lines.append(f"the service's worker died and was restarted {self.worker_restarts} time(s)")
        if self.worker_error:
            lines.append(f"the worker's last failure: {self.worker_error}")
        return lines + [f"schedule skipped (the other reviews run): {error}" for error in self.schedule_errors]

    @property
    def current(self) -> Run | None:
        """The running run, if any."""
        return next((run for run in self.runs if run.state == "running"), None)


def service_pid(timeout: float = 10.0) -> int | None:
    """The running service's process id; None when none is running."""
    reply = request("ping", timeout)
    return None if reply is None else reply["pid"]


def queue_run(review: str, as_of: date | None = None, timeout: float = 10.0) -> int | None:
    """Queue a run of `review` in the running service; its run id, or None when no service is running."""
    reply = request("run", timeout, review=review, as_of=as_of.isoformat() if as_of else None)
    return None if reply is None else reply["id"]


def jobs(limit: int = 30, timeout: float = 10.0) -> Jobs | None:
    """The running service's queue; None when none is running."""
    reply = request("jobs", timeout, limit=limit)
    if reply is None:
        return None
    return Jobs([Run.from_dict(run) for run in reply["runs"]], reply["next_runs"], reply.get("cancelling"),
                reply.get("worker_restarts", 0), reply.get("worker_error"), reply.get("schedule_errors", []),
                reply.get("repairs", []), reply.get("hosts", []))  # fmt: skip


def jobs_without_service(limit: int) -> Jobs:
    """The queue from the data dir, with next runs and errors from the schedule files: what the service would
    report."""
    from nightshift.app.review.schedule import load_schedules  # APScheduler: only when no service answers

    now = datetime.now(UTC)
    schedules, errors = load_schedules()
    next_runs = {name: (fire.isoformat() if (fire := s.trigger.get_next_fire_time(None, now)) else None)
                 for name, s in schedules.items()}  # fmt: skip
    return Jobs(RunQueue().recent(limit), next_runs, schedule_errors=[clip(str(error), 1000) for error in errors])


def run_status(run_id: int, timeout: float = 10.0) -> Run | None:
    """One run as the running service has it; None when none is running."""
    reply = request("run_status", timeout, id=run_id)
    return None if reply is None else Run.from_dict(reply["run"])


def reports(timeout: float = 10.0) -> list[IndexEntry] | None:
    """The report index as the running service reads it; None when none is running."""
    reply = request("reports", timeout)
    return None if reply is None else [IndexEntry.from_dict(entry) for entry in reply["reports"]]
