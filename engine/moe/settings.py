"""How the streaming engine reads experts: every knob a benchmark may A/B, in one place.

Each setting carries its command-line option in its field metadata (`Option`): the bench and verify
commands build their flags from `dataclasses.fields(StreamSettings)`, so a name, default, choice or
help text is written here once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from nightshift.engine.errors import NightshiftError

LEAST_COMPLETION, FIRST_REPLICA = "least_completion", "first_replica"
DISPATCH_POLICIES = (LEAST_COMPLETION, FIRST_REPLICA)
LRU, LRU_ADMIT, FREQUENCY, FREQUENCY_OPEN, S3FIFO = "lru", "lru-admit", "frequency", "frequency-open", "s3fifo"
LRFU = "lrfu"
ODDS, READS, GUESSES = "odds", "reads", "guesses"
PREFETCH_CAPS = (ODDS, READS, GUESSES)
CACHE_POLICIES = (LRU, LRU_ADMIT, FREQUENCY, FREQUENCY_OPEN, LRFU, S3FIFO)
AUTO_BUDGET = -1  # cache_bytes: size the expert cache from the RAM available at open (engine/moe/budget.py)
CHECKSUM_MODES = ("off", "first", "always")


UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_budget(text: str) -> int:
    """`auto` -> AUTO_BUDGET; `0` -> no cache; `12G`, `500M`, `1.5G`, `4096K` or bytes -> bytes (binary units)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    if value == "AUTO":
        return AUTO_BUDGET
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)", value)
    if match is None:
        raise NightshiftError(f"memory budget {text!r}: give auto, 0 (no cache), or a size such as 12G, 500M or 1.5G")
    return int(float(match[1]) * UNITS[match[2]])


def describe_budget(cache_bytes: int) -> str:
    """The setting as a user writes it: auto, 0, or a size."""
    if cache_bytes == AUTO_BUDGET or cache_bytes == 0:
        return "auto" if cache_bytes else "0"
    return f"{cache_bytes / (1 << 30):.2f}G" if cache_bytes >= 1 << 30 else f"{cache_bytes / (1 << 20):.0f}M"


@dataclass(frozen=True)
class Option:
    """How one setting appears as a command-line flag.

    flag: the flag's name where it is not the field's name with dashes (`--memory-budget` for `cache_bytes`).
    scale: what one unit of the flag is in the setting's unit (1e6 bytes per MB).
    parse: the flag's text to the setting's value, where the setting has its own notation (`auto`, `12G`);
    show: the value as that notation writes it (for the help's default).
    """

    help: str
    choices: tuple[str, ...] = ()
    flag: str = ""
    scale: float = 1
    parse: Callable[[str], Any] | None = None
    show: Callable[[Any], str] | None = None


def option(
    help: str,
    choices: tuple[str, ...] = (),
    flag: str = "",
    scale: float = 1,
    parse: Callable[[str], Any] | None = None,
    show: Callable[[Any], str] | None = None,
) -> dict[str, Option]:
    """Field metadata holding the setting's `Option`."""
    return {"option": Option(help, choices, flag, scale, parse, show)}


