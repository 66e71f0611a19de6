"""Where an expert's read goes: the replica expected to finish first, whole or cut in parts.

A read's replica is chosen when the read is submitted, not when a thread picks it up, so a layer's whole set
of experts is spread over the drives at once (choosing at start time, with fewer threads than reads, piled
them on whichever drive looked fastest). Every choice is booked with the dispatcher, so in-flight bytes per
drive count every queued and running read. Optionally an expert with replicas on two devices is read as two
halves at once (`split_reads`).

Balanced reads (`balance_reads`, water-filling): a layer's demand reads (and, as a set of their own, the
read-aheads of its next-layer guesses) are placed whole, one by one on the drive expected to finish first;
where that leaves some drives ending later than the level every drive would reach if the bytes could be
shared out exactly (8 reads over 3 drives: 3/3/2), the last read placed on each such drive is cut in
page-aligned parts and only its excess goes to the drives that would end early (there: two reads split
2/3 + 1/3, the thirds to the drive with 2). So a layer has at most one split read per late drive, never a
part under a sixth of a read. (Splitting every leftover read into one part per device, round 3's "split
remainder", put many small reads last behind blk-throttle and lost 10 %.)
"""

from __future__ import annotations

import os
from pathlib import Path

from nightshift.engine.io.direct import ALIGNMENT as ALIGN
from nightshift.engine.moe.dispatch import Dispatcher
from nightshift.engine.moe.reads import ExpertReadError, Key, Ticket
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.store.manifest import Manifest, MoeLayer
from nightshift.engine.store.placement import existing_parent

MIN_PART_SHARE = 6  # a balanced read's parts are at least 1/6 of the file: smaller ones gain less than they cost


class Placer:
    """Places one model's expert reads on its drives; the caller holds the reader's lock (the dispatcher's books
    and the balanced level are read and changed together)."""

    def __init__(self, manifest: Manifest, settings: StreamSettings, dispatcher: Dispatcher):
        self.manifest = manifest
        self.settings = settings
        self.dispatcher = dispatcher
        self.devices = {name: _device(root) for name, root in manifest.drives.items()}
        self._paths: dict[Key, list[tuple[str, Path]]] = {}  # replica paths, built once (~17 ms a token at 50 %)

    def replicas(self, layer: int, expert: int) -> list[tuple[str, Path]]:
        """(drive, path) of the replicas this reader may use (`use_drives`); an error if there are none."""
        key = (layer, expert)
        replicas = self._paths.get(key) or self._paths.setdefault(key, self.manifest.replica_paths(layer, expert))
        allowed = self.settings.use_drives
        usable = [(d, p) for d, p in replicas if d in allowed] if allowed else replicas
        if not usable:
            raise ExpertReadError(
                f"expert {expert} of layer {layer} has replicas only on {', '.join(d for d, _ in replicas)}, "
                f"none of the drives in use ({', '.join(allowed)}); place the store on them with `nightshift model place`"
            )
        return usable

    def one(self, spec: MoeLayer, expert: int) -> list[Ticket]:
        """One read placed on its own: whole, or two halves on two devices with `split_reads`."""
        replicas = self.replicas(spec.layer, expert)
        tickets = self._split_pair(replicas, spec.file_bytes // 2) if self.settings.split_reads else None
        return tickets or [self._whole(replicas, spec.file_bytes)]

    def balanced(self, spec: MoeLayer, experts: list[int]) -> dict[int, list[Ticket]]:
        """A set of reads placed whole, then the last read of each drive that would end late cut so its excess
        goes to drives that would end early (water-filling; module docstring)."""
        placed = {e: [self._whole(self.replicas(spec.layer, e), spec.file_bytes)] for e in experts}
        estimates = self.dispatcher.snapshot()
        in_use = [d for d in self.settings.use_drives or self.manifest.drives if d in estimates]
        level = sum(estimates[d].in_flight for d in in_use) / sum(estimates[d].bandwidth for d in in_use)
        # bytes each drive holds beyond (+) or short of (-) the level, in pages
        surplus = {d: int((estimates[d].in_flight - level * estimates[d].bandwidth) // ALIGN) for d in in_use}
        smallest = max(1, spec.file_bytes // ALIGN // MIN_PART_SHARE)
        for donor in sorted(in_use, key=lambda d: -surplus[d]):
            ours = [e for e, tickets in placed.items() if len(tickets) == 1 and tickets[0].drive == donor]
            if surplus[donor] < smallest or not ours:
                continue
            expert = ours[-1]
            parts = self._water_fill(spec.layer, expert, placed[expert][0], surplus, smallest)
            if len(parts) > 1:
                placed[expert] = parts
        return placed

    def _whole(self, replicas: list[tuple[str, Path]], nbytes: int) -> Ticket:
        """A whole-file read on the replica the dispatcher expects to finish first."""
        drive = self.dispatcher.choose([d for d, _ in replicas], nbytes)
        return Ticket(drive, dict(replicas)[drive], nbytes)

    def _split_pair(self, replicas: list[tuple[str, Path]], half: int) -> list[Ticket] | None:
        """Halves placed on two replicas on different devices (dispatcher's choice), or None when there are not two."""
        first = self.dispatcher.choose([d for d, _ in replicas], half)
        others = [d for d, _ in replicas if self.devices[d] != self.devices[first]]
        if not others:
            self.dispatcher.finished(first, half, ok=False)
            return None
        second = self.dispatcher.choose(others, half)
        paths = dict(replicas)
        return [Ticket(first, paths[first], half), Ticket(second, paths[second], half, half)]

    def _water_fill(
        self, layer: int, expert: int, whole: Ticket, surplus: dict[str, int], smallest: int
    ) -> list[Ticket]:
        """`whole` cut so the donor keeps its first pages and drives short of the level (holding a replica, on
        another device) read the rest, each at least `smallest` pages; `surplus` and the dispatcher follow."""
        replicas = dict(self.replicas(layer, expert))
        pages = whole.nbytes // ALIGN
        give = min(surplus[whole.drive], pages - smallest)
        takers = sorted(
            (d for d in replicas if surplus.get(d, 0) <= -smallest and self.devices[d] != self.devices[whole.drive]),
            key=lambda d: surplus[d],
        )
        cuts = []
        for taker in takers:
            share = min(give, -surplus[taker])
            if share < smallest:
                break
            cuts.append((taker, share))
            give -= share
        keep = pages - sum(share for _, share in cuts)
        if not cuts:
            return [whole]
        self.dispatcher.finished(whole.drive, (pages - keep) * ALIGN, ok=False)  # those bytes move to the takers
        surplus[whole.drive] -= pages - keep
        parts, at = [Ticket(whole.drive, whole.path, keep * ALIGN)], keep
        for taker, share in cuts:
            self.dispatcher.choose([taker], share * ALIGN)
            surplus[taker] += share
            parts.append(Ticket(taker, replicas[taker], share * ALIGN, at * ALIGN))
            at += share
        return parts


def _device(root: str) -> int:
    """st_dev of a drive root: replicas on one device do not read in parallel."""
    return os.stat(existing_parent(Path(root))).st_dev
