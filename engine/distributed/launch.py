"""Start one rank per host and watch them: tokens from rank 0, and a clear stop when any host stops.

Each rank is `python -m nightshift.engine.distributed.worker` with mlx's ring environment (MLX_RANK and
MLX_HOSTFILE in mlx's hostfile format, as `mlx.launch` sets them), started with bash here or over ssh
there. Every rank says a line at least every `beat_s`; a rank that exits early, reports an error or
stays silent for `stall_s` stops the whole run: every rank is ended and `PipelineError` names the host.
Nothing is written by a run that did not finish (the caller writes results only from a returned value).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nightshift.engine.distributed.hosts import Host, PipelineError, ring_hostfile
from nightshift.engine.distributed.worker import Request

LOST = "connection to a peer was lost"  # what mlx's ring backend raises in a rank whose neighbour went away
GRACE_S = 2.0  # after the first fault, how long the other ranks' own reports are awaited (they name causes)


@dataclass
class Rank:
    """A started rank: its process and what it said."""

    host: Host
    process: subprocess.Popen
    last_seen: float
    said_anything: bool = False
    ready_s: float | None = None  # seconds from the launch to its `ready` (start, imports, loading, ring connect)
    done: dict | None = None
    error: str | None = None
    stderr: deque = field(default_factory=lambda: deque(maxlen=12))


@dataclass
class PipelineResult:
    """A pipelined generation: rank 0's tokens, their times, each rank's figures (its `done`, with `ready_s`:
    how long it took to start) and the wall time; `cancelled`: stopped on request, the figures missing."""

    tokens: list[int]
    elapsed: list[float]
    ranks: list[dict]
    wall_s: float
    cancelled: bool = False


@dataclass(frozen=True)
class Timeouts:
    """Seconds: to the first line of a rank (imports and loading), between lines, and between tokens."""

    start_s: float = 180.0
    stall_s: float = 30.0
    token_s: float = 600.0


def start_script(host: Host, hostfile: str, request: Request) -> str:
    """The shell line that starts `host`'s rank: the hostfile in a temp file there, removed when the rank ends."""
    worker = [host.python, "-m", "nightshift.engine.distributed.worker", "--request", request.to_json()]
    return (
        f'cd {shlex.quote(host.cwd)} && f=$(mktemp) && printf %s {shlex.quote(hostfile)} > "$f" && '
        f'MLX_HOSTFILE="$f" MLX_RANK={host.rank} {shlex.join(worker)}; rc=$?; rm -f "$f"; exit $rc'
    )


def start(host: Host, script: str) -> subprocess.Popen:
    """Start a rank: in its own session here (so it is ended as a group), or over ssh with a terminal (so
    closing the connection ends it there)."""
    command = ["bash", "-c", script] if host.local else ["ssh", "-tt", "-o", "LogLevel=QUIET", host.ssh, script]
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def follow(rank: int, stream, lines: queue.Queue, kind: str) -> None:
    for line in stream:
        lines.put((rank, kind, line.rstrip("\r\n")))
    lines.put((rank, kind, None))


def stop_all(ranks: list[Rank]) -> None:
    """End every rank's process group, the shell and the worker under it: terminate (and continue a stopped
    worker, so that it can), then kill whatever of the groups is left after 3 s. The groups are watched, not
    the shells: a shell ends at once on SIGTERM, and watching it alone left a stopped worker behind."""
    for signals in ((signal.SIGTERM, signal.SIGCONT), (signal.SIGKILL,)):
        running = [r for r in ranks if _group_alive(r)]
        for r in running:
            for sig in signals:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(r.process.pid, sig)
        deadline = time.monotonic() + 3.0
        while any(_group_alive(r) for r in running) and time.monotonic() < deadline:
            time.sleep(0.05)


def _group_alive(rank: Rank) -> bool:
    """Whether any process of the rank's group is left (its shell reaped first: a zombie counts as one)."""
    rank.process.poll()
    try:
        os.killpg(rank.process.pid, 0)
    except ProcessLookupError:
        return False
    return True


def run_pipeline(
    hosts: list[Host],
    request: Request,
    port: int = 32323,
    timeouts: Timeouts = Timeouts(),
    on_event: Callable[[int, dict], None] | None = None,
    cancel: threading.Event | None = None,
) -> PipelineResult:
    """Run `request` on one rank per host; every rank's lines as they come (`on_event(rank, event)`), rank 0's
    tokens in the result. `cancel` set: every rank is stopped and the result so far returned, `cancelled`."""
    hostfile = ring_hostfile(hosts, port)
    lines: queue.Queue = queue.Queue()
    now = time.monotonic()
    began, last_token = now, now
    ranks: list[Rank] = []
    tokens: list[int] = []
    elapsed: list[float] = []
    try:
        for host in hosts:
            process = start(host, start_script(host, hostfile, request))
            ranks.append(Rank(host, process, now))
            for stream, kind in ((process.stdout, "out"), (process.stderr, "err")):
                threading.Thread(target=follow, args=(host.rank, stream, lines, kind), daemon=True).start()
        fault_at: float | None = None
        while True:
            try:
                rank_no, kind, line = lines.get(timeout=0.2)
            except queue.Empty:
                rank_no = None
            if rank_no is not None and line is not None:
                rank = ranks[rank_no]
                if kind == "err":
                    rank.stderr.append(line)
                else:
                    event = parse(line)
                    if event is None:
                        rank.stderr.append(line)
                        continue
                    rank.last_seen, rank.said_anything = time.monotonic(), True
                    if event["event"] in ("token", "progress", "prefill"):
                        last_token = time.monotonic()
                    if event["event"] == "token":
                        tokens.append(event["token"])
                        elapsed.append(event["elapsed"])
                    elif event["event"] == "ready":
                        rank.ready_s = rank.last_seen - began
                    elif event["event"] == "done":
                        rank.done = {**event, "ready_s": rank.ready_s}
                    elif event["event"] == "error":
                        rank.error = event["message"]
                    if on_event is not None:
                        on_event(rank_no, event)
            if cancel is not None and cancel.is_set():
                return PipelineResult(tokens, elapsed, [], time.monotonic() - began, cancelled=True)
            faults = find_faults(ranks, time.monotonic(), last_token, timeouts)
            if all(r.done is not None and r.process.poll() == 0 for r in ranks):
                return PipelineResult(tokens, elapsed, [r.done for r in ranks], time.monotonic() - began)
            if faults and fault_at is None:
                fault_at = time.monotonic()
            if fault_at is not None and time.monotonic() - fault_at >= GRACE_S:
                raise PipelineError(describe(faults, ranks))
    finally:
        stop_all(ranks)


