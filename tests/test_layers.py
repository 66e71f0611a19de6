"""The import-linter contract in pyproject.toml (run by `lint-imports` in CI) gives every part of the app and the
engine a floor: a part it does not name would be free to import anything."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
