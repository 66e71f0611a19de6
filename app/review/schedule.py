"""Schedule files: one TOML file per review, bundled in schedules/ and in the user's data dir.

A file with an error is reported with its file, line and field, and the other
schedules still load. A user's file with the same name as a bundled one wins.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from datetime import date, tzinfo
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from tzlocal import get_localzone

from nightshift.app.paths import bundled, data_dir, user_schedules_dir
from nightshift.app.review.checks import CHECKS, REQUIRED
from nightshift.app.review.errors import ReviewError, ScheduleError
from nightshift.app.review.sources import COLUMNS, CsvSource, Source, SqliteSource
from nightshift.app.review.when import parse_when
from nightshift.app.review.window import PERIODS

BUNDLED_DIR = bundled("schedules")
TEMPLATES_DIR = bundled("templates")
_DURATION = re.compile(r"(\d+)\s*([smhd]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass
class Generation:
    """Which model writes the narrative and how."""

    model: str | None = None  # a model name or directory; None: the default model
    max_tokens: int = 160
    temp: float = 0.0
    seed: int = 0
    prompt_findings: int = 10  # findings given to the model (the most severe first)


@dataclass
class Schedule:
    name: str
    title: str
    file: Path
    when: str
    trigger: BaseTrigger
    timezone: tzinfo
    grace_seconds: int
    period: str
    as_of: date | None  # pins the reviewed period (the bundled sample data has one)
    sources: dict[str, Source]
    checks: list[dict[str, Any]]
    materiality: Decimal
    generation: Generation = field(default_factory=Generation)
    prompt_template: str = "review.j2"
    report_template: str = "review.html.j2"
    output: Path = Path()


def schedule_dirs() -> list[Path]:
    """Where schedules are read from, later ones overriding earlier ones by name."""
    return [BUNDLED_DIR, user_schedules_dir()]


def load_schedules() -> tuple[dict[str, Schedule], list[ScheduleError]]:
    """Every schedule that loads, by name, and the errors of those that do not."""
    schedules: dict[str, Schedule] = {}
    errors: list[ScheduleError] = []
    for folder in schedule_dirs():
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else []:
            try:
                schedule = load_schedule(path)
            except ScheduleError as exc:
                errors.append(exc)
                continue
            schedules[schedule.name] = schedule
    return schedules, errors


def find_schedule(name: str) -> Schedule:
    schedules, errors = load_schedules()
    if name in schedules:
        return schedules[name]
    broken = [str(error) for error in errors if Path(str(error).split(":", 1)[0]).stem == name]
    if broken:
        raise ScheduleError(broken[0])
    known = ", ".join(sorted(schedules)) or "none"
    raise ReviewError(f"no review named {name!r} (known: {known}); see `nightshift review list`")


def _key_lines(text: str) -> dict[tuple, int]:
    """Line number of every key path in a TOML text: ("sources", "bank", "path") -> 12, ("checks", 1, "type") -> 30."""
    lines: dict[tuple, int] = {}
    table: tuple = ()
    arrays: dict[tuple, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if header := re.fullmatch(r"\[\[\s*([^\]]+?)\s*\]\]", stripped):
            name = tuple(part.strip().strip('"') for part in header.group(1).split("."))
            arrays[name] = arrays.get(name, -1) + 1
            table = (*name, arrays[name])
            lines.setdefault(table, number)
        elif header := re.fullmatch(r"\[\s*([^\]]+?)\s*\]", stripped):
            table = tuple(part.strip().strip('"') for part in header.group(1).split("."))
            lines.setdefault(table, number)
        elif key := re.match(r"([A-Za-z0-9_\-\".]+)\s*=", stripped):
            path = (*table, *(part.strip('"') for part in key.group(1).split(".")))
            lines.setdefault(path, number)
    return lines


class _Reader:
    """Reads fields of one parsed schedule, turning every problem into a ScheduleError with file and line."""

    def __init__(self, path: Path, text: str, data: dict[str, Any]):
        self.path, self.data, self.lines = path, data, _key_lines(text)

    def fail(self, where: tuple, message: str) -> ScheduleError:
        line = next((self.lines[where[:n]] for n in range(len(where), 0, -1) if where[:n] in self.lines), None)
        field_name = ".".join(str(part) if not isinstance(part, int) else f"[{part}]" for part in where)
        field_name = field_name.replace(".[", "[")
        at = f"{self.path}:{line}" if line else str(self.path)
        return ScheduleError(f"{at}: field `{field_name}`: {message}")

    def get(self, where: tuple, kind: type | tuple, default: Any = ..., container: Any = None) -> Any:
        node = self.data if container is None else container
        value = node.get(where[-1], default) if isinstance(node, dict) else default
        if value is ...:
            raise self.fail(where, "is missing")
        if value is not default and not isinstance(value, kind):
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise self.fail(where, f"should be {names}, not {type(value).__name__} {value!r}")
        return value


def _duration(text: str | int) -> int:
    if isinstance(text, int):
        return text
    found = _DURATION.fullmatch(text.strip())
    if not found:
        raise ValueError(f'{text!r} is not a duration; write e.g. "90s", "30m", "12h" or "2d"')
    return int(found.group(1)) * _UNIT_SECONDS[found.group(2)]


def load_schedule(path: Path) -> Schedule:
    """Read and check one schedule file; ScheduleError names the file, line and field of the first problem."""
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"line (\d+)", str(exc))
        raise ScheduleError(f"{path}:{line.group(1) if line else '?'}: not valid TOML: {exc}") from None
    read = _Reader(path, text, data)
    name = read.get(("name",), str, path.stem)
    zone_name = read.get(("timezone",), str, None)
    try:
        zone = ZoneInfo(zone_name) if zone_name else get_localzone()
    except (ZoneInfoNotFoundError, ValueError):
        raise read.fail(
            ("timezone",), f'unknown time zone {zone_name!r}; use an IANA name like "Europe/Berlin"'
        ) from None
    when = read.get(("when",), str)
    try:
        trigger = parse_when(when, zone)
    except ValueError as exc:
        raise read.fail(("when",), str(exc)) from None
    try:
        grace = _duration(read.get(("grace",), (str, int), "6h"))
    except ValueError as exc:
        raise read.fail(("grace",), str(exc)) from None
    window = read.get(("window",), dict, {})
    period = read.get(("window", "period"), str, "day", window)
    if period not in PERIODS:
        raise read.fail(("window", "period"), f"{period!r} is not a period; use one of {', '.join(PERIODS)}")
    as_of = read.get(("window", "as_of"), date, None, window)
    materiality = read.get(("materiality",), (str, int), "1000")
    try:
        materiality = Decimal(str(materiality))
    except InvalidOperation:
        raise read.fail(("materiality",), f"{materiality!r} is not an amount") from None
    sources = {key: _source(read, path, key, value) for key, value in read.get(("sources",), dict).items()}
    checks = _checks(read, sources)
    generation = _generation(read)
    prompt = read.get(("prompt", "template"), str, "review.j2", read.get(("prompt",), dict, {}))
    report = read.get(("report",), dict, {})
    report_template = read.get(("report", "template"), str, "review.html.j2", report)
    for where, folder, template in ((("prompt", "template"), "prompts", prompt),
                                    (("report", "template"), "reports", report_template)):  # fmt: skip
        candidate = (TEMPLATES_DIR / folder / template).resolve()  # a name inside the folder, never a path out of it
        if not candidate.is_relative_to(TEMPLATES_DIR / folder) or not candidate.is_file():
            raise read.fail(where, f"no template {template!r} in {TEMPLATES_DIR / folder}")
    output = Path(read.get(("report", "output"), str, f"reports/{name}", report)).expanduser()
    return Schedule(
        name=name, title=read.get(("title",), str, name), file=path, when=when, trigger=trigger, timezone=zone,
        grace_seconds=grace, period=period, as_of=as_of, sources=sources, checks=checks,
        materiality=materiality, generation=generation, prompt_template=prompt,
        report_template=report_template, output=output if output.is_absolute() else data_dir() / output,
    )  # fmt: skip


def _source(read: _Reader, path: Path, key: str, config: Any) -> Source:
    where = ("sources", key)
    if not isinstance(config, dict):
        raise read.fail(where, "should be a table: [sources.NAME] with type, path, ...")
    kind = read.get((*where, "type"), str, container=config)
    location = Path(read.get((*where, "path"), str, container=config)).expanduser()
    location = location if location.is_absolute() else path.parent / location
    decimals = read.get((*where, "decimals"), int, 2, config)
    if kind == "csv":
        columns = read.get((*where, "columns"), dict, {"date": "date", "amount": "amount"}, config)
        unknown = sorted(set(columns) - set(COLUMNS))
        if unknown or not {"date", "amount"} <= set(columns):
            raise read.fail((*where, "columns"), f"maps {sorted(columns)}; it needs date and amount, "
                                                 f"and may map {', '.join(COLUMNS[2:])} (unknown: {unknown})")  # fmt: skip
        options = {option: read.get((*where, option), str, default, config) for option, default in
                   (("delimiter", ","), ("date_format", "%Y-%m-%d"), ("decimal", "."), ("thousands", ""))}  # fmt: skip
        return CsvSource(key, location, columns, decimals=decimals, **options)
    if kind == "sqlite":
        query = read.get((*where, "query"), str, container=config)
        return SqliteSource(key, location, query, decimals=decimals)
    raise read.fail((*where, "type"), f'{kind!r} is not a source type; use "csv" or "sqlite"')


def _checks(read: _Reader, sources: dict[str, Source]) -> list[dict[str, Any]]:
    checks = read.get(("checks",), list, [])
    for number, check in enumerate(checks):
        where = ("checks", number)
        if not isinstance(check, dict):
            raise read.fail(where, "should be a table ([[checks]])")
        kind = read.get((*where, "type"), str, container=check)
        if kind not in CHECKS:
            raise read.fail((*where, "type"), f"{kind!r} is not a check; use one of {', '.join(CHECKS)}")
        for needed in REQUIRED[kind]:
            source = read.get((*where, needed), str, container=check)
            if source not in sources:
                raise read.fail((*where, needed), f"names source {source!r}; defined: {', '.join(sources)}")
    return checks


def _generation(read: _Reader) -> Generation:
    model = read.get(("model",), dict, {})
    result = Generation(
        model=read.get(("model", "name"), str, None, model),
        max_tokens=read.get(("model", "max_tokens"), int, 160, model),
        temp=float(read.get(("model", "temp"), (int, float), 0.0, model)),
        seed=read.get(("model", "seed"), int, 0, model),
        prompt_findings=read.get(("model", "prompt_findings"), int, 10, model),
    )
    if result.max_tokens < 1:
        raise read.fail(("model", "max_tokens"), "should be at least 1")
    return result