def parse(line: str) -> dict | None:
    """A worker's JSON line, or None for anything else it printed (library warnings)."""
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def find_faults(ranks: list[Rank], now: float, last_token: float, timeouts: Timeouts) -> list[tuple[Rank, str]]:
    """Every rank that stopped, and how: an error it reported, an early exit, or silence."""
    faults = []
    for r in ranks:
        code = r.process.poll()
        if r.error is not None:
            faults.append((r, f"failed: {r.error}"))
        elif code is not None and (code != 0 or r.done is None):
            faults.append((r, f"exited with code {code} before finishing"))
        elif r.done is None and now - r.last_seen > (timeouts.stall_s if r.said_anything else timeouts.start_s):
            limit = timeouts.stall_s if r.said_anything else timeouts.start_s
            faults.append((r, f"stopped answering (nothing for {limit:.0f} s)"))
    if not faults and any(r.said_anything for r in ranks) and now - last_token > timeouts.token_s:
        faults.append((ranks[0], f"produced no token for {timeouts.token_s:.0f} s though every host answers"))
    return faults


def describe(faults: list[tuple[Rank, str]], ranks: list[Rank]) -> str:
    """The error: the host that stopped first named first (a neighbour's lost connection is only its echo)."""
    causes = [f for f in faults if LOST not in f[1]] or faults
    rank, why = causes[0]
    tail = " | ".join(rank.stderr) if rank.error is None and rank.stderr else ""
    others = [f"{r.host.label}: {w}" for r, w in faults if r is not rank]
    return (
        f"{rank.host.label} {why}"
        + (f" (its last output: {tail[-400:]})" if tail else "")
        + (f"; also {'; '.join(others)}" if others else "")
        + f"; every rank of the run was stopped and nothing was written ({len(ranks)} hosts)"
    )


def free_port(count: int) -> int:
    """A port p on this machine with p .. p+count-1 free now (for runs whose ranks are all local)."""
    import socket

    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count < 65536 and all(_free(base + i) for i in range(count)):
            return base
    raise PipelineError("no free run of local ports for the ring backend; pass --port")


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pipeline_request(store: Path, hosts: list[Host], max_tokens: int, memory_budget: int = 0, **more) -> Request:
    """The request for `store` (the same path on every host) over `hosts`: in the shape `model place --hosts`
    placed it for these hosts (the pipeline, or expert parallelism with `--experts`), its layers split as
    kept, else as placement would split them now; `more`: the Request's other fields (the prompt, or the
    chats of a batch; `shape` to choose one)."""
    from nightshift.engine.distributed.placement import plan_hosts, stored_shape, stored_split
    from nightshift.engine.store.manifest import read_manifest

    store = Path(store).absolute()
    more["shape"] = more.get("shape") or stored_shape(store, hosts)
    experts = more["shape"] == "experts"  # no split: every rank runs every layer
    return Request(
        store=str(store),
        split=[] if experts else stored_split(store, hosts) or plan_hosts(read_manifest(store), hosts).split,
        drives=[{d.name: str(d.root) for d in h.drives} for h in hosts],
        prompt=more.pop("prompt", []),
        max_tokens=max_tokens,
        memory_budget=memory_budget,
        ceilings=[h.ceilings for h in hosts],
        **more,
    )


def generate_over_hosts(
    store: Path,
    hosts: list[Host],
    prompt: list[int],
    max_tokens: int,
    memory_budget: int = 0,
    port: int = 32323,
    timeouts: Timeouts = Timeouts(),
    on_token: Callable[[int], None] | None = None,
    shape: str | None = None,
) -> PipelineResult:
    """Greedy tokens for `prompt` from the store at `store` over `hosts` (see `pipeline_request`); `shape`
    "experts" or "pipeline" (default: as the store was placed over these hosts)."""
    request = pipeline_request(store, hosts, max_tokens, memory_budget, prompt=prompt, shape=shape)

    def tokens_only(rank: int, event: dict) -> None:
        if event["event"] == "token" and on_token is not None:
            on_token(event["token"])

    return run_pipeline(hosts, request, port, timeouts, tokens_only)