@dataclass(frozen=True)
class StreamSettings:
    """Settings of one streaming configuration; `fingerprint()` in the catalogue keys on them.

    Each field's option help says what it does; why the defaults are what they are is noted beside them.
    overlap keeps output unchanged: the layer still sums the experts in slot order, and one expert run
    alone gives the same bits as in the stack. prefill_prefetch reads ahead even with `prefetch` off
    because a pass of many rows (a prefill chunk, a speculative verify) computes long enough to hide it.
    """

    demand_threads: int = field(default=4, metadata=option("demand reader threads per drive (reads in flight)"))
    prefetch_threads: int = field(default=2, metadata=option("prefetch reader threads per drive"))
    shared_pool: bool = field(
        default=False, metadata=option("demand and prefetch reads share one queue per drive (the A/B against two)")
    )
    dispatch: str = field(
        default=LEAST_COMPLETION,
        metadata=option(
            "which replica a read goes to (least_completion: the drive expected to finish first)", DISPATCH_POLICIES
        ),
    )
    split_reads: bool = field(
        default=False, metadata=option("read every expert as two halves from replicas on two devices")
    )
    # On: +11.5 % on small2 at 3 drives (0.87 -> 0.97 of the roofline: 3/3/2 whole reads became 2 2/3 each),
    # +3.4 % at 4; on the bench model at 3 drives -1.6 %, within the noise, under a load that tripled its compute
    # floor (docs/results.md, [17], runs 2-7 of the second session). `model tune` tries it off per store.
    balance_reads: bool = field(
        default=True,
        metadata=option(
            "cut the last read of a drive that would end a layer late into page-aligned parts read by the drives "
            "that would end early, so all end together (water-filling: 8 reads over 3 drives read as 2 2/3 each)"
        ),
    )
    # On by default since prefetch fill: on the bench model (disk floor 3.6x compute), before overlap, decode
    # went from 0.75 of the disk floor without it to 0.87-0.91 with it; on small2, whose compute window is
    # short, it measured -2.5 % to +3.5 %, within the noise (docs/results.md, third round).
    prefetch: bool = field(
        default=True, metadata=option("read the next layer's predicted experts during this layer's compute")
    )
    prefetch_off: frozenset[int] = field(
        default_factory=frozenset,
        metadata=option("layers whose next-layer prediction is not issued, comma-separated (where it does not pay)"),
    )
    prefetch_limit: int = field(
        default=0,
        metadata=option("most predicted experts read ahead per layer pass, most confident first (0: all top-k)"),
    )
    prefetch_fill: bool = field(
        default=True,
        metadata=option(
            "in decode, read ahead only what the drives deliver in the measured compute window before the next "
            "layer asks (bandwidth x window / expert bytes)"
        ),
    )
    # Odds: side by side on the random bench model at 25 %, `reads` (c4620da's cap) read 8x the read-aheads of
    # `guesses` (the cap before it) and reached 0.924 of the roofline against 0.944; `odds` 0.945; on bench-replay
    # at 50 % odds 0.835, reads 0.764, guesses 0.676 (one row a side: docs/results.md, "Read-aheads that pay").
    prefetch_cap: str = field(
        default=ODDS,
        metadata=option(
            "how the fill bounds a decode step's read-ahead: odds (an uncached guess is read only while the time a "
            "right one saves beats what a wrong one costs: the next layer's reads past the window, and its read's "
            "CPU; from how often guesses of its rank were used), reads (as many uncached guesses as the window "
            "holds, at least one), guesses (the window counts the most confident guesses, cached ones included)",
            PREFETCH_CAPS,
        ),
    )
    # On: on bench-replay (trained routing) at 50 %, one replica per expert, 4 x 12 MB/s, three pairs alternated
    # in two invocations: 2 866 / 3 195 / 2 843 ms a token against 4 143 / 4 466 / 3 139 off (-31 / -28 / -9 %),
    # tokens identical (docs/results.md, "Aborting the read-aheads a layer did not use").
    prefetch_abort: bool = field(
        default=True,
        metadata=option(
            "a read-ahead its layer did not use, still being read when the layer asks, stops at its next chunk "
            "(512 KiB) so the drive goes to the layer's own reads"
        ),
    )
    # Off, both: on bench-replay at 50 % (4 x 12 MB/s) the two together against neither measured 0.62 / 0.85 / 1.18 a
    # token on one replica per expert and 0.67 / 1.04 / 1.06 on four, in alternated pairs under load 2-15, and 1.53 at
    # 25 % (one pair): no direction (docs/results.md, "What is left of a read").
    load_left: bool = field(
        default=False,
        metadata=option(
            "a drive's load (what reads are placed and the tail timed by) counts what is left of its reads: an "
            "abortable read-ahead's chunks as they land, an aborted one's rest at once, and a layer's unused "
            "read-aheads leave before its demand reads are placed"
        ),
    )
    spare_demand_drives: bool = field(
        default=False,
        metadata=option(
            "in decode, a read-ahead is read on a drive that likely holds one of the next layer's demand reads (an "
            "uncached guess not read ahead) only if that drive is expected to finish it before the next layer asks"
        ),
    )
    prefill_prefetch: bool = field(
        default=True,
        metadata=option("read the next layer's predicted union ahead in passes of many rows, even with prefetch off"),
    )
    # On: +10.8 % on the bench model at 3 drives (0.888 -> 0.986 of the disk floor), -0.2 % at 4, where a
    # layer's 16 experts divide evenly and the tail is short (docs/results.md, fourth round, runs 36-39).
    prefetch_tail: bool = field(
        default=True,
        metadata=option("in decode, drives done with a layer's reads start on the next layer's guesses"),
    )
    overlap: bool = field(
        default=True,
        metadata=option(
            "in decode (and prompts on 16-bit float experts), run each expert as it lands while the rest are read"
        ),
    )
    cache_bytes: int = field(
        default=AUTO_BUDGET,
        metadata=option(
            "RAM for the expert cache: auto (from the RAM available at open, given back under memory pressure), "
            "0 (off) or a size such as 12G or 500M",
            flag="memory-budget",
            parse=parse_budget,
            show=describe_budget,
        ),
    )
    context_tokens: int = field(
        default=0,
        metadata=option(
            "the most tokens one run holds, prompt and answer: the KV cache an auto budget reserves (0: not known, "
            "a bound of 8192)"
        ),
    )
    # LRFU: on trained routing (bench-replay's traces, 7 312 tokens) it keeps 78/91/97 % of Belady's hits at 10/25/50 %
    # of the expert bytes against `frequency`'s 76/89/96 %, and wins or ties on i.i.d. random and on the bench
    # model's skewed random routers (docs/results.md, "Cache policy on trained routing"); `frequency` had won over
    # LRU by 28.6 % at a 30 MB budget on small2 ([13], runs 21/22).
    cache_policy: str = field(
        default=LRFU,
        metadata=option("what the RAM cache evicts and admits (lrfu: measured best)", CACHE_POLICIES),
    )
    # Off: on the bench model at 10 % it doubled a fresh open's first-answer hit rate and cut its bytes by 17 %,
    # but moved its time by only 3-5 % on a compute-bound machine; a profile of unlike runs lowers the hit rate
    # (docs/results.md, [13] cache policy and warm start).
    warm_start: bool = field(
        default=False,
        metadata=option(
            "fill the expert cache at open, in the background, with the experts the store's past runs used most "
            "(its routing profile), and start the cache's counts from them"
        ),
    )
    # "first" catches a corrupt copy for the cost of one hash per file.
    verify_checksums: str = field(
        default="off",
        metadata=option(
            "check replica files against the manifest's sha256: the first time this process reads each, or always",
            CHECKSUM_MODES,
        ),
    )
    trace: bool = field(default=False, metadata=option("keep the barrier trace of every pass, not only recent ones"))
    use_drives: tuple[str, ...] = field(
        default=(), metadata=option("drive names to read from, comma-separated (default: all); the ladder's knob")
    )

    def __post_init__(self):
        if self.prefetch_limit < 0:
            raise NightshiftError("the prefetch limit must be 0 (the whole top-k) or more experts")
        if self.demand_threads < 1 or self.prefetch_threads < 1:
            raise NightshiftError("demand and prefetch threads must be at least 1 each")
        if self.dispatch not in DISPATCH_POLICIES:
            raise NightshiftError(f"dispatch policy {self.dispatch!r}: choose one of {', '.join(DISPATCH_POLICIES)}")
        if self.prefetch_cap not in PREFETCH_CAPS:
            raise NightshiftError(f"prefetch cap {self.prefetch_cap!r}: choose one of {', '.join(PREFETCH_CAPS)}")
        if self.cache_policy not in CACHE_POLICIES:
            raise NightshiftError(f"cache policy {self.cache_policy!r}: choose one of {', '.join(CACHE_POLICIES)}")
        if self.verify_checksums not in CHECKSUM_MODES:
            raise NightshiftError(f"checksum mode {self.verify_checksums!r}: choose one of {', '.join(CHECKSUM_MODES)}")
        if self.context_tokens < 0:
            raise NightshiftError("the context must be 0 (not known) or more tokens")
        if self.cache_bytes < 0 and self.cache_bytes != AUTO_BUDGET:
            raise NightshiftError("the expert cache budget must be auto, 0 (off) or more bytes")
        object.__setattr__(self, "prefetch_off", frozenset(self.prefetch_off))
        object.__setattr__(self, "use_drives", tuple(self.use_drives))

    def as_dict(self) -> dict:
        """Plain JSON-ready values (sets as sorted lists)."""
        data = asdict(self)
        data["prefetch_off"] = sorted(self.prefetch_off)
        return data
