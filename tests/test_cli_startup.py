"""A command loads only what it uses: the light ones never import MLX, mlx-lm, transformers, Textual, WeasyPrint
or numpy.

What loads is checked, not how long it takes (bench/startup.py times it): each command runs in a fresh
process, as `nightshift` runs it, which then reports its modules.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nightshift.app.cli import COMMANDS, build_parser

HEAVY = ("mlx", "mlx_lm", "transformers", "textual", "weasyprint", "numpy")
LIGHT = [
    ["--help"],
    ["review", "list"],
    ["jobs"],
    ["reports", "list"],
    ["model", "list"],
    ["runs", "list"],
    ["generate", "--help"],
]

# Runs the command, then prints its exit status and the top-level packages it loaded as the last line.
PROBE = """
import json, sys
from nightshift.app.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit_:
    code = exit_.code
print(json.dumps({"code": code, "packages": sorted({name.split(".")[0] for name in sys.modules})}))
"""


def _run(args: list[str], home) -> tuple[int, set[str], str]:
    """(exit status, top-level packages loaded, output) of `nightshift ARGS` in a fresh process."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "NIGHTSHIFT_HOME": str(home)},
    )
    assert result.returncode == 0, result.stderr
    *output, report = result.stdout.splitlines()
    outcome = json.loads(report)
    return outcome["code"], set(outcome["packages"]), "\n".join(output) + result.stderr


@pytest.mark.parametrize("args", LIGHT, ids=" ".join)
def test_light_commands_leave_the_heavy_packages_unloaded(args, home):
    code, packages, output = _run(args, home)
    assert code == 0, output
    assert packages.isdisjoint(HEAVY), f"nightshift {' '.join(args)} loaded {sorted(packages & set(HEAVY))}"


def test_the_light_commands_still_do_their_work(home):
    assert "review" in _run(["--help"], home)[2] and "dashboard" in _run(["--help"], home)[2]
    assert "month-end" in _run(["review", "list"], home)[2]  # a bundled schedule
    assert "scheduled   month-end" in _run(["jobs"], home)[2]
    assert "no reports yet" in _run(["reports", "list"], home)[2]


def test_a_command_that_needs_the_engine_loads_it(home):
    code, packages, output = _run(["generate", "hello"], home)
    assert code == 1 and "nightshift model default" in output  # no model prepared: it said what to do
    assert "mlx" in packages  # the probe above sees imports, so the light commands' result means something


def test_the_chosen_command_gets_its_full_arguments(capsys):
    """Only the chosen command is registered, with all its actions and options; the others are listed by name."""
    with pytest.raises(SystemExit):
        build_parser(["review"]).parse_args(["review", "run", "--help"])
    assert "--as-of" in capsys.readouterr().out
    listed = build_parser([]).format_help()
    assert all(name in listed for name in COMMANDS)


def test_the_light_engine_modules_load_no_mlx():
    """The engine has no facade: a command imports from the defining module, and these light ones load no MLX."""
    code = (
        "import sys; from nightshift.engine.errors import NightshiftError; "
        "from nightshift.engine.store.manifest import is_store; from nightshift.engine.store.moefy_defaults import "
        "DEFAULT_EXPERTS; from nightshift.engine.generation import LanguageModel; "
        "from nightshift.engine.moe.settings import StreamSettings; "
        "print(sorted(m for m in ('mlx', 'mlx_lm', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
