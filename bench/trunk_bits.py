"""What --trunk-bits 16/8/4 does to logits and greedy tokens (docs/results.md, store section); printed, never asserted.

    .venv/bin/python -m bench.trunk_bits SCRATCH_DIR

Tiny synthetic checkpoints of each family, imported at each trunk width, against mlx-lm.
The decode compared is the tests' reference one (bench/helpers/reference.py).
"""

from __future__ import annotations

# First, before mlx: nightshift.engine routes MLX's float matmuls to an OpenBLAS (engine/cpu_blas.py).
import nightshift.engine  # noqa: F401

# isort: split
import argparse
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_model

from bench.helpers.reference import PROMPT, greedy_tokens
from nightshift.engine.io.drives import Drive
from nightshift.engine.models import get_classes
from nightshift.engine.store.importer import ImportOptions, import_checkpoint
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.synth import synthesize
from nightshift.engine.store.synth_families import FAMILIES


def _agreeing_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def trunk_effect(root: Path) -> list[str]:
    """One table row per (family, trunk bits): max |logit diff|, greedy tokens equal before divergence, trunk size."""
    rows = [
        "| family | trunk bits | trunk.safetensors | logit std | max abs logit diff | greedy tokens equal (of 32) |",
        "|---|---|---|---|---|---|",
    ]
    for arch in FAMILIES:
        src = synthesize(arch, "tiny", root / f"{arch}-src", seed=1)
        reference, _ = load_model(src, get_model_classes=get_classes)
        expected, expected_tokens = reference(mx.array([PROMPT])).astype(mx.float32), greedy_tokens(reference)
        spread = mx.std(expected, axis=-1).mean().item()
        for bits in (16, 8, 4):
            store = root / f"{arch}-{bits}"
            import_checkpoint(src, store, [Drive("d", root / f"{arch}-{bits}-drive")], ImportOptions(trunk_bits=bits))
            model, _ = load_store(store)
            diff = mx.abs(model(mx.array([PROMPT])).astype(mx.float32) - expected).max().item()
            same = _agreeing_prefix(greedy_tokens(model), expected_tokens)
            size = (store / "trunk.safetensors").stat().st_size
            rows.append(f"| {arch} | {bits} | {size / 1e3:.0f} kB | {spread:.3g} | {diff:.3g} | {same} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scratch", type=Path, help="folder for the synthetic checkpoints and stores (created)")
    root = parser.parse_args().scratch
    root.mkdir(parents=True, exist_ok=True)
    print("\n".join(trunk_effect(root)))


if __name__ == "__main__":
    main()
