"""Which model a command or a review uses, and how it is opened to generate.

Shared by the commands, the scheduler service and the reviews, so they all mean the
same thing by a model name and all stream a store's experts from its drives.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nightshift.app.default_model import require_default_model
from nightshift.app.paths import models_dir
from nightshift.engine.errors import NightshiftError, did_you_mean
from nightshift.engine.store.manifest import is_store

if TYPE_CHECKING:
    from nightshift.engine.distributed.model import Cluster
    from nightshift.engine.generation import LanguageModel
    from nightshift.engine.runtime import Model


def resolve_model(name: str | None) -> Path:
    """A model directory from a name under the data dir or a path; the default model when None.

    A bare name that is a model in the data dir is that model, even where the current directory holds
    a folder of the same name (the repository's own `bench/`, say); write `./NAME` for the folder.
    """
    if name is None:
        return require_default_model()
    named = models_dir() / name
    if Path(name).name == name and named.is_dir():
        return named
    candidate = Path(name).expanduser()
    if candidate.is_dir():
        return candidate
    known = sorted(p.name for p in models_dir().iterdir()) if models_dir().is_dir() else []
    raise NightshiftError(
        f"no model named {name!r}{did_you_mean(name, known)} (not a directory, not in {models_dir()}); "
        "see `nightshift model list`"
    )


def open_for_generation(
    path: Path,
    in_ram: bool = False,
    drafter: Path | None = None,
    memory_budget: str = "auto",
    float32_prefill: bool = False,
    context_tokens: int = 0,
) -> Model:
    """Open `path` to generate: a store streams its experts from its drives unless `in_ram`, keeping what
    `memory_budget` allows in RAM (auto: sized from the RAM available, for a run of at most `context_tokens`
    tokens where the caller knows it; 0: none; or a size such as 12G);
    `drafter` (a model directory sharing its tokenizer) drafts tokens for speculative decoding;
    `float32_prefill`: prompts of 16-bit checkpoints through float32 BLAS (faster, not mlx-lm's tokens)."""
    from nightshift.engine.moe.settings import StreamSettings, parse_budget
    from nightshift.engine.moe.tuning import apply_tuning  # the store's `model tune` choice, if any
    from nightshift.engine.runtime import open_model  # MLX and mlx-lm: only when a model is opened

    budget = parse_budget(memory_budget)
    streamed = (
        StreamSettings(verify_checksums="first", cache_bytes=budget, context_tokens=context_tokens)
        if is_store(path) and not in_ram
        else None
    )
    if streamed is not None:
        streamed = apply_tuning(path, streamed)
    return open_model(path, stream=streamed, drafter=drafter, float32_prefill=float32_prefill)


def open_for_review(path: Path, memory_budget: str = "auto", cluster: Cluster | None = None) -> LanguageModel:
    """A review's model: over `cluster`'s hosts when the service generates over several (`serve --hosts`),
    else in this process (`open_for_generation`)."""
    if cluster is not None:
        return cluster.open(path, memory_budget)
    return open_for_generation(path, memory_budget=memory_budget)
