"""Every MoE family of the installed mlx-lm, in both layouts people download, imports exactly or is refused by name.

Generated from mlx-lm itself (bench/helpers/moe_families.py): for each family a tiny random checkpoint from its own
Model class, written with mlx-lm's converted names and with the upstream release names (and once more with every
boolean option of the family switched on: tied embeddings, norm_head, biases, ...), is imported; then every
trunk and expert tensor of the store must equal what `mlx_lm.utils.load_model` holds for the same checkpoint
(same dtype, bit for bit), and greedy tokens from the store, streamed and in RAM, must equal mlx-lm's. A family
the importer refuses must be refused with its reason, before anything is written. One family is quick; the rest
are slow. bench/family_table.py runs the same checks and prints the table in docs/store.md.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from mlx_lm.generate import generate_step

from bench.helpers.moe_families import (
    LAYOUTS,
    QUANTIZATIONS,
    FamilyError,
    Outcome,
    build,
    check_import,
    moe_families,
    quantized_checkpoint,
    tiny_config,
    write_checkpoint,
)
from nightshift.engine.generation import DEFAULT_CHUNK

QUICK = "qwen3_moe"  # the family the quick run checks; every other one is slow
QUICK_CONVERSION = (QUICK, "4bit bf16")  # the hub's commonest MLX format; every other conversion is slow
SLOW = pytest.mark.slow


# The tiny config as is, in each layout; and with every boolean option of the family switched on, in one layout:
# the release one where the family has it (its names pass through more of sanitize() than mlx-lm's own), else
# mlx-lm's. bench/family_table.py checks options on in both layouts; the suite must fit the README's time.
OPTIONS = "release or mlx"


def _cases() -> list:
    def case(family: str, layout: str, variant: str):
        name = f"{family}-{layout}" if variant == "base" else f"{family}-{variant}"
        return pytest.param(family, layout, variant, id=name, marks=() if family == QUICK else pytest.mark.slow)

    cases = []
    for family in moe_families():
        cases += [case(family, layout, "base") for layout in LAYOUTS]
        cases.append(case(family, OPTIONS, "options"))
    return cases


def written_or_skipped(family: str, out: Path, layout: str, variant: str = "base") -> Path:
    """The family's checkpoint in `layout`, or a skip saying why none can be made (the table lists these)."""
    try:
        config = tiny_config(family, options=variant == "options")
        if variant == "options" and config == tiny_config(family):
            build(family)  # a family that does not build at all says so (FamilyError), not "no options"
            pytest.skip(f"{family} has no boolean option that is off by default and runs when on")
        if layout == OPTIONS:
            try:
                return write_checkpoint(family, out, "release", config=config)
            except FamilyError:
                layout = "mlx"  # no release layout can be made for this family (its base case says why)
        return write_checkpoint(family, out, layout, config=config)
    except FamilyError as exc:
        pytest.skip(f"no {layout} checkpoint: {exc}")


def assert_exact_or_refused(family: str, outcome: Outcome) -> None:
    if outcome.refused is not None:
        assert family in outcome.refused, f"the refusal does not name the family: {outcome.refused}"
        return
    assert not outcome.differences, f"{family}: " + "; ".join(outcome.differences[:8])
    if outcome.tokens_unchecked:
        pytest.skip(f"tensors equal; tokens not compared: {outcome.tokens_unchecked}")


def test_families_are_found_from_mlx_lm():
    """The enumeration is mlx-lm's own: its best-known MoE families are found, its dense ones are not."""
    families = moe_families()
    assert {"mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "llama_moe"} <= set(families)
    assert not {"llama", "qwen3", "mistral3", "gemma3"} & set(families)


@pytest.mark.parametrize(("family", "layout", "variant"), _cases())
def test_family_imports_exactly_or_is_refused(family, layout, variant, tmp_path):
    src = written_or_skipped(family, tmp_path / "src", layout, variant)
    assert_exact_or_refused(family, check_import(src, tmp_path))


# Conversions checked on every family; the rest of QUANTIZATIONS (mixed per-layer bits, MXFP8, NVFP4: 1-6 s each,
# ~10 more minutes of the suite on every family) on families whose experts and attention differ in kind: qwen3_moe
# (plain SwitchGLU), deepseek_v3 (MLA, shared experts, a dense first layer), gpt_oss (expert biases, its own
# SwiGLU), nemotron_h (SwitchMLP in a Mamba hybrid); and nightshift's own llama_moe, which goes through mlx-lm's
# functions rather than its `convert`, at mixed bits.
EVERY_FAMILY = ("4bit", "4bit bf16", "4bit f16", "8bit bf16", "mxfp4")
OTHERS = [name for name in QUANTIZATIONS if name not in EVERY_FAMILY]
REPRESENTATIVE = {
    **dict.fromkeys(("qwen3_moe", "deepseek_v3", "gpt_oss", "nemotron_h"), OTHERS),
    "llama_moe": ["mixed_3_6"],
}


def _conversions() -> list:
    return [
        pytest.param(family, name, id=f"{family}-{name}", marks=() if (family, name) == QUICK_CONVERSION else SLOW)
        for family in moe_families()
        for name in QUANTIZATIONS
        if name in EVERY_FAMILY or name in REPRESENTATIVE.get(family, ())
    ]


@pytest.mark.parametrize(("family", "quantization"), _conversions())
def test_mlx_lm_conversion_imports_and_generates_token_for_token(family, quantization, tmp_path):
    """A conversion made with mlx-lm's own convert (4-bit with float32, bfloat16 or float16 scales, 8-bit bfloat16,
    MXFP4; mixed 3/6 bits per layer, MXFP8, NVFP4) keeps its quantization, and nightshift's greedy tokens, prompt
    included, are plain mlx-lm's."""
    src = written_or_skipped(family, tmp_path / "src", OPTIONS)  # options off: the release layout, else mlx-lm's
    try:
        converted = quantized_checkpoint(src, tmp_path / "converted", **QUANTIZATIONS[quantization])
    except FamilyError as exc:
        pytest.skip(str(exc))
    assert_exact_or_refused(family, check_import(converted, tmp_path))


def test_the_default_prefill_chunk_is_mlx_lms_prefill_step():
    """A default generation reads the prompt in mlx-lm's steps (engine/prefill.py): the same split, the same bits."""
    assert inspect.signature(generate_step).parameters["prefill_step_size"].default == DEFAULT_CHUNK
