"""nightshift's side of bench/streaming_peers.py (run with the project's python): the store streamed through the
public runtime (`open_model` with a cache of `budget` bytes, the defaults otherwise), greedy, the prompt's token ids."""

from __future__ import annotations

from pathlib import Path

from side import Clock, report, work

from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import open_model


def main() -> None:
    job = work()
    model = open_model(Path(job["model"]), StreamSettings(cache_bytes=job["budget"]))
    try:
        clock = Clock()
        tokens, stats = [], None
        for chunk in model.generate_tokens(job["prompt"], max_tokens=job["tokens"]):
            tokens.append(chunk.token)
            clock.token()
            stats = chunk.stats
        assert stats is not None
        report(clock, [tokens], {"hits": stats.cache_hits, "misses": stats.cache_misses,
                                 "read_bytes": sum(stats.drive_bytes.values()), "cache_used": stats.cache_used,
                                 "prefetch_recall": stats.prefetch_recall})  # fmt: skip
    finally:
        model.close()


if __name__ == "__main__":
    main()
