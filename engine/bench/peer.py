"""`nightshift bench peer`: nightshift against llama.cpp (and mlx-lm in RAM) on one model, the same drives, the same budget.

Each engine runs as its own process (engine/bench/peer_side.py) inside a memory cgroup of its own, one after
the other, alternating which goes first from budget to budget. Under `nightshift rig run` every process reads
through the rig's throttled drives. A budget is a share of the experts' bytes; each process's cgroup limit is

    limit = what it needs besides the experts + budget + SLACK

where "what it needs besides the experts" is measured on that process once it has read the timed prompt: its own (anonymous)
memory, minus the expert bytes it holds in its cache (nightshift), plus the pages of the model's non-expert
tensors it reads through mmap (llama.cpp: they must stay in the page cache, and a memory cgroup counts page
cache). So each engine gets the same RAM for experts on top of its own needs; llama.cpp's page cache beyond
that is reclaimed and read again from the drive when touched. The model file's page cache is dropped before
each llama.cpp run, so none starts with pages another run read.

mlx-lm in RAM (the store loaded whole: every expert resident) runs once, without a limit: it fits only at
a budget of all the expert bytes; its peak memory is reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from nightshift.engine.errors import NightshiftError
from nightshift.engine.rig.cgroups import MemoryGroup, command_in

SIDE = Path(__file__).with_name("peer_side.py")
SLACK = 16 << 20  # room over the measured need: allocator and page-table churn while decoding
LLAMA = "llama.cpp"
NIGHTSHIFT = "nightshift"
IN_RAM = "mlx-lm in RAM"
EXPERT_TENSOR = "_exps."  # llama.cpp names a layer's stacked routed experts blk.N.ffn_{gate,up,down}_exps.weight


class PeerError(NightshiftError):
    """`bench peer` cannot run: no llama.cpp interpreter, a model it cannot read, a side that failed."""


def llama_cpp_python() -> str | None:
    """The interpreter that has llama-cpp-python: NIGHTSHIFT_LLAMA_CPP_PYTHON, else this one if it has it."""
    if python := os.environ.get("NIGHTSHIFT_LLAMA_CPP_PYTHON"):
        return python
    import importlib.util

    return sys.executable if importlib.util.find_spec("llama_cpp") is not None else None


def limit_for(anon: int, held: int, mapped_trunk: int, budget: int, slack: int = SLACK) -> int:
    """The memory cgroup limit for a process that holds `anon` bytes of its own (of which `held` are experts in
    its cache), needs `mapped_trunk` bytes of model pages in the page cache, and may keep `budget` of experts."""
    return max(0, anon - held) + mapped_trunk + budget + slack


def budgets(expert_bytes: int, shares: Iterable[float]) -> list[tuple[float, int]]:
    """(share, bytes) for each share of the experts' bytes."""
    return [(share, int(share * expert_bytes)) for share in shares]


@dataclass(frozen=True)
class GGUFModel:
    """A (split) GGUF model: its files, and how many bytes of it are routed experts."""

    files: list[Path]
    expert_bytes: int
    trunk_bytes: int
    expert_weights: int

    @property
    def bits_per_expert_weight(self) -> float:
        return 8 * self.expert_bytes / self.expert_weights


def read_gguf(first: Path) -> GGUFModel:
    """The model whose first (or only) file is `first`; its split siblings are found by llama.cpp's naming."""
    from nightshift.engine.store.gguf_import import GGUFFile

    count = int(GGUFFile(first).get("split.count", 1) or 1)
    files = [first]
    if count > 1:
        stem = first.name.rsplit("-00001-of-", 1)[0]
        files = [first.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    experts = trunk = weights = 0
    for path in files:
        for tensor in GGUFFile(path).tensors():
            if EXPERT_TENSOR in tensor.name:
                experts += int(tensor.n_bytes)
                weights += int(tensor.n_elements)
            else:
                trunk += int(tensor.n_bytes)
    if not weights:
        raise PeerError(f"{first} has no routed expert tensors (*{EXPERT_TENSOR}*): not a MoE model llama.cpp reads")
    return GGUFModel(files, experts, trunk, weights)


def read_ahead_kb(path: Path) -> int | None:
    """The read-ahead of the block device holding `path` (what an mmap fault reads around the page it needs)."""
    device = os.stat(Path(path).resolve()).st_dev
    queue = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}")
    for place in (queue / "queue", queue.resolve().parent / "queue"):  # a disk, or the disk of a partition
        if (place / "read_ahead_kb").is_file():
            return int((place / "read_ahead_kb").read_text())
    return None


def drop_page_cache(paths: Iterable[Path]) -> None:
    """Evict the files' pages from the page cache (written first), so the next reader starts cold."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@dataclass
class SideRun:
    """One engine's timed decode at one budget, with its cgroup's figures."""

    engine: str
    share: float | None  # None: no limit (mlx-lm in RAM)
    budget: int | None
    limit: int | None
    done: dict
    memory: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return 1 / self.done["s_per_token"]

    def figures(self) -> dict:
        """What the catalogue keeps: rate, bytes read per token, CPU share, and the side's own figures."""
        d = self.done
        tokens = len(d["tokens"]) - 1  # the first ends the prompt and is not timed
        out = {
            "tokens_per_s": self.tokens_per_s,
            "ms_per_token": 1000 * d["s_per_token"],
            "read_bytes_per_token": d["read_bytes"] / tokens,
            "read_bytes_per_s": d["read_bytes"] / d["wall_s"],
            "cpu_per_wall": d["cpu_s"] / d["wall_s"],
            "major_faults_per_token": d["major_faults"] / tokens,
            **{k: v for k, v in d.items() if k not in ("event", "tokens")},
            **self.memory,
        }
        if "wait_s" in d:
            out["wait_share"] = d["wait_s"] / d["wall_s"]
            out["hit_rate"] = d["cache_hits"] / max(1, d["cache_hits"] + d["cache_misses"])
        return out


