"""The control socket: a Unix socket in the data dir, owner-only, one JSON request and reply per connection.

The CLI and the dashboard ask the running service through it; when no service
answers, `request` returns None and the caller works on the data dir directly.
Replies carry runs and report index entries as JSON; the functions below
`request` ask for one thing each and parse the reply back into the queue's and
the index's dataclasses.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from nightshift.app.daemon.runs import Run
from nightshift.app.paths import control_socket
from nightshift.app.review.index import IndexEntry
from nightshift.engine import NightshiftError

Handler = Callable[[dict[str, Any]], dict[str, Any]]
MAX_REQUEST = 1 << 16


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    handle_request_json: Handler


class _Connection(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        line = self.rfile.readline(MAX_REQUEST)
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
            reply = self.server.handle_request_json(request)
        except (ValueError, TypeError, ArithmeticError) as exc:  # a field of the wrong type or out of range
            reply = {"ok": False, "error": f"bad request: {exc}"}
        except NightshiftError as exc:
            reply = {"ok": False, "error": str(exc)}
        self.wfile.write(json.dumps(reply, default=str).encode() + b"\n")


class ControlServer:
    """Serves `handler` on the socket from a background thread; the socket file is 0600."""

    def __init__(self, handler: Handler, path: Path | None = None):
        self.path = path or control_socket()
        self.path.unlink(missing_ok=True)  # a stale socket of a killed service (we hold the instance lock)
        self.path.parent.chmod(0o700)  # the socket's folder is the owner's only, like the socket
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


def request(command: str, timeout: float = 10.0, **arguments: Any) -> dict[str, Any] | None:
    """Ask the running service; None when none is running. Errors it reports become NightshiftError."""
    path = control_socket()
    if not path.exists():
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(timeout)
        try:
            connection.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return None  # the socket of a service that is gone
        connection.sendall(json.dumps({"command": command, **arguments}).encode() + b"\n")
        with connection.makefile("rb") as replies:
            reply = json.loads(replies.readline() or b"{}")
    if not reply.get("ok", False):
        raise NightshiftError(f"the service says: {reply.get('error', 'no answer')}")
    return reply


@dataclass(frozen=True)
class Jobs:
    """The queue: runs (waiting and running first, then the latest finished) and each schedule's next run.

    A schedule's next run is an ISO time, or None while it is paused.
    """

    runs: list[Run]
    next_runs: dict[str, str | None]

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
    return None if reply is None else Jobs([Run.from_dict(run) for run in reply["runs"]], reply["next_runs"])


def run_status(run_id: int, timeout: float = 10.0) -> Run | None:
    """One run as the running service has it; None when none is running."""
    reply = request("run_status", timeout, id=run_id)
    return None if reply is None else Run.from_dict(reply["run"])


def reports(timeout: float = 10.0) -> list[IndexEntry] | None:
    """The report index as the running service reads it; None when none is running."""
    reply = request("reports", timeout)
    return None if reply is None else [IndexEntry.from_dict(entry) for entry in reply["reports"]]
