"""How much RAM the expert cache may hold: `auto` from the memory the machine has free, or a given size.

`auto` (the default) takes the RAM available now (psutil: what can be had without swapping, page cache
included; bounded by the process's memory cgroup where it has a limit, as in a container) and leaves room for what else the model and the machine need while it runs:

    budget = min(every expert's bytes, available - trunk - KV cache - read buffers - working set - margin)

trunk: the store's trunk file (resident); KV cache: every layer's keys and values for `CONTEXT_TOKENS`
tokens in float32 (a bound, not a guess at the prompt); read buffers: one per reader thread, each the
largest expert file; working set: the largest layer's experts four times over (a stack built for one
call, and a prefill chunk's float copies of dequantized experts); margin: a tenth of the machine's RAM,
at least `MARGIN_MIN` and at most `MARGIN_MAX`, for the rest of the system.

An auto budget also gives RAM back: `Pressure` looks at available memory now and then while the model
runs, and when another process has taken so much that less than the margin is left, the cache shrinks
by the shortfall (the engine evicts down to it), rather than the machine swapping.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from nightshift.engine.moe.held import held_expert_bytes
from nightshift.engine.moe.settings import AUTO_BUDGET
from nightshift.engine.store.manifest import Manifest

CONTEXT_TOKENS = 8192
MARGIN_FRACTION = 0.10
MARGIN_MIN = 1 << 30
MARGIN_MAX = 8 << 30
CHECK_EVERY_S = 0.5  # how often a running model looks at available memory (/proc and cgroup files: ~1-2 ms)


@dataclass(frozen=True)
class Budget:
    """The expert cache's budget and where it came from (every figure in bytes)."""

    bytes: int
    auto: bool
    expert_bytes: int  # every expert of the store, one copy, as held in RAM (engine/moe/held.py)
    available: int = 0  # RAM available when the budget was sized (auto only)
    reserved: int = 0  # trunk + KV cache + read buffers + working set (auto only)
    margin: int = 0  # left for the rest of the system (auto only)

    @property
    def share(self) -> float:
        """The budget as a share of the store's expert bytes (1.0: every expert fits)."""
        return self.bytes / self.expert_bytes if self.expert_bytes else 0.0

    def describe(self) -> str:
        size = f"{self.bytes / 1e6:.0f} MB ({min(self.share, 1):.0%} of {self.expert_bytes / 1e6:.0f} MB of experts)"
        if not self.auto:
            return f"expert cache {size}, as given"
        return (
            f"expert cache {size}, auto: {self.available / 1e9:.1f} GB available, "
            f"{self.reserved / 1e9:.2f} GB for the model's own use, {self.margin / 1e9:.1f} GB left to the system"
        )


@dataclass(frozen=True)
class Memory:
    """RAM this process may still take (bytes) and the RAM it has in all: the machine's, or its memory cgroup's
    where that is smaller (a container, a `bench peer` limit)."""

    available: int
    total: int


def memory_now() -> Memory:
    """psutil's available and total RAM, bounded by the process's memory cgroup (v1 or v2) when it has a limit.

    A cgroup's free memory is its limit minus its usage plus its inactive file pages (page cache the kernel
    reclaims first), as container runtimes count it; /proc/meminfo does not see the limit at all.
    """
    machine = psutil.virtual_memory()
    limited = _cgroup_memory()
    if limited is None or limited.total >= machine.total:
        return Memory(machine.available, machine.total)
    return Memory(min(machine.available, limited.available), limited.total)


def _cgroup_memory() -> Memory | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:  # not Linux
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "memory":  # v1
            root = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            break
    else:  # v2: the one "0::/path" line
        path = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), "/")
        root = Path("/sys/fs/cgroup") / path.lstrip("/")
        files = ("memory.max", "memory.current", "inactive_file")
    try:
        limit_text = (root / files[0]).read_text().strip()
        usage = int((root / files[1]).read_text())
        stat = dict(line.split() for line in (root / "memory.stat").read_text().splitlines())
    except (OSError, ValueError):
        return None
    if not limit_text.isdigit():  # v2 "max": no limit
        return None
    limit = int(limit_text)
    return Memory(max(0, limit - usage + int(stat.get(files[2], 0))), limit)


def margin_for(total: int) -> int:
    return min(max(int(total * MARGIN_FRACTION), MARGIN_MIN), MARGIN_MAX)


def kv_cache_bytes(config: dict, tokens: int = CONTEXT_TOKENS) -> int:
    """Keys and values of every layer for `tokens` tokens, in float32 (a bound for any cache dtype)."""
    text = config.get("text_config", config)
    layers = int(text.get("num_hidden_layers", 0))
    heads = int(text.get("num_attention_heads", 1))
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or int(text.get("hidden_size", 0)) // max(heads, 1))
    return layers * 2 * kv_heads * head_dim * 4 * tokens


def working_set_bytes(manifest: Manifest) -> int:
    """The largest layer's experts four times over: a stack built for one call, a prefill chunk's float copies."""
    return 4 * max(layer.file_bytes * layer.num_experts for layer in manifest.layers)


def reserved_bytes(manifest: Manifest, store: Path, reader_threads: int) -> int:
    """RAM the streamed model needs besides the cache: trunk, KV cache, read buffers, working set."""
    trunk = (store / manifest.trunk["file"]).stat().st_size
    largest_file = max(layer.file_bytes for layer in manifest.layers)
    return trunk + kv_cache_bytes(manifest.config) + reader_threads * largest_file + working_set_bytes(manifest)


def size_budget(cache_bytes: int, manifest: Manifest, store: Path, reader_threads: int) -> Budget:
    """The budget for `cache_bytes` (AUTO_BUDGET or bytes); auto is sized from RAM available now (call before loading)."""
    every = held_expert_bytes(manifest)
    if cache_bytes != AUTO_BUDGET:
        return Budget(cache_bytes, False, every)
    memory = memory_now()
    reserved = reserved_bytes(manifest, store, reader_threads)
    margin = margin_for(memory.total)
    spare = max(0, memory.available - reserved - margin)
    return Budget(min(every, spare), True, every, memory.available, reserved, margin)


class Pressure:
    """Watches available RAM for an auto budget, at most every `CHECK_EVERY_S`.

    `budget_now(used)`: the budget the cache should have now: what it holds plus what is available beyond
    the margin, never more than it was sized at open. Below `used` when another process has taken RAM (the
    cache gives back the shortfall); back up to the sized budget once that RAM is free again.
    None between checks.
    """

    def __init__(self, budget: Budget):
        self.budget = budget
        self._next = 0.0

    def budget_now(self, used: int) -> int | None:
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + CHECK_EVERY_S
        headroom = memory_now().available - self.budget.margin
        return min(self.budget.bytes, max(0, used + headroom))