def run_side(engine: str, argv: list[str], name: str, budget: tuple[float, int] | None, mapped_trunk: int) -> SideRun:
    """Start a side in a new memory cgroup, let it warm up, hold it to its limit, time it; the group is removed."""
    group = MemoryGroup.create(name)
    try:
        side = subprocess.Popen(
            command_in(group.procs_file, argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            ready = _event(side, "ready", engine)
            limit = None
            if budget is not None:
                limit = limit_for(group.anon_bytes(), ready["held"], mapped_trunk, budget[1])
                group.set_limit(limit)
            memory = {"anon_at_ready": group.anon_bytes(), "page_cache_at_ready": group.file_bytes()}
            side.stdin.write("go\n")
            side.stdin.flush()
            try:
                done = _event(side, "done", engine)
            except PeerError as exc:
                held = f"held to {limit / 1e6:.0f} MB" if limit else "no limit"
                raise PeerError(f"{exc} ({held}; {group.oom_kills()} killed for want of memory)") from None
            side.wait()
        finally:
            if side.poll() is None:
                side.kill()
                side.wait()
        memory.update(peak=group.figure("peak"), oom_kills=group.oom_kills())
        return SideRun(engine, budget[0] if budget else None, budget[1] if budget else None, limit, done, memory)
    finally:
        group.remove()


def _event(side: subprocess.Popen, event: str, engine: str) -> dict:
    for line in side.stdout:
        if line.startswith("{"):
            message = json.loads(line)
            if message.get("event") == event:
                return message
    side.wait()
    raise PeerError(f"the {engine} side ended (exit {side.returncode}) before '{event}'; its error is above")


HEADER = (
    "budget", "engine", "limit MB", "tok/s", "x llama.cpp", "MB read/token", "read MB/s", "CPU/wall",
    "wait share", "hit rate", "major faults/token",
)  # fmt: skip


def table(runs: list[SideRun]) -> str:
    """The peer table: per budget, each engine's rate and where its time went, nightshift's rate over llama.cpp's."""
    llama = {r.share: r.tokens_per_s for r in runs if r.engine == LLAMA}
    rows = [HEADER, ("---",) * len(HEADER)] + [_row(r, llama.get(r.share)) for r in runs]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def _row(r: SideRun, llama_rate: float | None) -> tuple[str, ...]:
    f = r.figures()
    return (
        f"{r.share:.0%} ({r.budget / 1e6:.0f} MB)" if r.share is not None else "all (in RAM)",
        r.engine,
        f"{r.limit / 1e6:.0f}" if r.limit is not None else f"none (peak {r.memory['peak'] / 1e6:.0f})",
        f"{r.tokens_per_s:.3f}",
        f"{r.tokens_per_s / llama_rate:.2f}" if llama_rate and r.engine != LLAMA else "",
        f"{f['read_bytes_per_token'] / 1e6:.1f}",
        f"{f['read_bytes_per_s'] / 1e6:.1f}",
        f"{f['cpu_per_wall']:.2f}",
        f"{f['wait_share']:.0%}" if "wait_share" in f else "",
        f"{f['hit_rate']:.1%}" if "hit_rate" in f else "",
        f"{f['major_faults_per_token']:.0f}",
    )


@dataclass(frozen=True)
class PeerPlan:
    """What one `bench peer` runs: the store, the peer's GGUF and interpreter, the budgets, the decode."""

    store: Path
    gguf: GGUFModel
    python: str
    settings: dict  # nightshift's StreamSettings.as_dict(); cache_bytes is set per budget
    shares: tuple[float, ...]
    tokens: int
    threads: int
    drives: Path | None = None
    in_ram: bool = True


def run_peers(plan: PeerPlan, expert_bytes: int, on_run=None) -> list[SideRun]:
    """Every engine at every budget (alternating which goes first), then mlx-lm in RAM; `on_run(run)` after each."""
    from nightshift.engine.bench.decode import PROMPT, WARMUP, WARMUP_PROMPT

    config = {"prompt": PROMPT, "warmup_prompt": WARMUP_PROMPT, "warmup": WARMUP, "tokens": plan.tokens,
              "threads": plan.threads, "drives": str(plan.drives) if plan.drives else None}  # fmt: skip
    own = [sys.executable, "-m", "nightshift.engine.bench.peer_side"]
    runs: list[SideRun] = []

    def side(engine: str, argv: list[str], budget: tuple[float, int] | None, mapped: int = 0) -> None:
        if engine == LLAMA:
            drop_page_cache(plan.gguf.files)
        runs.append(run_side(engine, argv, f"nightshift-peer-{os.getpid()}-{len(runs)}", budget, mapped))
        if on_run is not None:
            on_run(runs[-1])

    for i, budget in enumerate(budgets(expert_bytes, plan.shares)):
        ours = json.dumps({**config, "settings": {**plan.settings, "cache_bytes": budget[1]}})
        pair = [
            (NIGHTSHIFT, [*own, "nightshift", str(plan.store), ours], 0),
            (LLAMA, [plan.python, str(SIDE), "llama", str(plan.gguf.files[0]), json.dumps(config)], plan.gguf.trunk_bytes),
        ]  # fmt: skip
        for engine, argv, mapped in pair if i % 2 == 0 else reversed(pair):
            side(engine, argv, budget, mapped)
    if plan.in_ram:
        side(IN_RAM, [*own, "in-ram", str(plan.store), json.dumps(config)], None)
    return runs
