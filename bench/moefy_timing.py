"""MoEfication time of the default model, by step and in all; printed, never asserted.

    .venv/bin/python -m bench.moefy_timing [--against REV] [--runs 2] [--dense DIR]

Times this checkout's engine/store/moefy.py and, with --against, the one at git revision REV, taking
turns so that other work on a shared machine weighs on both alike. Steps run one after another on the
shipped calibration text (the forward pass over all windows, then per layer the activations, the
grouping, the groups' output norms and the router fit, summed over layers); then `moefy` runs whole
into a temporary directory. Wall and CPU time (all threads, BLAS's included) for each; the sha256 of
each run's model.safetensors shows whether a version changes the model.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import numpy as np

from nightshift.app.default_model import default_model_dir
from nightshift.engine.store import moefy

REPO = Path(__file__).resolve().parents[1]


def revision_module(revision: str, folder: Path) -> ModuleType:
    """engine/store/moefy.py as it was at `revision`, imported under its own name."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{revision}:engine/store/moefy.py"], check=True, capture_output=True
    ).stdout
    path = folder / f"moefy_{revision.replace('/', '_')}.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Clock:
    """Wall and CPU seconds summed per label."""

    def __init__(self) -> None:
        self.seconds: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(2))
        self.label = ""

    def __call__(self, label: str) -> Clock:
        self.label = label
        return self

    def __enter__(self) -> None:
        self.start = np.array([time.perf_counter(), time.process_time()])

    def __exit__(self, *_) -> None:
        self.seconds[self.label] += np.array([time.perf_counter(), time.process_time()]) - self.start


def time_steps(module: ModuleType, dense: Path, text: str) -> dict[str, np.ndarray]:
    """Each step of one MoEfication with `module`'s functions, one step after another."""
    clock = Clock()
    reference = module.DenseReference(dense)
    with clock("forward pass"):
        inputs = reference.mlp_inputs(reference.windows(text))
    for index, (layer, x) in enumerate(zip(reference.layers, inputs)):
        with clock("activations"):
            h = module.neuron_activations(layer.mlp, x)
        down = np.array(layer.mlp.down_proj.weight)
        with clock("grouping"):
            groups = module.group_neurons(np.abs(h) * np.linalg.norm(down, axis=0), moefy.DEFAULT_EXPERTS, index)
        with clock("group output norms"):
            contribution = np.linalg.norm(module.group_outputs(h, down, groups), axis=-1)
        with clock("router fit"):
            module.fit_linear_router(x, module.router_targets(contribution))
    return dict(clock.seconds)


def time_moefy(module: ModuleType, dense: Path, text: str, folder: Path) -> tuple[np.ndarray, str]:
    """One whole `moefy` run: (wall, CPU) seconds and the sha256 of the model it writes."""
    clock = Clock()
    out = folder / "out"
    with clock("moefy"):
        module.moefy(dense, out, calibration=text, say=lambda _: None)
    digest = hashlib.sha256((out / moefy.MODEL_FILE).read_bytes()).hexdigest()
    return clock.seconds["moefy"], digest


def _pair(seconds: np.ndarray) -> str:
    wall, cpu = seconds
    return f"{wall:.1f} / {cpu:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="a git revision whose moefy.py to time alongside this checkout's")
    parser.add_argument("--runs", type=int, default=2, help="whole moefy runs per version")
    parser.add_argument("--dense", type=Path, default=default_model_dir(), help="the dense llama to MoEfy")
    args = parser.parse_args()
    if not (args.dense / "config.json").is_file():
        sys.exit(f"no dense model at {args.dense}: run `nightshift model default` first, or pass --dense")
    text = moefy.CALIBRATION_TEXT.read_text()
    with tempfile.TemporaryDirectory() as scratch:
        versions = {"this checkout": moefy}
        if args.against:
            versions[args.against] = revision_module(args.against, Path(scratch))
        steps = {name: time_steps(module, args.dense, text) for name, module in versions.items()}
        print(f"{'step (wall s / CPU s)':24}" + "".join(f"{name:>22}" for name in versions))
        for step in next(iter(steps.values())):
            print(f"{step:24}" + "".join(f"{_pair(steps[name][step]):>22}" for name in versions))
        for run in range(args.runs):
            for name, module in versions.items():
                with tempfile.TemporaryDirectory(dir=scratch) as folder:
                    (wall, cpu), digest = time_moefy(module, args.dense, text, Path(folder))
                print(f"moefy run {run + 1} {name}: wall {wall:.1f} s, CPU {cpu:.1f} s, model.safetensors {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
