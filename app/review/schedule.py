"""Schedule files: one TOML file per review, bundled in schedules/ and in the user's data dir.

A file with an error is reported with its file, line and field, and the other
schedules still load. A user's file with the same name as a bundled one wins.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields
from datetime import date, tzinfo
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from tzlocal import get_localzone

from nightshift.app.paths import bundled, data_dir, user_schedules_dir
from nightshift.app.review.calendars import MONDAY_TO_FRIDAY, BusinessDays, business_days
from nightshift.app.review.checks import CHECKS, REQUIRED
from nightshift.app.review.errors import ReviewError, ScheduleError
from nightshift.app.review.sources import OptionError, Source, source_kind
from nightshift.app.review.when import parse_when
from nightshift.app.review.window import PERIODS
from nightshift.engine.errors import NightshiftError, did_you_mean
from nightshift.engine.moe.settings import parse_budget

BUNDLED_DIR = bundled("schedules")
TEMPLATES_DIR = bundled("templates")
_DURATION = re.compile(r"(\d+)\s*([smhd]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

# Every key a schedule may use, by table; any other key is an error naming the nearest of these.
TOP_KEYS = ("name", "title", "when", "calendar", "timezone", "grace", "materiality", "window", "sources", "checks",
            "model", "prompt", "report")  # fmt: skip
SECTION_KEYS = {"window": ("period", "as_of"), "model": ("name", "max_tokens", "temp", "seed", "prompt_findings",
                                                         "memory_budget", "narrative", "batch_width", "part_tokens",
                                                         "repetition_penalty", "grounding"),
                "prompt": ("template",), "report": ("template", "output")}  # fmt: skip
CHECK_KEYS = {  # beside `type` and `max_findings`, which every check takes
    "match": ("left", "right", "date_tolerance_days", "use_reference"),
    "duplicates": ("source", "keys"),
    "totals": ("source", "by", "compare"),
    "balance": ("balances", "movements", "account"),
    "variance": ("source", "by", "threshold_pct", "min_change"),
}
NARRATIVES = ("single", "split")  # a [model] narrative: one prompt, or a summary and one per finding in a batch
DEFAULT_TOLERANCE_DAYS = 3  # a match check's `date_tolerance_days`
_OPTION_TYPES = {"str": str, "int": int, "float": (int, float), "bool": bool, "dict": dict, "list": list}


@dataclass
class Generation:
    """Which model writes the narrative and how."""

    model: str | None = None  # a model name or directory; None: the default model
    max_tokens: int = 160
    temp: float = 0.0
    seed: int = 0
    prompt_findings: int = 10  # findings given to the model (the most severe first)
    memory_budget: str = "auto"  # RAM for a streamed store's experts: auto, 0 or a size (12G)
    # single: one prompt, one answer of up to max_tokens; split: a summary and one paragraph per finding
    # (up to batch_width answers in all, each up to part_tokens), decoded as one batch. Split by default:
    # on the default model its text is far better, for 3-5x the time (docs/results.md, issue [15]).
    narrative: str = "split"
    batch_width: int = 11  # the summary and prompt_findings' default of 10 findings
    part_tokens: int = 64
    # mlx-lm's repetition penalty while the narrative is written (1: none). 1.3 measured better on the default
    # model: 9 of 79 sentences kept against 1 of 69 at 1.0 (docs/results.md, issue [19]).
    repetition_penalty: float = 1.3
    # The gate refuses a sentence with a word its finding does not hold (app/review/grounding.py). On: of the 61
    # model sentences the form checks kept on the evaluation set (run 39), it refused 60, every one false or
    # nonsense when read (docs/results.md, issue [19]). A true sentence it refuses gives way to its finding's own
    # plain sentence, also true; a false one kept would be signed.
    grounding: bool = True

    @property
    def answer_tokens(self) -> int:
        """The tokens the model may write per answer: the narrative's (single) or each part's (split)."""
        return self.part_tokens if self.narrative == "split" else self.max_tokens

    @property
    def tokens_at_most(self) -> int:
        """The most a narrative may write in all (a progress bar's end, an ETA's bound)."""
        return self.batch_width * self.part_tokens if self.narrative == "split" else self.max_tokens


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
    business_days: BusinessDays = MONDAY_TO_FRIDAY  # `calendar`: the holiday calendar of the business-day forms
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
    raise ReviewError(
        f"no review named {name!r}{did_you_mean(name, schedules)} (known: {known}); see `nightshift review list`"
    )


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

    def known(self, where: tuple, node: dict[str, Any], allowed: Iterable[str]) -> None:
        """Refuse a key of `node` that is not in `allowed`, naming the nearest known one (a typo is never ignored)."""
        allowed = sorted(allowed)
        for key in node:
            if key not in allowed:
                nearest = difflib.get_close_matches(key, allowed, n=1, cutoff=0)
                hint = f"; the nearest known key is `{nearest[0]}`" if nearest else ""
                raise self.fail((*where, key), f"is not a known key{hint} (known here: {', '.join(allowed)})")

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
    text = _schedule_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"line (\d+)", str(exc))
        raise ScheduleError(f"{path}:{line.group(1) if line else '?'}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ScheduleError(f"{path}: not a schedule: its arrays or tables are nested too deeply to read") from None
    read = _Reader(path, text, data)
    read.known((), data, TOP_KEYS)
    for section, allowed in SECTION_KEYS.items():
        read.known((section,), read.get((section,), dict, {}), allowed)
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
        days = business_days(read.get(("calendar",), str, None))
    except ValueError as exc:
        raise read.fail(("calendar",), str(exc)) from None
    try:
        trigger = parse_when(when, zone, days)
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
    scale = max((source.compared_decimals for source in sources.values()), default=2)
    for source in sources.values():
        source.scale = scale  # every figure at one scale: bank 125.00 is 125000 thousandths beside ledger 12.500
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
        materiality=materiality, business_days=days, generation=generation, prompt_template=prompt,
        report_template=report_template, output=output if output.is_absolute() else data_dir() / output,
    )  # fmt: skip


SCHEDULE_BYTES_MAX = 1 << 20  # a schedule file is a page of settings; anything larger is not one


def _schedule_text(path: Path) -> str:
    """A schedule file's text; what keeps it from being read (not a file, too large, not UTF-8) is a ScheduleError
    naming the file, and the line for an encoding error."""
    try:
        if not path.is_file():
            kind = ("a directory" if path.is_dir() else "a link to nothing" if not path.exists()
                    else "a special file (a pipe, socket or device)")  # fmt: skip
            raise ScheduleError(f"{path}: is {kind}, not a schedule file; move it out of the schedules folder")
        if path.stat().st_size > SCHEDULE_BYTES_MAX:
            raise ScheduleError(f"{path}: is {path.stat().st_size:,} bytes, not a schedule file (at most "
                                f"{SCHEDULE_BYTES_MAX:,}); move it out of the schedules folder")  # fmt: skip
        raw = path.read_bytes()
    except OSError as exc:
        raise ScheduleError(f"{path}: cannot be read: {exc.strerror or exc}; check that it is yours and "
                            "readable") from None  # fmt: skip
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ScheduleError(f"{path}:1: starts with a UTF-16 byte-order mark; save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")  # a byte-order mark from a Windows editor is left out
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ScheduleError(f"{path}:{line}: byte 0x{raw[exc.start]:02x} is not UTF-8 text; save the file as "
                            "UTF-8") from None  # fmt: skip


def _option_type(annotation: Any) -> type | tuple:
    """The TOML value type for a source field's annotation ("int | None" -> int, "dict[str, str]" -> dict)."""
    return _OPTION_TYPES[str(annotation).split("|")[0].split("[")[0].strip()]


