"""A store's routing profile of past runs, and the warm start that fills the expert cache from it at open.

The profile holds, per MoE layer, how often each expert was looked up, past runs' counts halved each time a run
adds its own (recent use weighs most). Its size is one number per expert of the model, whatever the number of runs.
It is written atomically when a streamed model closes, so a run that dies leaves the last complete profile, and it
is written in the data dir, keyed by the store's path (`profile_path`): a run never writes the store, which may be
read-only media or shared by several processes. A `routing-profile.json` in the store itself (shipped with it, or
learned there by an older nightshift) is the store's default until a run has learned its own.

At open, `WarmFill` reads the profile's most used experts, hottest first and within the cache's budget, on
the reader's prefetch queues in a background thread: the first token does not wait for it. A read is placed
like any other (a demand for an expert being warmed joins that read, so no expert is read twice); what it
read is handed to the stream, which keeps it in the cache on its own thread at its next layer call, never
while a layer is using the cache. The profile also seeds the cache's lookup counts (`ExpertCache.prior`),
so frequency admission protects those experts from one-off newcomers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from pathlib import Path

from nightshift.engine.home import data_dir
from nightshift.engine.moe.cache import DECAY_EVERY, Key
from nightshift.engine.moe.reader import ExpertReader
from nightshift.engine.moe.reads import ExpertReadError, LoadedExpert
from nightshift.engine.store.manifest import write_json_atomic

PROFILE_FILE = "routing-profile.json"  # a store's shipped default, in the store; read, never written
PROFILES = "routing-profiles"  # the learned profiles' folder in the data dir
FORMAT = 1
PAST_WEIGHT = 0.5  # past runs' counts are halved when a run adds its own
# The profile enters the cache's counts as four decay periods of lookups: on the bench model's review traces
# 4-16x one period beat 1x by 0.3-0.6 points at 10 % (docs/results.md, [13] cache policy and warm start).
PRIOR_LOOKUPS = 4 * DECAY_EVERY

log = logging.getLogger(__name__)
Landed = tuple[Key, "Future[LoadedExpert]", LoadedExpert]  # a warm read, landed, not yet kept by the stream


@dataclass
class RoutingProfile:
    """Lookups per (layer, expert) over past runs (decayed), and how many runs made it."""

    counts: dict[Key, float] = field(default_factory=dict)
    runs: int = 0

    def merged(self, run: dict[Key, int]) -> RoutingProfile:
        """This profile with one more run's lookups added (past runs' counts weighted by PAST_WEIGHT)."""
        counts = {key: PAST_WEIGHT * count for key, count in self.counts.items()}
        for key, count in run.items():
            counts[key] = counts.get(key, 0.0) + count
        return RoutingProfile(counts, self.runs + 1)

    def hottest(self, sizes: dict[int, int], budget: int) -> list[Key]:
        """The most looked-up experts, most first, as many as `budget` bytes hold (sizes: bytes per layer)."""
        keys, used = [], 0
        for key in sorted(self.counts, key=lambda k: (-self.counts[k], k)):
            if key[0] in sizes and used + sizes[key[0]] <= budget:
                keys.append(key)
                used += sizes[key[0]]
        return keys

    def prior(self, lookups: float = PRIOR_LOOKUPS) -> dict[Key, float]:
        """The counts scaled to `lookups` in all: what `ExpertCache.prior` starts from."""
        total = sum(self.counts.values())
        return {key: lookups * count / total for key, count in self.counts.items()} if total else {}


def counts_of(lookups: Iterable[tuple[int, Iterable[int]]]) -> dict[Key, int]:
    """Lookups per (layer, expert) of (layer, experts) calls."""
    counts: dict[Key, int] = {}
    for layer, experts in lookups:
        for expert in experts:
            counts[(layer, expert)] = counts.get((layer, expert), 0) + 1
    return counts


def profile_path(store: Path) -> Path:
    """Where runs of `store` keep its learned profile: in the data dir, named by the store's folder and a hash of its
    resolved path (two stores of one name stay apart, and a store keeps its profile whatever path it is opened by)."""
    where = Path(store).resolve()
    key = hashlib.sha256(str(where).encode()).hexdigest()[:16]
    return data_dir() / PROFILES / f"{where.name}-{key}.json"


def load_profile(store: Path) -> RoutingProfile | None:
    """The store's learned profile, else the one shipped in the store, else None; an unreadable one is reported in
    the log and ignored (it only guides the cache, and the next run's close writes a sound one)."""
    learned = _read_profile(profile_path(store))
    return learned if learned is not None else _read_profile(Path(store) / PROFILE_FILE)


def _read_profile(path: Path) -> RoutingProfile | None:
    """The profile at `path`; None where there is none or it cannot be read (logged)."""
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        counts = {
            (int(layer), expert): float(count)
            for layer, row in data["layers"].items()
            for expert, count in enumerate(row)
            if count
        }
        return RoutingProfile(counts, int(data["runs"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("routing profile %s ignored (%s); the next run rewrites it", path, exc)
        return None


def save_profile(store: Path, profile: RoutingProfile, experts_per_layer: dict[int, int]) -> None:
    """Write `profile` as the store's learned one (`profile_path`), atomically (one row of counts per layer, rounded);
    a data dir that cannot be written to keeps the old one, with a warning in the log."""
    layers = {
        str(layer): [round(profile.counts.get((layer, e), 0.0), 3) for e in range(n)]
        for layer, n in sorted(experts_per_layer.items())
    }
    path = profile_path(store)
    try:
        path.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the data dir owner-only, as the app's
        path.parent.mkdir(mode=0o700, exist_ok=True)
        write_json_atomic(path, {"format": FORMAT, "runs": profile.runs, "layers": layers})
    except OSError as exc:
        log.warning("routing profile of %s not saved in %s (%s)", store, path.parent, exc)


@dataclass
class WarmCounts:
    """What the warm start did: experts read and their bytes, those the stream kept, and reads given up
    (a demand took the read over, or it failed: the demand path reads it and reports any error)."""

    read: int = 0
    bytes: int = 0
    kept: int = 0
    kept_bytes: int = 0
    given_up: int = 0
    done: bool = False


class WarmFill:
    """Reads `keys` (hottest first) in a background thread on the reader's prefetch queues, at most `window`
    at a time; the stream takes what landed with `take()` and keeps it in its cache."""

    def __init__(self, reader: ExpertReader, keys: list[Key], window: int, skip: Callable[[Key], bool]):
        """`skip(key)`: the stream has this expert already (asked under the reader's lock, see `reader.warm`)."""
        self.reader = reader
        self.keys = keys
        self.skip = skip
        self.window = max(1, window)
        self.counts = WarmCounts()
        self._landed: queue.SimpleQueue[Landed] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ns-warm", daemon=True)
        self._thread.start()

    def take(self) -> list[Landed]:
        """The experts read since the last call."""
        out = []
        while True:
            try:
                out.append(self._landed.get_nowait())
            except queue.Empty:
                return out

    def wait(self) -> None:
        """Wait until every read is placed and landed (benchmarks and tests: a warm start that finished first)."""
        self._thread.join()

    def close(self) -> None:
        """Stop placing reads and wait for those in flight."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        inflight: list[tuple[Key, Future[LoadedExpert]]] = []
        for key in self.keys:
            if self._stop.is_set():
                break
            future = self.reader.warm(key, self.skip)
            if future is not None:
                inflight.append((key, future))
            while len(inflight) >= self.window or (inflight and self._stop.is_set()):
                self._land(*inflight.pop(0))
        for key, future in inflight:
            self._land(key, future)
        self.counts.done = True

    def _land(self, key: Key, future: Future[LoadedExpert]) -> None:
        """Wait for one read; hand it over (it stays in the reader's in-flight reads, so a demand joins it,
        until the stream keeps it), or give it up when a demand took it over or it failed."""
        try:
            loaded = future.result()
        except (CancelledError, ExpertReadError):
            self.counts.given_up += 1
            self.reader.settle_warm(key, future)
            return
        self.counts.read += 1
        self.counts.bytes += loaded.nbytes
        self._landed.put((key, future, loaded))
