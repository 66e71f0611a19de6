"""How the streaming engine reads experts: every knob a benchmark may A/B, in one place."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from nightshift.engine.errors import NightshiftError

DISPATCH_POLICIES = ("least_completion", "first_replica")
CACHE_POLICIES = ("lru", "frequency")
CHECKSUM_MODES = ("off", "first", "always")


@dataclass(frozen=True)
class StreamSettings:
    """Settings of one streaming configuration; `fingerprint()` in the catalogue keys on them.

    demand_threads, prefetch_threads: reader threads per drive for each queue (reads in flight per drive).
    shared_pool: demand and prefetch reads go to one queue per drive (the A/B against separate pools).
    split_reads: every read as two halves from replicas on two devices.
    prefetch_off: layers whose next-layer prediction is not issued (where it does not pay).
    prefetch_limit: most predicted experts read ahead per pass, most confident first (0: all top-k).
    prefetch_fill: in a one-row (decode) pass, read ahead only as many as the drives can deliver in the
        measured compute window before the next layer asks (its bandwidth x window / expert bytes).
    prefetch_tail: in a one-row pass, the next layer's guesses (most confident first) are also read by
        drives that have finished their share of this layer while another drive still reads its own.
    overlap: in a one-row (decode) pass, run each expert as soon as it is here (cached, or its read landed)
        while the others are still being read; the layer still sums the experts in slot order, and one
        expert run alone gives the same bits as in the stack, so output is unchanged.
    prefill_prefetch: read the next layer's predicted union ahead during passes of many rows (a prefill
        chunk, a speculative verify) even with `prefetch` off: such a pass computes long enough to hide it.
    """

    demand_threads: int = 4
    prefetch_threads: int = 2
    shared_pool: bool = False
    dispatch: str = "least_completion"
    split_reads: bool = False
    # On by default since prefetch fill: on the bench model (disk floor 3.6x compute), before overlap, decode
    # went from 0.75 of the disk floor without it to 0.87-0.91 with it; on small2, whose compute window is
    # short, it measured -2.5 % to +3.5 %, within the noise (docs/results.md, third round).
    prefetch: bool = True
    prefetch_off: frozenset[int] = field(default_factory=frozenset)
    prefetch_limit: int = 0
    prefetch_fill: bool = True
    prefill_prefetch: bool = True
    # On: +10.8 % on the bench model at 3 drives (0.888 -> 0.986 of the disk floor), -0.2 % at 4, where a
    # layer's 16 experts divide evenly and the tail is short (docs/results.md, fourth round, runs 36-39).
    prefetch_tail: bool = True
    overlap: bool = True
    cache_bytes: int = 0
    # Frequency-aware won over LRU by 28.6 % at a 30 MB budget on small2 (docs/results.md, runs 21/22).
    cache_policy: str = "frequency"
    # "first": each replica file is checked against the manifest's sha256 the first time this process
    # reads it (catches a corrupt copy for the cost of one hash per file); "always": every read.
    verify_checksums: str = "off"
    trace: bool = False
    use_drives: tuple[str, ...] = ()  # read only from these drives (empty: all); the drive ladder's knob

    def __post_init__(self):
        if self.prefetch_limit < 0:
            raise NightshiftError("the prefetch limit must be 0 (the whole top-k) or more experts")
        if self.demand_threads < 1 or self.prefetch_threads < 1:
            raise NightshiftError("demand and prefetch threads must be at least 1 each")
        if self.dispatch not in DISPATCH_POLICIES:
            raise NightshiftError(f"dispatch policy {self.dispatch!r}: choose one of {', '.join(DISPATCH_POLICIES)}")
        if self.cache_policy not in CACHE_POLICIES:
            raise NightshiftError(f"cache policy {self.cache_policy!r}: choose one of {', '.join(CACHE_POLICIES)}")
        if self.verify_checksums not in CHECKSUM_MODES:
            raise NightshiftError(f"checksum mode {self.verify_checksums!r}: choose one of {', '.join(CHECKSUM_MODES)}")
        if self.cache_bytes < 0:
            raise NightshiftError("the expert cache budget must be 0 (off) or more bytes")
        object.__setattr__(self, "prefetch_off", frozenset(self.prefetch_off))
        object.__setattr__(self, "use_drives", tuple(self.use_drives))

    def as_dict(self) -> dict:
        """Plain JSON-ready values (sets as sorted lists)."""
        data = asdict(self)
        data["prefetch_off"] = sorted(self.prefetch_off)
        return data
