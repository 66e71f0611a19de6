"""The greedy tokens bench/streaming_peers.py's engines are held to: mlx-lm on each copy it can load (the 4-bit MLX
copy nunspark packs, the source fastllm and AirLLM read) and the nightshift store in RAM, on the same prompt. A copy
with 16-bit float weights is computed in float32 (mlx[cpu]'s gather_mm, which mlx-lm's unquantized experts use,
computes float32 only), and says so; with `--as-stored` it keeps its 16-bit weights and activations and only
gather_mm's products and sums are float32 (as MLX computes them on a GPU), which is what nightshift computes from
a bf16 store whose norms are bf16 too.

    python -m bench.peer_tokens STORE MODEL_DIR... [--tokens 8] [--prompt-tokens 16] [--as-stored] [--streamed B]...

`--streamed B` also streams the store with an expert cache of B (0, 25 % of the experts as 637M, ...): its prompt
pass and its decode steps take the streaming layer's paths, which must give the in-RAM store's tokens.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import nightshift.engine  # noqa: F401  (the CPU BLAS before MLX)

# isort: split
import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm import load
from mlx_lm.generate import generate_step

from bench.gpu_gather_mm import gather_mm_as_on_a_gpu
from bench.streaming_peers import prompt_ids
from nightshift.engine.moe.settings import StreamSettings, parse_budget
from nightshift.engine.runtime import open_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("models", type=Path, nargs="*", help="checkpoints mlx-lm loads")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--as-stored", action="store_true", help="16-bit weights kept; gather_mm in float32")
    parser.add_argument("--streamed", action="append", default=[], help="also streamed, this expert cache (0, 637M)")
    args = parser.parse_args()
    if args.as_stored:
        mx.gather_mm = gather_mm_as_on_a_gpu(mx.gather_mm)
    prompt = prompt_ids(args.store, args.prompt_tokens)[0]
    for path in args.models:
        model, _ = load(str(path))
        half = {v.dtype for _, v in tree_flatten(model.parameters())} & {mx.bfloat16, mx.float16}
        if half and not args.as_stored:
            model.set_dtype(mx.float32)
        steps = generate_step(mx.array(prompt), model, max_tokens=args.tokens)
        label = f" (its {', '.join(map(str, half))} weights in float32)" if half and not args.as_stored else ""
        print(f"mlx-lm, {path}{label}: {[int(token) for token, _ in steps]}")
    store = open_model(args.store)
    print(
        f"nightshift store in RAM, {args.store}: {[c.token for c in store.generate_tokens(prompt, max_tokens=args.tokens)]}"
    )
    store.close()
    for budget in args.streamed:
        streamed = open_model(args.store, stream=StreamSettings(cache_bytes=parse_budget(budget)))
        try:
            tokens = [c.token for c in streamed.generate_tokens(prompt, max_tokens=args.tokens)]
        finally:
            streamed.close()
        print(f"nightshift streamed, expert cache {budget}: {tokens}")


if __name__ == "__main__":
    main()
