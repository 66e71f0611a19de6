"""Where a streamed decode token's time goes beyond the compute: four sides of one store, alternated, one process each.

    .venv/bin/python -m bench.decode_bounds STORE [--budget 63M] [--tokens 64] [--prompt-tokens 16] [--rounds 2]

- `in-ram`: every expert in RAM (`load_store`), mlx-lm's decode loop: the compute alone.
- `in-ram-sync`: the same with each layer's router choice read back to the host before its experts run, as any
  engine that reads a layer's experts on demand must (nightshift and nunspark both do): the floor of such engines.
- `streamed`: nightshift's streamed decode with its cache held to `--budget`.
- `slab-bound`: the streamed decode whose one-row layer calls still look up, read, cache and guess as usual, but
  compute the experts with the in-RAM model's own call on the layer's full stack (one gather, no stack of the cached
  experts, no call per read expert, no reordering): the estimate, before it was built, of what a cache held as a
  slab could give. The slab (engine/moe/slab.py) runs above it: it computes only the chosen experts' rows
  (docs/results.md, session 12).

Greedy tokens are printed per side (all four are mlx-lm's on the store). Each run is recorded in the run catalogue
(kind `decode-bounds`) with the load at its start. A study of the engine's costs, not a setting users choose.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

SIDES = ("in-ram", "in-ram-sync", "streamed", "slab-bound")


def _synced(switch):  # an mlx-lm switch module
    """`switch` with its router choice read back to the host before it runs."""
    import numpy as np

    return lambda x, indices: (np.array(indices), switch(x, indices))[1]


def run_side(side: str, store: Path, budget: str, tokens: int, prompt_tokens: int) -> dict:
    """Decode `tokens` after a prompt on one side (this process); tok/s and CPU a token from the first token."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from nightshift.engine.moe.settings import StreamSettings, parse_budget
    from nightshift.engine.moe.streaming import StreamingSwitch
    from nightshift.engine.runtime import open_model
    from nightshift.engine.store.families import module_at, switch_sites
    from nightshift.engine.store.loader import load_store

    prompt = list(range(100, 100 + prompt_tokens))
    if side.startswith("in-ram"):
        model, _ = load_store(store)
        if side == "in-ram-sync":
            for site in switch_sites(model):
                parent, name = site.path.rsplit(".", 1)
                setattr(module_at(model, parent), name, _synced(module_at(model, site.path)))
        steps = (int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=tokens + 1))
    else:
        streamed = open_model(store, stream=StreamSettings(cache_bytes=parse_budget(budget)))
        if side == "slab-bound":
            resident, _ = load_store(store)
            full = {site.layer: module_at(resident, site.path) for site in switch_sites(resident)}
            overlapped = StreamingSwitch._overlapped

            def bound(self: StreamingSwitch, x: mx.array, indices: mx.array) -> mx.array:
                if indices.size != indices.shape[-1]:  # not one row: as the engine does
                    return overlapped(self, x, indices)
                self._stream.experts(self.layer_index, x, indices)  # looked up, read, cached, guessed
                return full[self.layer_index](x, indices)

            StreamingSwitch._overlapped = bound  # type: ignore[method-assign]
        steps = (chunk.token for chunk in streamed.generate_tokens(prompt, max_tokens=tokens + 1))
    out = [next(steps)]
    began, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    out += list(steps)
    wall, after = time.perf_counter() - began, resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    return {"decode_tok_s": tokens / wall, "cpu_s_per_token": cpu / tokens, "tokens": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("store", type=Path)
    parser.add_argument(
        "--budget", default="63M", help="the streamed sides' expert cache (63M: 25 %% of moe128-mixtral 4-bit)"
    )
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the four sides, the order reversed each round")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # one side, in this process
    args = parser.parse_args()
    if args.side:
        print(json.dumps(run_side(args.side, args.store, args.budget, args.tokens, args.prompt_tokens)))
        return
    from nightshift.app.paths import catalogue_file
    from nightshift.engine.instruments.catalogue import Catalogue, Run

    catalogue = Catalogue(catalogue_file())
    config = {"budget": args.budget, "tokens": args.tokens, "prompt_tokens": args.prompt_tokens}
    for turn in range(args.rounds):
        for side in SIDES if turn % 2 == 0 else SIDES[::-1]:
            load = os.getloadavg()[0]
            argv = [sys.executable, "-m", "bench.decode_bounds", str(args.store), "--side", side, "--budget",
                    args.budget, "--tokens", str(args.tokens), "--prompt-tokens", str(args.prompt_tokens)]  # fmt: skip
            done = subprocess.run(argv, capture_output=True, text=True, check=True)
            figures = json.loads(done.stdout.strip().splitlines()[-1]) | {"load": load}
            run = Run("decode-bounds", args.store.name, config | {"side": side, "round": turn + 1}, figures, "measured",
                      command=" ".join(sys.argv))  # fmt: skip
            run_id = catalogue.record(run)
            print(f"round {turn + 1} {side:>11}: {figures['decode_tok_s']:6.2f} tok/s, "
                  f"CPU {figures['cpu_s_per_token']:.3f} s a token, load {load:.1f}, tokens {figures['tokens'][:6]} "
                  f"(run {run_id})")  # fmt: skip


if __name__ == "__main__":
    main()
