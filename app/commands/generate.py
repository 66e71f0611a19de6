"""`nightshift generate "PROMPT"`: stream an answer from a model, then its rates."""

from __future__ import annotations

import argparse
import sys

from nightshift.app.commands import say
from nightshift.app.models import open_for_generation, resolve_model
from nightshift.engine.errors import NightshiftError
from nightshift.engine.generation import DEFAULT_CHUNK

EXIT_INTERRUPTED = 130
TEMPLATE_TOKENS = 256  # what a chat template adds around the messages, at most (a system prompt of its own included)


def cmd_generate(args: argparse.Namespace) -> int:
    if not args.prompt.strip():
        raise NightshiftError('the prompt is empty; pass the text to answer, e.g. nightshift generate "Hello"')
    if args.draft_depth is not None and args.drafter is None:
        raise NightshiftError("--draft-depth needs --drafter (a small model sharing the tokenizer)")
    drafter = resolve_model(args.drafter) if args.drafter else None
    store = resolve_model(args.model)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}
    ]
    model = open_for_generation(
        store,
        in_ram=args.in_ram,
        drafter=drafter,
        memory_budget=args.memory_budget,
        float32_prefill=args.float32_prefill,
        context_tokens=context_bound(messages, args.max_tokens),
    )
    if model.stream is not None:
        from nightshift.app.notices import first_time
        from nightshift.engine.moe.tuning import describe_tuning, tuning_for

        if tuning_for(store) is not None or first_time("not tuned for these drives", str(store.resolve())):
            say(describe_tuning(store))  # the settings in use each time; that there are none, once per store
    stats = None
    try:
        for chunk in model.generate(
            messages,
            max_tokens=args.max_tokens,
            temp=args.temp,
            seed=args.seed,
            prefill_chunk=args.prefill_chunk,
            draft_depth=args.draft_depth,
        ):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            stats = chunk.stats
    except KeyboardInterrupt:
        print()
        say("interrupted")
        return EXIT_INTERRUPTED
    print()
    if stats is not None:
        say(
            f"{stats.generated_tokens} tokens at {stats.decode_tokens_per_s:.1f} tok/s; "
            f"time to first token {stats.time_to_first_token:.2f} s "
            f"({stats.prompt_tokens} prompt tokens, {stats.prefill_tokens_per_s:.1f} tok/s); "
            f"peak memory {stats.peak_memory_bytes / 1e9:.2f} GB"
        )
        if model.stream is not None:
            say(
                "experts streamed: "
                + ", ".join(f"{d} {b / 1e6:.1f} MB" for d, b in stats.drive_bytes.items())
                + f"; prefetch recall {stats.prefetch_recall:.0%}; "
                f"prefill read amplification {stats.prefill_read_amplification:.2f}x"
            )
            say(
                f"{model.stream.budget.describe()}; holds {stats.cache_used / 1e6:.0f} MB now, "
                f"hit rate {stats.cache_hit_rate:.1%}"
            )
        if stats.draft is not None:
            say(stats.draft.describe())
    return 0


def context_bound(messages: list[dict], max_tokens: int) -> int:
    """The most tokens this run can hold, known before the tokenizer is loaded: no token is shorter than a byte of
    the text, plus the chat template's and the answer's."""
    return sum(len(m["content"].encode()) for m in messages) + TEMPLATE_TOKENS + max_tokens


def _number(text: str, kind: type, least: float, said: str) -> int | float:
    """`text` as `kind` of at least `least`, or an argparse error in words (`'abc' is not a whole number`)."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {said}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{text!r}: give {said} of {least:g} or more")
    return value


def _positive_int(text: str) -> int:
    return _number(text, int, 1, "a whole number")


def _non_negative_int(text: str) -> int:
    return _number(text, int, 0, "a whole number")


def _non_negative_float(text: str) -> float:
    return _number(text, float, 0, "a number")


def memory_budget(text: str) -> str:
    """An argparse type: the text of a valid budget (auto, 0, 12G, 500M), refused with the forms it takes."""
    from nightshift.engine.moe.settings import parse_budget  # light: no MLX

    try:
        parse_budget(text)
    except NightshiftError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Answer PROMPT (chat-formatted) and print tokens as they come; "
        "tokens/s and time to first token at the end. Greedy unless --temp is set. Offline."
    )
    parser.add_argument("prompt", metavar="PROMPT", help="what to ask")
    parser.add_argument("--model", help="model name (see `model list`) or directory; default: the default model")
    parser.add_argument("--system", help="system message (default: the model's own)")
    parser.add_argument("--max-tokens", type=_positive_int, default=256, help="most tokens to generate (256)")
    parser.add_argument("--temp", type=_non_negative_float, default=0.0, help="sampling temperature (0: greedy)")
    parser.add_argument("--seed", type=int, default=0, help="random seed for sampling (0)")
    parser.add_argument(
        "--prefill-chunk",
        type=_positive_int,
        default=DEFAULT_CHUNK,
        help=f"prompt rows per forward pass ({DEFAULT_CHUNK}); each chunk reads an expert once",
    )
    parser.add_argument(
        "--float32-prefill",
        action="store_true",
        help="read the prompt of a float16/bfloat16 checkpoint through float32 BLAS: faster on the CPU, but the "
        "tokens are not mlx-lm's (its CPU kernel sums in 16 bits); float32 checkpoints take BLAS anyway",
    )
    parser.add_argument(
        "--in-ram",
        action="store_true",
        help="load a store's experts into RAM instead of streaming them from its drives",
    )
    parser.add_argument(
        "--memory-budget",
        type=memory_budget,
        default="auto",
        metavar="auto|SIZE|0",
        help="RAM for a streamed store's experts: auto (from the RAM available, given back when another "
        "process needs it), a size such as 12G or 500M, or 0 (read every expert from the drives each time)",
    )
    parser.add_argument(
        "--drafter",
        metavar="MODEL",
        help="small model sharing the tokenizer (name or directory), held in RAM: speculative decoding",
    )
    parser.add_argument(
        "--draft-depth",
        type=_non_negative_int,
        metavar="N",
        help="tokens drafted per verify pass (default: the best `bench draft` measured, else 2; 0: no drafting)",
    )
    parser.set_defaults(run=cmd_generate)
