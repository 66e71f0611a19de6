"""Draft-depth sweep: the same greedy generation at each draft depth, through the engine's own generate.

Per depth: decode tokens/s (prefill excluded), drafted / accepted tokens and the acceptance
rate, verify passes, union size per verify (mean unique experts one MoE layer read per verify
pass) next to the experts per layer pass of the whole decode (depth 0: the router's top-k),
expert bytes read per token, the break-even acceptance against depth 0's step time, and
whether the tokens equal depth 0's (greedy identity).
The switch-off is disabled during the sweep so each row measures its depth; the best depth
is the one with the most tokens/s. Nothing here asserts on time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the sweep drives an opened model (engine/runtime sits above engine/bench)
    from nightshift.engine.runtime import Model

# A prompt of record, so runs of one configuration are comparable (chat-formatted with the model's template).
PROMPT = "Write a short note on the month-end close: revenue rose 4 %, costs fell, cash is steady."
WARMUP_TOKENS = 4


def _reads(model: Model) -> tuple[int, int, int]:
    """(bytes read from the drives, streaming layer calls, unique experts they selected) so far."""
    if model.stream is None:
        return 0, 0, 0
    calls = model.stream.call_counts()
    return model.stream.figures().bytes_read, calls.calls, calls.unique


def generate_once(model: Model, prompt: list[int], tokens: int, depth: int) -> dict:
    """One greedy generation at `depth`: its tokens and figures."""
    chunks, before = [], (0, 0, 0)
    for chunk in model.generate_tokens(prompt, max_tokens=tokens + 1, draft_depth=depth, draft_switch_off=False):
        if not chunks:
            before = _reads(model)  # decode only: the prefill's reads are the prefill benchmark's
        chunks.append(chunk.token)
    stats = chunk.stats
    decoded = max(stats.generated_tokens - 1, 1)
    read, calls, unique = (after - first for after, first in zip(_reads(model), before))
    draft = stats.draft.as_dict()
    figures = {
        "depth": depth,
        "tokens": stats.generated_tokens,
        "tokens_per_s": stats.decode_tokens_per_s,
        "ms_per_token": 1000 / stats.decode_tokens_per_s if stats.decode_tokens_per_s else 0.0,
        "bytes_per_token": read / decoded,
        # Unique experts per MoE layer pass while decoding: top-k at depth 0, the union of k+1 rows when drafting.
        "experts_per_layer_pass": unique / calls if calls else 0.0,
        **{k: draft[k] for k in ("acceptance_rate", "union_per_verify", "round_s", "break_even_acceptance")},
    }
    counters = {k: draft[k] for k in ("drafted", "accepted", "rounds", "plain_steps", "replays")}
    counters["verify_passes"] = counters.pop("rounds")
    return {"tokens": chunks, "figures": figures, "counters": counters}


def draft_sweep(
    model: Model, depths: list[int], tokens: int, repeats: int = 1, prompt_text: str = PROMPT
) -> list[dict]:
    """One result per depth (see `generate_once`) from `model` (opened with a drafter), each with
    `tokens_identical` to depth 0's tokens (or the first depth's).

    With `repeats` > 1 the depths run that many times, in alternating order (so a slow spell on a
    shared machine does not land on one depth), and each depth keeps its run of median tokens/s
    (every run's tokens/s in `tokens_per_s_runs`).
    """
    prompt = model.chat_tokens([{"role": "user", "content": prompt_text}])
    generate_once(model, prompt, WARMUP_TOKENS, max(depths))  # kernels built, trunk faulted in: not timed
    runs: dict[int, list[dict]] = {depth: [] for depth in depths}
    for repeat in range(repeats):
        for depth in depths if repeat % 2 == 0 else depths[::-1]:
            runs[depth].append(generate_once(model, prompt, tokens, depth))
    results = []
    for depth in depths:
        ranked = sorted(runs[depth], key=lambda r: r["figures"]["tokens_per_s"])
        median = ranked[len(ranked) // 2]
        median["figures"]["tokens_per_s_runs"] = [r["figures"]["tokens_per_s"] for r in runs[depth]]
        results.append(median)
    plain = next((r for r in results if r["figures"]["depth"] == 0), None)
    reference = (plain or results[0])["tokens"]
    for result in results:
        f = result["figures"]
        f["tokens_identical"] = result["tokens"] == reference
        if plain and f["depth"] and plain["figures"]["tokens_per_s"]:
            # Acceptance at which this depth's rounds would yield tokens exactly as fast as plain decoding.
            plain_s = 1 / plain["figures"]["tokens_per_s"]
            f["break_even_acceptance"] = max(0.0, (f["round_s"] / plain_s - 1) / f["depth"])
    return results


def best_depth(results: list[dict]) -> dict:
    """The result with the most tokens/s (greedy identity is reported beside it, not a filter: see docs/engine.md)."""
    return max(results, key=lambda r: r["figures"]["tokens_per_s"])
