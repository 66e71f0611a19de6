"""How much RAM the expert cache may hold: `auto` from the memory the process may still take, or a given size.

`auto` (the default) takes the memory available now and leaves room for what else the model needs while it runs:

    budget = min(every expert's bytes, available - trunk - KV cache - read buffers - working set - margin)

available: psutil's available RAM (what can be had without swapping, page cache included), or, where the process's
memory cgroup or one above it has a lower limit (a container, a `bench peer` run), that limit less the group's
usage plus its inactive page cache, as container runtimes count it.
trunk: the store's trunk file (resident), and the copy of the output projection in the activations' dtype where
it is stored narrower (`trunk_bytes`): held by the model for a tied head, made by every pass for an untied one.
KV cache: every layer's keys and values for the run's context, prompt and answer (`context_tokens`, in mlx-lm's
steps of `KV_STEP` tokens) where the caller knows it, else for
`CONTEXT_TOKENS` (the service, batches); in the trunk's widest float dtype, a bound of the activations' (the
Mixtral bench export's bf16 weights with float32 norms keep float32 keys). Read buffers: one per reader
thread, each the largest expert file. Working set: what one layer call holds besides the cache, in the largest
layer: each expert it selects as read (a miss is not in the cache) and once more as the copy its compute makes
(a stack, or a 16-bit expert's float32 copy: twice its bytes), so three times the experts a pass can select
(a prompt pass of its rows, each choosing the top k, at most every expert of the layer; a decode step its top k
and the next layer's top k read ahead).
margin: what is left free. Outside a cgroup limit it is for the rest of the machine: a tenth of its RAM, at least
`MARGIN_MIN` and at most `MARGIN_MAX`. Inside one, nothing outside the group is charged to it, so the margin is
only for the process's own growth past what is reserved and the floor `Pressure` keeps: `LIMIT_FRACTION` of
the limit, at least `LIMIT_MARGIN_MIN` (docs/results.md, "`--memory-budget auto` inside a memory limit").

An auto budget also gives RAM back: `Pressure` looks at available memory now and then while the model
runs, and when another process (or the run's own growth past its estimate) has taken so much that less than the
margin is left, the cache shrinks by the shortfall (the engine evicts down to it), rather than the machine
swapping or the group's processes being killed at its limit. Inside a cgroup limit the margin is the process's
own growth, spent once it has grown: there `Pressure` keeps only `LIMIT_FLOOR` free (the cache never grows past
the headroom the last check saw, so between checks only the process's other growth takes from it).

Inside a cgroup limit the budget also grows past its size at open once the model has run a pass: what the open
only estimated (the process's growth the margin was for, the usage it started from) is then in the group's usage,
and the cache may take all the limit but `LIMIT_FLOOR` and what the model may still take: its reserve, its working
set that of the widest pass run so far, less what the model holds now (`held`: MLX's memory, active and the freed
buffers it keeps for reuse, less the cache's own tensors). So the KV cache still to grow and the working set of a
pass as wide as one already run stay free. A pass wider than any before (a long prompt in a service that has seen
short ones) first brings the budget back to its size at open, whose reserve and margin were sized for it, until the
next pass begins (a call at a layer no later than the last call's) and shows that pass done. Once grown, the cap
stays while passes are no wider (MLX's freed buffers come and go); the floor still binds. Outside a limit the
budget never grows past its size at open: the machine's other processes come and go.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from nightshift.engine.moe.held import held_expert_bytes
from nightshift.engine.moe.settings import AUTO_BUDGET
from nightshift.engine.store.manifest import Manifest
from nightshift.engine.store.safetensors_io import TensorEntry, read_header

CONTEXT_TOKENS = 8192  # the KV cache's bound where the run's context is not known at open
KV_STEP = 256  # mlx-lm's KVCache grows its keys and values this many tokens at a time
PREFILL_ROWS = 2048  # the most rows one prompt pass holds (engine/generation.py DEFAULT_CHUNK)
FLOAT_BYTES = {"BF16": 2, "F16": 2, "F32": 4}
MARGIN_FRACTION = 0.10
MARGIN_MIN = 1 << 30
MARGIN_MAX = 8 << 30
LIMIT_FRACTION = 0.05
LIMIT_FLOOR = 16 << 20  # what `Pressure` keeps free inside a cgroup limit
# Inside a limit: the process's growth past what is reserved (the tokenizer, mlx-lm's model code: 40 MB on the
# Mixtral bench export, 54-66 MB on its 4-bit copy, docs/results.md) and the floor.
LIMIT_MARGIN_MIN = (64 << 20) + LIMIT_FLOOR
CHECK_EVERY_S = 0.5  # how often a running model looks at available memory (/proc and cgroup files: ~1-2 ms)
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class Budget:
    """The expert cache's budget and where it came from (every figure in bytes)."""

    bytes: int
    auto: bool
    expert_bytes: int  # every expert of the store, one copy, as held in RAM (engine/moe/held.py)
    available: int = 0  # memory available when the budget was sized (auto only)
    reserved: int = 0  # trunk + KV cache + read buffers + working set (auto only)
    margin: int = 0  # left free at open (auto only)
    limited: bool = False  # sized inside a memory cgroup's limit (auto only)
    working_set: int = 0  # of `reserved`, the working set (auto only)

    @property
    def floor(self) -> int:
        """What `Pressure` keeps free while the model runs: the margin, which is the machine's other processes' where
        no cgroup limit binds; inside one, once the process has grown into its margin, only `LIMIT_FLOOR`."""
        return min(self.margin, LIMIT_FLOOR) if self.limited else self.margin

    @property
    def share(self) -> float:
        """The budget as a share of the store's expert bytes (1.0: every expert fits)."""
        return self.bytes / self.expert_bytes if self.expert_bytes else 0.0

    def describe(self) -> str:
        size = f"{self.bytes / 1e6:.0f} MB ({min(self.share, 1):.0%} of {self.expert_bytes / 1e6:.0f} MB of experts)"
        if not self.auto:
            return f"expert cache {size}, as given"
        where = "in the memory cgroup's limit" if self.limited else "on the machine"
        return (
            f"expert cache {size}, auto: {self.available / 1e6:.0f} MB available {where}, "
            f"{self.reserved / 1e6:.0f} MB for the model's own use, {self.margin / 1e6:.0f} MB left free"
        )