def _source(read: _Reader, path: Path, key: str, config: Any) -> Source:
    """A source of the kind its `type` names, every other key one of that kind's fields (see sources.py)."""
    where = ("sources", key)
    if not isinstance(config, dict):
        raise read.fail(where, "should be a table: [sources.NAME] with type, path, ...")
    try:
        kind = source_kind(read.get((*where, "type"), str, container=config))
    except ReviewError as exc:
        raise read.fail((*where, "type"), str(exc)) from None
    options = [f for f in fields(kind) if f.init and f.name not in (*kind.SET_BY_REVIEW, "path")]
    read.known(where, config, ("type", "path", *(f.name for f in options)))
    location = Path(read.get((*where, "path"), str, container=config)).expanduser()
    values = {"path": location if location.is_absolute() else path.parent / location}
    for option in options:
        required = option.default is MISSING and option.default_factory is MISSING
        if option.name in config or required:
            values[option.name] = read.get((*where, option.name), _option_type(option.type), container=config)
    try:
        return kind(name=key, **values)
    except OptionError as exc:
        raise read.fail((*where, exc.option), exc.message) from None
    except ReviewError as exc:
        raise read.fail(where, str(exc)) from None


def _checks(read: _Reader, sources: dict[str, Source]) -> list[dict[str, Any]]:
    """The checks, each naming defined sources of one currency; match checks widen their sources' load window."""
    checks = read.get(("checks",), list, [])
    for number, check in enumerate(checks):
        where = ("checks", number)
        if not isinstance(check, dict):
            raise read.fail(where, "should be a table ([[checks]])")
        kind = read.get((*where, "type"), str, container=check)
        if kind not in CHECKS:
            raise read.fail((*where, "type"), f"{kind!r} is not a check; use one of {', '.join(CHECKS)}")
        read.known(where, check, ("type", "max_findings", *CHECK_KEYS.get(kind, REQUIRED[kind])))
        named = []
        for needed in (*REQUIRED[kind], *(("compare",) if "compare" in check else ())):
            source = read.get((*where, needed), str, container=check)
            if source not in sources:
                raise read.fail((*where, needed), f"names source {source!r}; defined: {', '.join(sources)}")
            named.append(sources[source])
        currencies = {source.compared_currency for source in named} - {None}
        if len(currencies) > 1:
            shown = ", ".join(f"{s.name} in {s.compared_currency}" for s in named if s.compared_currency)
            raise read.fail(where, f"compares {shown}: amounts in two currencies are never compared. Say how in "
                                   'one source: convert = { to = "EUR", rate = "0.9231", rounding = "half-even" }')  # fmt: skip
        if kind == "balance":  # its opening balance is the last before the period, however old
            sources[check["balances"]].whole = True
        if kind == "match":
            tolerance = read.get((*where, "date_tolerance_days"), int, DEFAULT_TOLERANCE_DAYS, check)
            if tolerance < 0:
                raise read.fail((*where, "date_tolerance_days"), "should be 0 or more")
            for source in named:  # rows this far outside the period may be an item's counterpart
                source.margin_days = max(source.margin_days, tolerance)
    return checks


