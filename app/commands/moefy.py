"""`nightshift model moefy`: turn a dense llama (the default model by default) into a sparse MoE model."""

from __future__ import annotations

import argparse
from pathlib import Path

from nightshift.app.commands import say
from nightshift.app.paths import doc, models_dir
from nightshift.engine.errors import NightshiftError
from nightshift.engine.store.moefy_defaults import DEFAULT_EXPERTS, DEFAULT_K


def cmd_moefy(args: argparse.Namespace) -> int:
    from nightshift.app.models import resolve_model
    from nightshift.app.progress import Heartbeat
    from nightshift.engine.store.moefy import moefy

    source = resolve_model(args.source) if args.source else _dense_default()
    k = DEFAULT_K * args.experts // DEFAULT_EXPERTS if args.k is None else args.k
    name = args.name or f"{source.name}-moe{args.experts}"
    target = models_dir() / name
    if target.exists() and not args.force:
        raise NightshiftError(f"a model named {name!r} already exists at {target}; pick another --name or pass --force")
    calibration = _read_calibration(args.calibration) if args.calibration else None
    say(f"splitting {source.name} into {args.experts} experts per layer, {k} active per token")
    with Heartbeat(say) as beat:
        print(moefy(source, target, experts=args.experts, k=k, calibration=calibration, say=beat.say))
    return 0


def _dense_default() -> Path:
    """The default model as the dense llama it is prepared from (the default model itself is already sparse)."""
    from nightshift.app.default_model import default_model_dir

    dense = default_model_dir()
    if not (dense / "config.json").is_file():
        raise NightshiftError(
            "the default model is not prepared here: run `nightshift model default`, or give --source"
        )
    return dense


def _read_calibration(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise NightshiftError(f"cannot read the calibration text {path}: {exc}; give a UTF-8 text file") from exc
    if len(text.split()) < 200:
        raise NightshiftError(f"the calibration text {path} has {len(text.split())} words; give at least 200")
    return text


def register(actions: argparse._SubParsersAction) -> None:
    moefy_parser = actions.add_parser(
        "moefy",
        help="make a sparse MoE model from a dense llama (MoEfication)",
        description="Split every feed-forward layer of a dense llama into experts (groups of neurons that "
        "fire together on the calibration text shipped with nightshift), fit a router that picks the top "
        "k experts per token, and write the result as a new model. With k equal to the number of experts "
        f"the model computes exactly what the dense one does. See {doc('moefication.md')}.",
    )
    moefy_parser.add_argument(
        "--source", help="dense model name or directory (default: the dense model the default model is made from)"
    )
    moefy_parser.add_argument(
        "--experts", type=int, default=DEFAULT_EXPERTS, help=f"experts per layer (default {DEFAULT_EXPERTS})"
    )
    moefy_parser.add_argument(
        "--k",
        type=int,
        help=f"experts active per token (default {DEFAULT_K} of {DEFAULT_EXPERTS}, scaled to --experts)",
    )
    moefy_parser.add_argument(
        "--calibration", metavar="FILE", help="English text to group neurons and fit routers on (default: shipped)"
    )
    moefy_parser.add_argument("--name", help="model name (default: SOURCE-moeEXPERTS)")
    moefy_parser.add_argument("--force", action="store_true", help="replace a model of the same name")
    moefy_parser.set_defaults(run=cmd_moefy)