@dataclass(frozen=True)
class Memory:
    """Memory this process may still take (bytes) and the memory it has in all: the machine's RAM, or the lowest
    memory cgroup limit over the process where that is smaller (`limited`: a container, a `bench peer` limit)."""

    available: int
    total: int
    limited: bool = False


def memory_now(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> Memory:
    """psutil's available and total RAM, bounded by the process's memory cgroups (v1 or v2) where one has a limit.

    A cgroup's free memory is its limit minus its usage plus its inactive file pages (page cache the kernel
    reclaims first), as container runtimes count it; /proc/meminfo does not see the limit at all. Every group from
    the process's own up to the root is asked, as the kernel holds the process to each of their limits.
    `cgroup_root`, `proc_cgroup`: where the hierarchy and the process's membership are read (a test's own tree).
    """
    machine = psutil.virtual_memory()
    limited = cgroup_memory(cgroup_root, proc_cgroup)
    if limited is None or limited.total >= machine.total:
        return Memory(machine.available, machine.total)
    return Memory(min(machine.available, limited.available), limited.total, True)


def cgroup_memory(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> Memory | None:
    """The tightest memory limit among the process's cgroup and its ancestors, and what is free under it; None
    where no group has a limit (or there are no cgroups: not Linux)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # v1
            root = cgroup_root / "memory"
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            break
    else:  # v2: the one "0::/path" line
        path = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), "/")
        root = cgroup_root
        files = ("memory.max", "memory.current", "inactive_file")
    group = root / path.strip("/")
    levels = [group, *(level for level in group.parents if level == root or root in level.parents)]
    limits = [free for free in (_group_memory(level, files) for level in levels) if free is not None]
    if not limits:
        return None
    return Memory(min(m.available for m in limits), min(m.total for m in limits), True)


def _group_memory(group: Path, files: tuple[str, str, str]) -> Memory | None:
    """One group's limit and what is free under it, or None where it has no limit (or no such files)."""
    try:
        limit_text = (group / files[0]).read_text().strip()
        usage = int((group / files[1]).read_text())
        stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
    except (OSError, ValueError):
        return None
    if not limit_text.isdigit() or int(limit_text) >= 1 << 62:  # v2 "max", v1's page-rounded 2^63: no limit
        return None
    limit = int(limit_text)
    return Memory(max(0, limit - usage + int(stat.get(files[2], 0))), limit, True)


def margin_for(memory: Memory) -> int:
    """What auto leaves free: for the rest of the machine, or, inside a cgroup limit, for the process's own growth."""
    if memory.limited:
        return min(max(int(memory.total * LIMIT_FRACTION), LIMIT_MARGIN_MIN), MARGIN_MAX)
    return min(max(int(memory.total * MARGIN_FRACTION), MARGIN_MIN), MARGIN_MAX)


def kv_cache_bytes(config: dict, tokens: int = CONTEXT_TOKENS, itemsize: int = 4) -> int:
    """Keys and values of every layer for `tokens` tokens (in mlx-lm's steps), `itemsize` bytes each."""
    text = config.get("text_config", config)
    layers = int(text.get("num_hidden_layers", 0))
    heads = int(text.get("num_attention_heads", 1))
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or int(text.get("hidden_size", 0)) // max(heads, 1))
    steps = math.ceil(max(tokens, 1) / KV_STEP) * KV_STEP
    return layers * 2 * kv_heads * head_dim * itemsize * steps


def trunk_bytes(trunk: Path) -> tuple[int, int]:
    """What the trunk holds while the model runs, and the bytes of the activations' dtype (so of the KV cache's).

    The activations are at most the trunk's widest float (4 where it holds none: quantized with float32 scales),
    and are that where a norm or gate holds it (the Mixtral bench export's float32 norms: float32 keys, checked);
    a wide tensor the activations never meet (a float32 routing bias) makes this a bound that errs high. An output
    projection stored narrower is multiplied as a copy in the activations' dtype, counted with the file: a tied
    embedding's (the Mixtral bench export's bf16 one under float32 activations: 113 MB) is made at load and held
    (engine/store/head.py), an untied head's is made by every pass, so held while one is in flight (always while
    decoding)."""
    entries = read_header(trunk)
    return trunk.stat().st_size + _head_copy(entries)[0], _activation_bytes(entries)


def step_copy_bytes(trunk: Path) -> int:
    """The copy of the output projection a pass makes and frees, where an untied head (`lm_head`) is stored
    narrower than the activations (`trunk_bytes`); 0 where none is made, a tied head's copy being held by the model
    (engine/store/head.py). Made every step, so MLX's buffer cache must hold it (`cap_buffer_cache`)."""
    copy, tied = _head_copy(read_header(trunk))
    return 0 if tied else copy


def _head_copy(entries: list[TensorEntry]) -> tuple[int, bool]:
    """The bytes of the output projection's copy in the activations' dtype where it is stored narrower (else 0),
    of a trunk whose header holds `entries`, and whether the head is the tied embedding (there is no `lm_head`)."""
    width = _activation_bytes(entries)
    heads = [e for e in entries if e.name.endswith("lm_head.weight")]
    tied = not heads
    heads = heads or [e for e in entries if e.name.endswith("embed_tokens.weight")]
    return sum(e.nbytes // FLOAT_BYTES[e.dtype] * width for e in heads if FLOAT_BYTES.get(e.dtype, width) < width), tied


def _activation_bytes(entries: list[TensorEntry]) -> int:
    """The activations' dtype's bytes: the trunk's widest float, 4 where it holds none (`trunk_bytes`)."""
    return max((FLOAT_BYTES[e.dtype] for e in entries if e.dtype in FLOAT_BYTES), default=4)


def top_k(config: dict) -> int | None:
    """Experts each token selects, where the config names it."""
    text = config.get("text_config", config)
    for key in ("num_experts_per_tok", "num_experts_per_token", "moe_top_k", "top_k"):
        if text.get(key):
            return int(text[key])
    return None


def working_set_bytes(manifest: Manifest, rows: int = PREFILL_ROWS) -> int:
    """What one call of the largest layer holds besides the cache: every expert it selects as read, and once more
    as the copy its compute makes (a stack, or a float32 copy of a 16-bit expert: 2x), so 3x those experts; a pass
    of `rows` rows selects at most `rows` x top k of them, a decode step its top k and the next layer's read ahead;
    0 for a store without routed experts (a drafter cut without them)."""
    if not manifest.layers:
        return 0
    k = top_k(manifest.config)
    largest = max(manifest.layers, key=lambda layer: layer.file_bytes * layer.num_experts)
    selected = largest.num_experts if k is None else min(largest.num_experts, max(rows * k, 2 * k))
    return 3 * selected * largest.file_bytes


def reserved_bytes(manifest: Manifest, store: Path, reader_threads: int, context_tokens: int = 0) -> int:
    """Memory the streamed model needs besides the cache: trunk, KV cache, read buffers, working set.
    `context_tokens`: the most tokens the run holds (prompt and answer; 0: not known, `CONTEXT_TOKENS`)."""
    trunk, width = trunk_bytes(store / manifest.trunk["file"])
    largest_file = max(layer.file_bytes for layer in manifest.layers)
    kv = kv_cache_bytes(manifest.config, context_tokens or CONTEXT_TOKENS, width)
    return trunk + kv + reader_threads * largest_file + working_set_bytes(manifest, prefill_rows(context_tokens))


def prefill_rows(context_tokens: int) -> int:
    """The most rows one pass of a run of `context_tokens` tokens holds (0: not known)."""
    return min(context_tokens or PREFILL_ROWS, PREFILL_ROWS)


def size_budget(
    cache_bytes: int,
    manifest: Manifest,
    store: Path,
    reader_threads: int,
    context_tokens: int = 0,
    memory: Memory | None = None,
) -> Budget:
    """The budget for `cache_bytes` (AUTO_BUDGET or bytes); auto is sized from `memory` (default: what is available
    now; call before loading), for a run of at most `context_tokens` tokens (0: not known)."""
    every = held_expert_bytes(manifest)
    if cache_bytes != AUTO_BUDGET:
        return Budget(cache_bytes, False, every)
    memory = memory or memory_now()
    reserved = reserved_bytes(manifest, store, reader_threads, context_tokens)
    margin = margin_for(memory)
    spare = max(0, memory.available - reserved - margin)
    return Budget(
        min(every, spare),
        True,
        every,
        memory.available,
        reserved,
        margin,
        memory.limited,
        working_set_bytes(manifest, prefill_rows(context_tokens)),
    )


class Pressure:
    """Watches available memory for an auto budget, at most every `CHECK_EVERY_S`.

    `budget_now(used, layer, rows)`: the budget the cache should have now, at a call of `layer` with `rows` rows:
    what it holds plus what is available beyond the budget's floor, never more than its cap (`cap`). Below `used`
    when another process, or the run's own growth inside a cgroup limit, has taken memory (the cache gives back the
    shortfall); back up to the cap once that memory is free again. None between checks, except at a call wider than
    any before.
    """

    def __init__(
        self,
        budget: Budget,
        memory: Callable[[], Memory] = memory_now,
        held: Callable[[], int] | None = None,
        working_set: Callable[[int], int] | None = None,
    ):
        """`memory`: where the memory available now is read (a test's own cgroup tree); `held`: what the model holds
        now besides the cache, `working_set`: a pass of so many rows' (`working_set_bytes`); without both the budget
        never grows past its size at open."""
        self.budget = budget
        self.memory = memory
        self.held = held
        self.working_set = working_set
        self._next = 0.0
        self._widest = 0  # the most rows a call has had
        self._measured = 0  # the widest pass done (a later pass has begun)
        self._grown = 0  # the most the cap has grown to since the widest pass began
        self._layer, self._pass = -1, 0  # the last call's layer, and the rows of the pass it is in

    def budget_now(self, used: int, layer: int, rows: int) -> int | None:
        if layer <= self._layer:  # a new pass: the one before is done
            self._measured, self._pass = max(self._measured, self._pass), 0
        self._layer, self._pass = layer, max(self._pass, rows)
        wider = rows > self._widest
        if wider:
            self._widest, self._grown = rows, 0
        now = time.monotonic()
        if now < self._next and not wider:  # a wider pass is looked at at once: it may need the grown part back
            return None
        self._next = now + CHECK_EVERY_S
        headroom = self.memory().available - self.budget.floor
        return max(0, min(self.cap(used, headroom, rows), used + headroom))

    def cap(self, used: int, headroom: int, rows: int) -> int:
        """The most the cache may hold: its size at open; inside a cgroup limit, at a call no wider than a pass
        already run, what leaves free beyond the floor what the model does not hold now of its reserve (with the
        working set of the widest pass run), at most every expert. It only grows until a wider pass: the model's
        own ups and downs (MLX's freed buffers come and go) then move it no more, and the floor still binds."""
        if not self.budget.limited or self.held is None or self.working_set is None or rows > self._measured:
            return self.budget.bytes
        reserve = self.budget.reserved - self.budget.working_set + self.working_set(self._measured)
        still = max(0, reserve - self.held())
        self._grown = max(self._grown, min(self.budget.expert_bytes, used + headroom - still))
        return max(self.budget.bytes, self._grown)
