"""The flags that name a store, where to read it and how to stream it, shared by the commands that open a streamed
model (`nightshift bench`, `nightshift verify`, `nightshift model tune`).

The settings' flags are made from StreamSettings' fields (engine/moe/settings.py), so their names, defaults,
choices and help are written once; a flag given on the command line wins over the store's tuned value.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import get_args, get_origin, get_type_hints

from nightshift.app.commands import argument_type, say


def add_stream_arguments(parser: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    """The store and where to read it, then one flag per StreamSettings field.

    The settings' flags are made from the fields: their names, defaults, choices and help are written once,
    in engine/moe/settings.py. A bool is `--name/--no-name`; a set or tuple, comma-separated values.
    `defaults` replaces some fields' defaults (the benchmarks': app/commands/bench.py BENCH_DEFAULTS).
    """
    from nightshift.engine.moe.settings import StreamSettings

    parser.add_argument("--model", required=True, help="a store (name from `model list`, or directory)")
    parser.add_argument("--drives", help="drives.toml whose roots replace the store's (e.g. the rig's)")
    parser.add_argument("--ceilings", help="drive_ceilings.json from `drives probe` (dispatcher's starting estimates)")
    parser.add_argument(
        "--tuning",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="use the store's tuned settings (`nightshift model tune`) where no flag sets them (default: on)",
    )
    kinds = get_type_hints(StreamSettings)
    for setting in fields(StreamSettings):
        option, kind = setting.metadata["option"], kinds[setting.name]
        flag = "--" + _flag_name(setting)
        default = setting.default if setting.default is not MISSING else setting.default_factory()
        default = (defaults or {}).get(setting.name, default)
        if kind is bool:
            on_off = "on" if default else "off"
            parser.add_argument(flag, action=GivenSwitch, default=default, help=f"{option.help} (default: {on_off})")
        elif option.parse is not None:  # the setting's own notation (a memory budget: auto, 12G, 0)
            parser.add_argument(
                flag,
                action=Given,
                type=argument_type(option.parse),
                default=default,
                help=f"{option.help} (default: {option.show(default)})",
            )
        elif get_origin(kind) in (frozenset, tuple):  # empty by default: the help says what none means
            parser.add_argument(
                flag, action=Given, type=comma_list(get_args(kind)[0]), default=default, help=option.help
            )
        else:
            scaled = option.scale != 1
            value = default / option.scale if scaled else default
            parser.add_argument(
                flag,
                action=Given,
                type=float if scaled else kind,
                default=value,
                choices=option.choices or None,
                help=f"{option.help} (default: {value:g})" if scaled else f"{option.help} (default: {value})",
            )


class Given(argparse.Action):
    """Stores a setting's value and notes it was given, so a store's tuned value does not replace it."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = getattr(namespace, "given", frozenset()) | {self.dest}


class GivenSwitch(argparse.BooleanOptionalAction):
    """`--name/--no-name`, noted as given like `Given`."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        namespace.given = getattr(namespace, "given", frozenset()) | {self.dest}


def _flag_name(setting: Field) -> str:
    return setting.metadata["option"].flag or setting.name.replace("_", "-")


def comma_list(item: type) -> Callable[[str], tuple]:
    """An argparse type: comma-separated values of `item` (int or str: only whole numbers can be mistyped)."""

    def parse(text: str) -> tuple:
        try:
            return tuple(item(part.strip()) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"give whole numbers separated by commas, e.g. 3,4; got {text!r}"
            ) from None

    return parse


def settings_from(args: argparse.Namespace):
    """The StreamSettings the flags of `add_stream_arguments` name (a scaled flag back in its setting's unit),
    with the store's tuned values where no flag set them (unless `--no-tuning`)."""
    from nightshift.engine.moe.settings import StreamSettings

    values = {}
    for setting in fields(StreamSettings):
        value, scale = getattr(args, _flag_name(setting).replace("-", "_")), setting.metadata["option"].scale
        values[setting.name] = int(value * scale) if scale != 1 else value
    settings = StreamSettings(**values)
    tuned = tuning_from(args)
    return tuned(settings) if tuned else settings


def tuning_from(args: argparse.Namespace) -> Callable | None:
    """settings -> settings with the store's tuned values for the drives they read, except where a flag was
    given (None with `--no-tuning`); says which tuning it uses."""
    from nightshift.app.models import resolve_model
    from nightshift.engine.moe.settings import StreamSettings
    from nightshift.engine.moe.tuning import apply_tuning, describe_tuning, tuning_for

    if not args.tuning:
        return None
    store = resolve_model(args.model)
    flags = getattr(args, "given", frozenset())
    given = frozenset(f.name for f in fields(StreamSettings) if _flag_name(f).replace("-", "_") in flags)

    def tuned(settings):
        if tuning_for(store, settings.use_drives) is not None:
            say(describe_tuning(store, settings.use_drives))
        return apply_tuning(store, settings, given)

    return tuned


def sources_from(args: argparse.Namespace):
    """(store path, drives or None, ceilings or None) named by the flags."""
    from nightshift.app.models import resolve_model
    from nightshift.engine.io.ceilings import Ceilings
    from nightshift.engine.io.drives import load_drives

    drives = load_drives(Path(args.drives)) if args.drives else None
    ceilings = Ceilings.load(Path(args.ceilings)) if args.ceilings else None
    return resolve_model(args.model), drives, ceilings
