"""`nightshift serve`: run the scheduler service in the foreground; `--install` sets it up to start by itself."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from nightshift.app.commands import say
from nightshift.app.paths import doc, private_file, service_log, writable_data_dir


class LogFile(logging.FileHandler):
    """The service's log file. A line that cannot be written (the disk full) is said once on stderr, and again
    once lines are written again: not a "--- Logging error ---" traceback per line."""

    failing = False

    def emit(self, record: logging.LogRecord) -> None:
        self.failed_now = False
        super().emit(record)  # calls handleError when the write fails
        if self.failing and not self.failed_now:
            self.failing = False
            sys.stderr.write(f"nightshift: the log {self.baseFilename} is written again\n")

    def handleError(self, record: logging.LogRecord) -> None:
        self.failed_now = True
        if not self.failing:
            self.failing = True
            sys.stderr.write(f"nightshift: cannot write the log {self.baseFilename} ({sys.exc_info()[1]}); its "
                             "lines are lost until it can be written (free space in the data dir)\n")  # fmt: skip


def _logging() -> None:
    handlers = [LogFile(private_file(service_log())), logging.StreamHandler()]
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in handlers:
        handler.setFormatter(formatter)
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True)
    for chatty in ("apscheduler", "fontTools", "weasyprint"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


def cmd_serve(args: argparse.Namespace) -> int:
    if args.install:
        from nightshift.app.daemon.install import install

        path, hint = install()
        say(f"wrote {path}")
        say(f"enable it with: {hint}")
        return 0
    from nightshift.app.daemon.service import Service

    cluster = None
    if args.hosts:
        from nightshift.engine.distributed.model import Cluster

        cluster = Cluster.load(Path(args.hosts), args.port)  # a wrong hosts.json stops serve here, said
    writable_data_dir()
    _logging()
    service = Service(cluster=cluster)
    if cluster is not None:
        say("generating over " + ", ".join(f"{h['host']} ({', '.join(h['drives'])})" for h in cluster.describe()))
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=service.reload_said, name="reload").start())
    # A service that seems stuck (it does not answer, or does not stop) says where every thread is: the stacks go
    # to stderr (the terminal, or the journal under systemd) without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    service.start()
    say(f"serving; log in {service_log()}; stop with Ctrl-C; SIGHUP reads the schedule files again; "
        "SIGUSR1 writes every thread's stack to stderr")  # fmt: skip
    try:
        # With a timeout: a signal the kernel gives another thread (after a SIGCONT, say) is only handled when
        # the main thread runs again, which a wait without one would never do.
        while not stop.wait(1.0):
            pass
    finally:
        busy = len(service.running)  # runs being worked on: a stop interrupts them and queues them again
        say("stopping" + (f" ({busy} run(s) in progress: interrupted and queued again)" if busy else ""))
        service.stop()
    # Everything is recorded and the threads are told to end. Leave now: the interpreter's teardown under
    # daemon threads still running (a connection's, APScheduler's, the engine's) could abort the process
    # (SIGABRT, "could not acquire lock for <stderr> at interpreter shutdown"), exit -6 instead of 0.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Fire the schedules in schedules/ and the data dir's schedules/, queue their runs and work "
        "through them one at a time. Runs missed while the machine was off run once on return, within each "
        "schedule's grace. One service per data dir."
    )
    parser.add_argument(
        "--install",
        action="store_true",
        help="write a systemd user unit (Linux) or launchd agent (macOS) and say how to enable it",
    )
    parser.add_argument(
        "--hosts",
        metavar="JSON",
        help=f"generate every review's narrative over these hosts (hosts.json, {doc('distributed.md')}): the service "
        "runs here as rank 0 and starts the other ranks for each narrative",
    )
    parser.add_argument(
        "--port",
        type=int,
        help="first ring port with --hosts; rank r listens on PORT+r (default: 32323, or free "
        "local ports when every host is this machine)",
    )
    parser.set_defaults(run=cmd_serve)
