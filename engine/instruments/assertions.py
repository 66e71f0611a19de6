"""Config assertions: a benchmark names the settings under test and the counters proving each fired.

A figure measured with split reads on, say, is only a split-read figure if the
reader actually split some reads; otherwise it is a mislabelled baseline. So a
result is recorded only when every declared proof holds on the run's counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from nightshift.engine.errors import NightshiftError


class AssertionFailed(NightshiftError):
    """A benchmark's settings did not demonstrably take effect; the result is not recorded."""


@dataclass(frozen=True)
class Proof:
    """Setting `setting` is proven by counter `counter` reaching at least `minimum`."""

    setting: str
    counter: str
    minimum: float = 1

    def holds(self, counters: dict[str, float]) -> bool:
        return counters.get(self.counter, 0) >= self.minimum


def failures(proofs: list[Proof], counters: dict[str, float]) -> list[str]:
    """One line per proof that does not hold."""
    return [
        f"{p.setting}: counter {p.counter} = {counters.get(p.counter, 0)}, needs >= {p.minimum}"
        for p in proofs
        if not p.holds(counters)
    ]


def require(proofs: list[Proof], counters: dict[str, float]) -> None:
    """Raise AssertionFailed naming every setting that did not fire."""
    failed = failures(proofs, counters)
    if failed:
        raise AssertionFailed(
            "the run is not recorded: its settings did not all take effect (" + "; ".join(failed) + "); "
            "check the rig and the model (e.g. split reads need replicas on two devices)"
        )
