"""Open a store for streaming: the trunk resident in RAM, the routed experts left on the drives."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from nightshift.engine.errors import ModelFormatError
from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.io.ceilings import Ceilings
from nightshift.engine.io.drives import Drive
from nightshift.engine.moe.budget import size_budget, step_copy_bytes, working_set_bytes
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.stream import ExpertStream
from nightshift.engine.moe.streaming import install
from nightshift.engine.store.families import build_model, quantize_as_stored
from nightshift.engine.store.head import hold_wide_heads
from nightshift.engine.store.manifest import Manifest, read_manifest
from nightshift.engine.store.safetensors_io import read_header, read_tensor
from nightshift.engine.store.share import StoreShare


def with_drives(manifest: Manifest, drives: list[Drive] | None) -> Manifest:
    """`manifest` with drive roots taken from `drives` where given (e.g. the rig's mounts), by name."""
    for drive in drives or []:
        if drive.name not in manifest.drives:
            raise ModelFormatError(
                f"drive {drive.name!r} holds nothing of store {manifest.name!r} (its drives: "
                f"{', '.join(manifest.drives)}); name the drives the store was placed on"
            )
        manifest.drives[drive.name] = str(drive.root)
    return manifest


def cap_buffer_cache(limit: int, step_copy: int) -> None:
    """Hold MLX's cache of freed buffers to `limit` bytes, or to the lower limit the process already set, plus
    `step_copy`: a buffer every step makes and frees (`step_copy_bytes`: an untied head's wider copy).

    On a GPU MLX keeps freed buffers for reuse up to its memory limit by default (most of the machine's RAM),
    blind to the expert budget and to a memory cgroup, so experts read and let go would stay held; what it
    reuses is one call's buffers, which the budget reserves as the working set. (On CPU its default is 32 MB.)
    A step's buffer larger than the cache is mapped and faulted anew each step: the float32 copy of a tied bf16
    LM head (113 MB on moe128-mixtral), before the model held it (engine/store/head.py), cost 27 700 page faults a
    token (docs/runs/decode-cpu.csv).
    """
    previous = mx.set_cache_limit(limit)
    mx.set_cache_limit(min(previous, limit) + step_copy)


def cap_buffer_cache_for(store: Path, manifest: Manifest | None = None) -> None:
    """`cap_buffer_cache` for a model of `store`, streamed or held in RAM: its largest layer's working set
    (`working_set_bytes`) plus an untied head's wider copy (`step_copy_bytes`; a tied head's is held, not made per
    step). `manifest`: the store's as opened (a pipeline rank's share), else read.

    In RAM a layer's call holds no read experts, only its compute's copy: the float32 copy of a 16-bit stack, twice
    the layer's expert bytes, within the working set's three times every expert a 2048-row pass can select. Bounded:
    MLX keeps no more freed buffers than this (a GPU's default is its memory limit); the prompt pass's fill it first.
    """
    manifest = manifest or read_manifest(store)
    cap_buffer_cache(working_set_bytes(manifest), step_copy_bytes(store / manifest.trunk["file"]))


def load_streaming(
    store: Path,
    settings: StreamSettings | None = None,
    drives: list[Drive] | None = None,
    ceilings: Ceilings | None = None,
    stage: StoreShare | None = None,
    instruments: Instruments | None = None,
    float32_prefill: bool = False,
) -> tuple[nn.Module, dict, ExpertStream]:
    """The model of the store at `store` with streaming expert layers, its config, and the stream behind them.

    An auto cache budget is sized here, before the trunk is loaded, from the RAM available now.
    `stage`: one rank of a pipeline (engine/distributed): only its layers, their trunk tensors and experts.
    `instruments`: a benchmark's counters and hooks, handed to the stream and its expert layers.
    `float32_prefill`: the expert layers' prompt GEMM for 16-bit activations too (engine/cpu_prefill.py).
    """
    store = Path(store)
    settings = settings or StreamSettings()
    manifest = with_drives(read_manifest(store), drives)
    if stage is not None:
        manifest = stage.manifest(manifest)
    trunk_path = store / manifest.trunk["file"]
    if not trunk_path.is_file():
        raise ModelFormatError(f"{trunk_path} is missing; import the model again")
    drives_in_use = len(settings.use_drives or manifest.drives)
    threads = (settings.demand_threads + settings.prefetch_threads) * drives_in_use
    budget = size_budget(settings.cache_bytes, manifest, store, threads, settings.context_tokens)
    cap_buffer_cache_for(store, manifest)
    weights = {e.name: read_tensor(e) for e in read_header(trunk_path) if stage is None or stage.keeps(e.name)}
    model = build_model(manifest.config)
    if stage is not None:
        stage.apply(model)
    stream = ExpertStream(manifest, settings, budget, ceilings, instruments)
    if stage is None:  # a pipeline's ranks each hold some layers: none keeps the store's whole profile
        stream.open_profile(store)  # the warm start reads while the trunk loads
    try:
        install(model, manifest, stream, float32_prefill)
        quantize_as_stored(model, weights)
        model.eval()
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        stream.close()
        raise ModelFormatError(f"the store at {store} does not match its model: {exc}") from exc
    mx.eval(model.parameters())
    hold_wide_heads(model, manifest.config)
    return model, manifest.config, stream
