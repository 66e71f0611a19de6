"""Tiny synthetic checkpoints and stores, and the streamed or in-RAM tokens the engine's tests compare."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.helpers.reference import greedy_tokens
from nightshift.engine.io.drives import Drive
from nightshift.engine.moe.figures import StreamFigures
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.reader import ExpertReader
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.stream import ExpertStream
from nightshift.engine.runtime import open_model
from nightshift.engine.store.importer import ImportOptions, import_checkpoint
from nightshift.engine.store.moefy import CALIBRATION_TEXT, moefy
from nightshift.engine.store.synth import synthesize

QUICK = ["kimi_k3", "deepseek_v3", "qwen3_moe"]  # the families the quick tests stream; the others are slow
PROMPT = np.random.default_rng(7).integers(3, 500, size=71).tolist()  # token ids the prefill tests read
TOKENS = 12  # generated after PROMPT by `tokens_and_stats`
EXPERTS = 8  # experts per layer of a tiny MoEfied model
# Enough tokens for the tiny model's 128 neurons and 64-wide routers, few enough to keep the tests quick.
SHORT_CALIBRATION = CALIBRATION_TEXT.read_text()[:2500]


def tiny_checkpoint(root: Path, arch: str, skew: float = 0.0) -> Path:
    return synthesize(arch, "tiny", root / f"{arch}-src", seed=1, skew=skew)


def import_tiny(root: Path, src: Path, name: str, trunk_bits: int = 16, drives: int = 2) -> Path:
    store = root / name
    roots = [Drive(f"d{i}", root / f"{name}-drive{i}") for i in range(drives)]
    import_checkpoint(src, store, roots, ImportOptions(trunk_bits=trunk_bits))
    return store


def tiny_store_in(root: Path, arch: str) -> Path:
    """`root`/store: a two-drive store of a tiny synthetic `arch` checkpoint (written in `root` too)."""
    return import_tiny(root, tiny_checkpoint(root, arch), "store")


def tiny_store(tmp_path_factory, arch: str) -> Path:
    """A two-drive store of a tiny synthetic `arch` checkpoint, in a new temporary directory."""
    return tiny_store_in(tmp_path_factory.mktemp(arch), arch)


def streamed(
    store: Path, settings: StreamSettings, steps: int = 32, devices: dict | None = None
) -> tuple[list[int], ExpertStream]:
    """Greedy tokens from the streamed model and its (closed) stream; `devices` overrides drive -> device."""
    model, _, stream = load_streaming(store, settings)
    stream.reader.placer.devices.update(devices or {})
    try:
        return greedy_tokens(model, steps), stream
    finally:
        stream.close()


def streamed_tokens(
    store: Path, settings: StreamSettings, steps: int = 32, devices: dict | None = None
) -> tuple[list[int], StreamFigures]:
    tokens, stream = streamed(store, settings, steps, devices)
    return tokens, stream.figures()


def delay_reads(reader: ExpertReader, drive: str, wait: Callable[[], object]) -> None:
    """Every read on `drive` calls `wait` first: a slow drive, or one stalled until `wait` returns."""
    read_part = reader.files._read_part

    def delayed(buffer, what, ticket, problems):
        if ticket.drive == drive:
            wait()
        return read_part(buffer, what, ticket, problems)

    reader.files._read_part = delayed


def tokens_and_stats(store, chunk: int, stream: StreamSettings | None):
    model = open_model(store, stream=stream)
    try:
        chunks = list(model.generate_tokens(PROMPT, max_tokens=TOKENS, prefill_chunk=chunk))
    finally:
        model.close()
    return [c.token for c in chunks], chunks[-1].stats


def tiny_moefy(dense, out, experts=EXPERTS, k=EXPERTS):
    return moefy(dense, out, experts=experts, k=k, calibration=SHORT_CALIBRATION, say=lambda message: None)
