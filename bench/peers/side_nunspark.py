"""nunspark's side of bench/streaming_peers.py (run with the nunspark venv's python): its packed model streamed with a
RAM budget of `budget` bytes for its expert-piece cache (the whole budget over its `expert_cache_frac`), its temporal
expert prefetch on (its default), greedy, the prompt's token ids as given (no chat template). With a `trace` path in
the job, its own expert trace (`--expert-trace`: per MoE layer call, the experts fired) is written there. At a width
over 1, the job's `prompts` go through its `batched_generate` (its "8 jobs decoded together"), timed as a whole.
A Mixtral copy runs through the registry entry bench/peers/nunspark_mixtral.py adds (nunspark 0.13.0 has none)."""

from __future__ import annotations

from pathlib import Path

from nunspark.engine import StreamingEngine
from nunspark.generate import batched_generate, stream_generate
from nunspark.manifest import Manifest
from nunspark_mixtral import register
from side import Clock, report, work

EXPERT_CACHE_FRAC = 0.9  # nunspark's default share of its budget held for expert pieces


def main() -> None:
    job = work()
    register()
    root = Path(job["model"])
    budget = int(job["budget"] / EXPERT_CACHE_FRAC) if job["budget"] else 1  # 0: its smallest budget
    engine = StreamingEngine(root, Manifest.load(root / "manifest.json"), budget_bytes=budget,
                             expert_cache_frac=EXPERT_CACHE_FRAC, expert_trace=job.get("trace"))  # fmt: skip
    try:
        clock = Clock()
        if job["width"] > 1:  # its batched decode: one weight sweep per step for every row; timed as a whole
            batched = batched_generate(engine, job["prompts"], max_tokens=job["tokens"], temp=0.0)
            clock.token()
            cache = engine.cache
            report(clock, [[int(t) for t in row] for row in batched], {"hits": cache.hits, "misses": cache.misses})
            return
        tokens = []
        for token in stream_generate(engine, job["prompt"], max_tokens=job["tokens"], temp=0.0):
            tokens.append(int(token))
            clock.token()
        cache = engine.cache
        report(clock, [tokens], {"hits": cache.hits, "misses": cache.misses, "peak_bytes": cache.peak_bytes,
                                 "budget_bytes": budget})  # fmt: skip
    finally:
        engine.close()


if __name__ == "__main__":
    main()
