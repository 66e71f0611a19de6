"""nightshift's side of bench/streaming_peers.py (run with the project's python): the store streamed through the
public runtime (`open_model` with a cache of `budget` bytes, or -1: `--memory-budget auto`, sized for the job's prompt
and tokens; the defaults otherwise or the job's `settings`: stream settings by field name, e.g. {"prefetch": false}),
greedy over the prompt's token ids, or fed the job's `forced` ids in turn (`generate_tokens`' `forced`);
at a width over 1, the job's `prompts` decoded together (engine/batch.py, as the service batches reviews).
With a `trace` path in the job, every streaming layer call's (layer, experts, rows) is written there as JSON lines,
in the order the cache was asked (the format `nightshift bench cache --routing` and bench/peer_traces.py replay)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from side import Clock, report, work

from nightshift.engine.batch import batch_tokens
from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import Model, open_model


def main() -> None:
    job = work()
    instruments = Instruments(routing=[] if job.get("trace") else None)
    model = open_model(
        Path(job["model"]),
        StreamSettings(
            cache_bytes=job["budget"],
            context_tokens=len(job["prompt"]) + job["tokens"] if job["width"] == 1 else 0,
            **job.get("settings", {}),
        ),
        instruments=instruments,
    )
    try:
        if job["width"] > 1:
            return batch(model, job)
        clock = Clock()
        tokens, stats = [], None
        for chunk in model.generate_tokens(job["prompt"], max_tokens=job["tokens"], forced=job.get("forced")):
            tokens.append(chunk.token)
            clock.token()
            stats = chunk.stats
        assert stats is not None
        if job.get("trace"):
            calls = (
                {"layer": layer, "experts": list(experts), "rows": rows, "counts": list(counts)}
                for layer, experts, rows, counts in instruments.routing
            )
            Path(job["trace"]).write_text("".join(json.dumps(call) + "\n" for call in calls))
        report(clock, [tokens], {"hits": stats.cache_hits, "misses": stats.cache_misses,
                                 "read_bytes": sum(stats.drive_bytes.values()), "cache_used": stats.cache_used,
                                 "budget": asdict(model.stream.budget), "cache_budget": stats.cache_budget,
                                 "prefetch_recall": stats.prefetch_recall})  # fmt: skip
    finally:
        model.close()


def batch(model: Model, job: dict) -> None:
    """The job's `prompts` decoded together (width = how many), as the service batches reviews due together."""
    before = model.figures()
    clock = Clock()
    tokens = batch_tokens(model.model, job["prompts"], job["tokens"], model.stream, on_token=lambda s, t: clock.token())
    after = model.figures(settled=True)
    hits, misses = after.cache_hits - before.cache_hits, after.cache_misses - before.cache_misses
    report(clock, tokens, {"hits": hits, "misses": misses})


if __name__ == "__main__":
    main()
