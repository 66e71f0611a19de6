"""How the code and its tests are put together: the import-linter contract in pyproject.toml (run by `lint-imports`
in CI) gives every part of the app and the engine a floor (a part it does not name would be free to import
anything); a test module imports helpers from tests/helpers/, never another test module; a fixture is defined once;
benchmark code sits where its kind goes (docs/bench.md): the installed package is a library that imports no study
script or test, no study script imports the tests (what both need is in bench/helpers/), and every study script in
bench/ imports as `bench.NAME` from the repository root."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def parts(folder: str) -> set[str]:
    """The modules and packages directly in `folder`."""
    found = set()
    for path in (ROOT / folder).iterdir():
        if path.suffix == ".py" and path.stem != "__init__":
            found.add(path.stem)
        elif path.is_dir() and (path / "__init__.py").is_file():
            found.add(path.name)
    return found


def test_every_part_of_the_app_and_the_engine_has_a_floor():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    floors = {
        contract["containers"][0]: {part.strip() for layer in contract["layers"] for part in layer.split("|")}
        for contract in contracts
        if contract["type"] == "layers" and "containers" in contract
    }
    assert floors["nightshift.app"] == parts("app")
    assert floors["nightshift.engine"] == parts("engine")


def imported_modules(tree: ast.AST) -> set[str]:
    """Every module an `import` or `from ... import` in `tree` names, function-local ones included."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def python_files() -> list[Path]:
    """The tests, conftest, the helpers and the benchmark scripts."""
    return sorted([*TESTS.rglob("*.py"), *(ROOT / "bench").glob("*.py")])


def test_no_module_imports_a_test_module():
    found = {
        str(path.relative_to(ROOT)): sorted(name for name in imported_modules(ast.parse(path.read_text()))
                                            if name.split(".")[-1].startswith("test_"))
        for path in python_files()
    }  # fmt: skip
    assert {path: names for path, names in found.items() if names} == {}


def test_no_fixture_is_defined_twice():
    defined = defaultdict(list)
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                "fixture" in ast.unparse(decorator) for decorator in node.decorator_list
            ):
                defined[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert {name: places for name, places in defined.items() if len(places) > 1} == {}


def package_files() -> list[Path]:
    """The modules of the installed package's code: the app and the engine."""
    return sorted([*(ROOT / "app").rglob("*.py"), *(ROOT / "engine").rglob("*.py")])


def imports_from(paths: list[Path], packages: tuple[str, ...]) -> dict[str, list[str]]:
    """Per file of `paths` that imports from any of the top-level `packages`, the modules it imports from them."""
    found = {
        str(path.relative_to(ROOT)): sorted(name for name in imported_modules(ast.parse(path.read_text()))
                                            if name.split(".")[0] in packages)
        for path in paths
    }  # fmt: skip
    return {path: names for path, names in found.items() if names}


def test_the_package_imports_no_study_script_or_test():
    assert imports_from(package_files(), ("bench", "tests")) == {}


def test_no_study_script_imports_the_tests():
    """A benchmark runs without the test package: what study scripts share with the tests lives in bench/helpers/
    (the peers' side scripts under bench/peers/ included)."""
    assert imports_from(sorted((ROOT / "bench").rglob("*.py")), ("tests",)) == {}


def test_an_engine_module_with_a_main_is_a_process_the_engine_starts():
    """Study scripts live in bench/; a `__main__` in the engine is one side of a run the engine itself starts."""
    engine = sorted((ROOT / "engine").rglob("*.py"))
    sources = {path: path.read_text() for path in engine}
    mains = [path for path, text in sources.items() if 'if __name__ == "__main__"' in text]
    assert mains, "the engine's own processes (the distributed worker, a side of `bench peer`) have a __main__"
    for path in mains:
        dotted = "nightshift." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
        started = [
            other for other, text in sources.items() if other != path and (dotted in text or f'"{path.name}"' in text)
        ]
        assert started, (
            f"{path.relative_to(ROOT)} has a __main__ but nothing in the engine starts it: a study script goes in bench/"
        )


@pytest.mark.slow
def test_every_study_script_imports_from_the_repository_root():
    """As the README runs them (`.venv/bin/python -m bench.NAME`), in a fresh interpreter with no PYTHONPATH: every
    script, with what it imports (the package, its sibling scripts, bench/helpers)."""
    names = sorted(path.stem for path in (ROOT / "bench").glob("*.py") if path.stem != "__init__")
    code = f"import importlib\nfor name in {names!r}:\n    importlib.import_module('bench.' + name)"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
