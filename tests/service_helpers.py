"""Reviews run by real `nightshift` processes on a test's data dir: the schedules they run, the service and the
commands, shared by the tests that start them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from nightshift.app.daemon.control import request
from nightshift.app.review.schedule import BUNDLED_DIR


def user_schedule(
    home: Path, model: Path, name: str = "tiny", max_tokens: int = 8, bundled: Path = BUNDLED_DIR
) -> Path:
    """The bundled month-end review (from `bundled`, another install's schedules if given), as a user's
    schedule that writes with the tiny model, one answer of `max_tokens` (a run's length is set by it)."""
    text = (bundled / "month-end.toml").read_text()
    text = text.replace('name = "month-end"', f'name = "{name}"').replace('"sample-data/', f'"{bundled}/sample-data/')
    text = text.replace("max_tokens = 160", f'name = "{model}"\nnarrative = "single"\nmax_tokens = {max_tokens}')
    text = text.replace('output = "reports/month-end"', f'output = "reports/{name}"')
    path = home / "schedules" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def nightshift(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nightshift.app.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "NIGHTSHIFT_HOME": str(home)}, timeout=timeout)  # fmt: skip


def serve(home: Path, *options: str) -> subprocess.Popen:
    """`nightshift serve [options]` on `home`, once it answers on its socket (a killed service's socket may still
    be there)."""
    process = subprocess.Popen([sys.executable, "-m", "nightshift.app.cli", "serve", *options],
                               env={**os.environ, "NIGHTSHIFT_HOME": str(home)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while (request("ping") or {}).get("pid") != process.pid:
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "the service did not answer on its socket"
        time.sleep(0.1)
    return process


def wait_for(condition, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.2)
