"""The wheel, built from the checkout and installed into a fresh venv, is the whole tool: it runs a review.

The venv sees the test venv's dependencies through a .pth file of plain path lines. Python adds
those directories to sys.path but does not process the .pth files inside them, so the test venv's
editable install of nightshift (a .pth that installs an import finder) stays out. Nothing here
uses the network: the build runs without isolation and the install without an index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.helpers.service import user_schedule
from tests.helpers.shared import built_once

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
# What a wheel is built from: pyproject.toml names README.md as the long description.
SOURCES = ("pyproject.toml", "README.md", "app", "engine", "templates", "schedules", "docs")
# Files the wheel must carry besides the Python modules, by their folder in the checkout.
DATA = ("templates/**/*", "schedules/**/*", "app/**/*.tcss", "engine/store/data/*", "docs/*.md")


def checkout_files(pattern: str) -> list[Path]:
    return [p for p in REPO.glob(pattern) if p.is_file() and "__pycache__" not in p.parts]


def in_wheel(path: Path) -> str:
    """Where a checkout file lies in the wheel: every folder is mapped under `nightshift/`."""
    return "nightshift/" + path.relative_to(REPO).as_posix()


def package_folders() -> list[str]:
    """The import name of every package folder in the checkout (a folder with an `__init__.py`)."""
    inits = (p for folder in ("app", "engine") for p in checkout_files(f"{folder}/**/__init__.py"))
    return sorted(".".join(("nightshift", *init.parent.relative_to(REPO).parts)) for init in inits)


def build_wheel(folder: Path) -> None:
    """`pip wheel .` of a copy of the checkout into `folder`/wheel (an in-tree build would leave build/ in the
    repo)."""
    source, out = folder / "source", folder / "wheel"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out), str(source)]
    done = subprocess.run(build, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The checkout's wheel, built once per session."""
    (built,) = (built_once(tmp_path_factory, "wheel", build_wheel) / "wheel").glob("nightshift-*.whl")
    return built


def install_wheel(wheel: Path, root: Path) -> None:
    """A fresh venv at `root` with `wheel` installed and the test venv's dependencies visible."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    ours = dict.fromkeys((sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]))
    (Path(site) / "test-dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    install = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(python), "install",
               "--no-deps", "--no-index", str(wheel)]  # fmt: skip
    done = subprocess.run(install, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="session")
def venv(wheel, tmp_path_factory) -> Path:
    """`install_wheel`'s venv, made once per session (tests only run it); its root."""
    return built_once(tmp_path_factory, "venv", lambda folder: install_wheel(wheel, folder / "venv")) / "venv"


def run_in(cwd: Path, *args: str | Path) -> subprocess.CompletedProcess:
    """A command run in `cwd` (outside the checkout, data dir cwd/home), nothing in its environment pointing
    into the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["NIGHTSHIFT_HOME"] = str(cwd / "home")
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_wheel_carries_the_bundled_files_under_the_nightshift_name_only(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = checkout_files("app/**/*.py") + checkout_files("engine/**/*.py")
    data = [path for pattern in DATA for path in checkout_files(pattern)]
    assert any("sample-data" in path.parts for path in data) and any(p.suffix == ".tcss" for p in data)
    assert sorted(in_wheel(path) for path in modules + data if in_wheel(path) not in names) == []
    assert {name.split("/")[0] for name in names} == {"nightshift", wheel.name.split("-py")[0] + ".dist-info"}


def test_every_package_folder_imports_from_the_wheel_and_app_or_engine_alone_do_not(venv, tmp_path):
    packages = package_folders()
    assert "nightshift.app.tui.widgets" in packages and "nightshift.engine.store" in packages
    script = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    print(importlib.import_module(name).__file__)\n"
        "from nightshift.app.paths import bundled\n"
        "print(bundled('templates')); print(bundled('schedules'))\n"
        "from nightshift.app.paths import doc; print(doc('reviews.md'))\n"
    )
    done = run_in(tmp_path, venv / "bin" / "python", "-c", script, *packages)
    assert done.returncode == 0, done.stderr
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    files = [Path(line) for line in done.stdout.splitlines()]
    assert len(files) == len(packages) + 3 and files[-1].is_file()  # the docs that messages cite ship too
    assert [str(path) for path in files if not path.is_relative_to(site / "nightshift")] == []
    for name in ("app", "engine"):
        done = run_in(tmp_path, venv / "bin" / "python", "-c", f"import {name}")
        assert done.returncode == 1 and f"No module named '{name}'" in done.stderr


def test_the_installed_command_runs_a_review_to_a_pdf(venv, tiny_model, tmp_path):
    bundled = run_in(tmp_path, venv / "bin" / "python", "-c",
                     "from nightshift.app.paths import bundled; print(bundled('schedules'))")  # fmt: skip
    assert bundled.returncode == 0, bundled.stderr
    home = tmp_path / "home"
    user_schedule(home, tiny_model, bundled=Path(bundled.stdout.strip()))
    done = run_in(tmp_path, venv / "bin" / "nightshift", "review", "run", "tiny", "--now")
    assert done.returncode == 0, done.stderr
    report = Path(done.stdout.strip())
    assert report.is_relative_to(home / "reports" / "tiny") and report.read_bytes().startswith(b"%PDF")
