"""Record routing traces of a MoEfied model on review text: the recipe of the trained-routing bench traces.

    .venv/bin/python -m bench.routing_traces MOE --dense DENSE [--out-dir DIR] [--plain-prompt 64]

MOE is a llama_moe checkpoint (`nightshift model moefy --experts 128 --k 16 ...`), DENSE the dense llama it
was made from. The texts: every bundled review's prompt as the service writes it (its single narrative,
and the month-end review's split narrative: the summary and one chat per finding, the batch the service
decodes together), each followed by the answer the dense model writes to it (greedy, as many tokens as the
schedule allows an answer), and two texts that are no review (the shipped evaluation text in two halves,
and the routing prompts), whose first `--plain-prompt` tokens count as the prompt.

Every text is read whole through the MoE model (teacher forcing) and two traces are written
(engine/store/routing_trace.py gives the format), both of k experts per token:

- `<MOE>-own.npz`: the MoE model's own routing, on its own residual stream (with k of E experts active);
- `<MOE>-dense.npz`: the same routers on the dense model's residual stream (every expert active: the
  dense FFN exactly), i.e. what these routers pick in a model whose FFNs are whole.

Both in float32 (the checkpoint's 4-bit weights dequantized exactly). Prints a summary line per text.
"""

from __future__ import annotations

# First, before mlx: nightshift.engine routes MLX's float matmuls to the system BLAS (engine/cpu_blas.py).
import nightshift.engine  # noqa: F401

# isort: split
import argparse
import time
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model

from nightshift.app.paths import ensure_data_dir
from nightshift.app.review.narrative import build_prompt
from nightshift.app.review.runner import run_checks_for
from nightshift.app.review.schedule import find_schedule
from nightshift.engine.models import get_classes
from nightshift.engine.store import routing_trace
from nightshift.engine.store.moefy import DATA_DIR, EVALUATION_TEXT, DenseReference, dequantize_float32

ROUTING_PROMPTS = DATA_DIR / "routing_prompts.txt"
REVIEWS = ("month-end", "weekly", "daily", "beancount", "camt053", "mt940", "ofx")
SPLIT = ("month-end",)  # reviews whose split narrative (the service's batch) is recorded too

Text = tuple[str, list[int], int]  # name, tokens, prompt tokens


def review_chats(name: str) -> list[tuple[str, list[dict[str, str]], int]]:
    """(name, messages, answer tokens) for a bundled review's single narrative and, in SPLIT, its split one."""
    schedule = find_schedule(name)
    checked = run_checks_for(schedule, schedule.as_of)
    chats = []
    for mode in ("single", "split") if name in SPLIT else ("single",):
        settings = replace(schedule.generation, narrative=mode)
        prompt = build_prompt(schedule.prompt_template, schedule.title, checked.window.label, checked.result,
                              settings.prompt_findings, mode, settings.batch_width)  # fmt: skip
        conversations = prompt.conversations if mode == "split" else [prompt.messages]
        parts = ["summary", *(f"F{n}" for n in range(1, len(conversations)))] if mode == "split" else ["single"]
        chats += [(f"{name} {part}", chat, settings.answer_tokens) for part, chat in zip(parts, conversations)]
    return chats


def answered(dense: DenseReference, messages: list[dict[str, str]], tokens: int) -> Text:
    """The chat's prompt tokens followed by the dense model's greedy answer (up to `tokens`, to its end token)."""
    prompt = list(dense.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    answer = []
    for token, _ in generate_step(mx.array(prompt), dense.model, max_tokens=tokens, sampler=lambda x: mx.argmax(x, -1)):
        answer.append(int(token))
        if int(token) in dense.tokenizer.eos_token_ids:
            break
    return "", prompt + answer, len(prompt)


def texts(dense: DenseReference, plain_prompt: int, say=print) -> list[Text]:
    """Every text of the recipe, as (name, tokens, prompt tokens)."""
    out: list[Text] = []
    for review in REVIEWS:
        for name, chat, answer_tokens in review_chats(review):
            started = time.perf_counter()
            _, tokens, prompt = answered(dense, chat, answer_tokens)
            out.append((name, tokens, prompt))
            say(
                f"{name}: {prompt} prompt + {len(tokens) - prompt} answer tokens ({time.perf_counter() - started:.0f} s)"
            )
    evaluation = dense.tokenizer.encode(EVALUATION_TEXT.read_text())
    half = len(evaluation) // 2
    plain = [("evaluation text, first half", evaluation[:half]), ("evaluation text, second half", evaluation[half:]),
             ("routing prompts", dense.tokenizer.encode(ROUTING_PROMPTS.read_text()))]  # fmt: skip
    out += [(name, tokens, min(plain_prompt, len(tokens))) for name, tokens in plain]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("moe", type=Path, help="llama_moe checkpoint directory")
    parser.add_argument("--dense", type=Path, required=True, help="the dense llama it was made from")
    parser.add_argument("--out-dir", type=Path, help="where the traces go (default: the data dir's traces/)")
    parser.add_argument("--plain-prompt", type=int, default=64, help="prompt tokens of the texts that are no review")
    args = parser.parse_args()
    out_dir = args.out_dir or ensure_data_dir() / "traces"
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    dense = DenseReference(args.dense)
    recorded = texts(dense, args.plain_prompt)
    print(
        f"{len(recorded)} texts, {sum(len(t) for _, t, _ in recorded)} tokens ({time.perf_counter() - started:.0f} s)"
    )
    model, config = load_model(args.moe, get_model_classes=get_classes)
    dequantize_float32(model)
    k = config["num_experts_per_tok"]
    meta = {"model": args.moe.name, "dense": args.dense.name, "recipe": "bench/routing_traces.py"}
    for stream, active in (("own", k), ("dense", config["num_experts"])):
        for layer in model.model.layers:
            layer.mlp.num_experts_per_tok = active
        trace = routing_trace.record(model, recorded, {**meta, "stream": stream}, k)
        path = routing_trace.save(trace, out_dir / f"{args.moe.name}-{stream}.npz")
        print(f"{path}: {trace.sequences} sequences, {int(trace.offsets[-1])} tokens, {trace.layers} layers, "
              f"{k} of {trace.experts} experts ({time.perf_counter() - started:.0f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