def _generation(read: _Reader) -> Generation:
    model = read.get(("model",), dict, {})
    result = Generation(
        model=read.get(("model", "name"), str, None, model),
        max_tokens=read.get(("model", "max_tokens"), int, 160, model),
        temp=float(read.get(("model", "temp"), (int, float), 0.0, model)),
        seed=read.get(("model", "seed"), int, 0, model),
        prompt_findings=read.get(("model", "prompt_findings"), int, 10, model),
        memory_budget=read.get(("model", "memory_budget"), str, "auto", model),
        narrative=read.get(("model", "narrative"), str, Generation.narrative, model),
        batch_width=read.get(("model", "batch_width"), int, Generation.batch_width, model),
        part_tokens=read.get(("model", "part_tokens"), int, Generation.part_tokens, model),
        repetition_penalty=float(
            read.get(("model", "repetition_penalty"), (int, float), Generation.repetition_penalty, model)
        ),
        grounding=read.get(("model", "grounding"), bool, Generation.grounding, model),
    )
    try:
        parse_budget(result.memory_budget)
    except NightshiftError as exc:
        raise read.fail(("model", "memory_budget"), str(exc)) from None
    for key in ("max_tokens", "part_tokens"):
        if getattr(result, key) < 1:
            raise read.fail(("model", key), "should be at least 1")
    if result.narrative not in NARRATIVES:
        raise read.fail(("model", "narrative"), f"should be one of {', '.join(NARRATIVES)}")
    if result.repetition_penalty < 1:
        raise read.fail(("model", "repetition_penalty"), "should be 1 (none) or more")
    if result.batch_width < 2:
        raise read.fail(("model", "batch_width"), "should be at least 2 (the summary and one finding)")
    if result.narrative == "split" and result.temp != 0:
        raise read.fail(("model", "temp"), 'a split narrative (the default) is written greedily: set 0, or '
                        'narrative = "single"')  # fmt: skip
    return result
