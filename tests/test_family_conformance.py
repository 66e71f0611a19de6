"""Every MoE family of the installed mlx-lm, in both layouts people download, imports exactly or is refused by name.

Generated from mlx-lm itself (tests/helpers/moe_families.py): for each family a tiny random checkpoint from its own
Model class, written with mlx-lm's converted names and with the upstream release names (and once more with every
boolean option of the family switched on: tied embeddings, norm_head, biases, ...), is imported; then every
trunk and expert tensor of the store must equal what `mlx_lm.utils.load_model` holds for the same checkpoint
(same dtype, bit for bit), and greedy tokens from the store, streamed and in RAM, must equal mlx-lm's. A family
the importer refuses must be refused with its reason, before anything is written. One family is quick; the rest
are slow. bench/family_table.py runs the same checks and prints the table in docs/store.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.moe_families import (
    LAYOUTS,
    FamilyError,
    Outcome,
    build,
    check_import,
    moe_families,
    quantized_checkpoint,
    tiny_config,
    write_checkpoint,
)

QUICK = "qwen3_moe"  # the family the quick run checks; every other one is slow
QUANTIZED_FAMILIES = ("qwen3_moe", "deepseek_v3", "mixtral", "gpt_oss")


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


@pytest.mark.slow
@pytest.mark.parametrize("family", QUANTIZED_FAMILIES)
def test_mlx_lm_4bit_conversion_imports_token_for_token(family, tmp_path):
    """A 4-bit conversion made with mlx-lm's own convert keeps its quantization and its tokens."""
    src = written_or_skipped(family, tmp_path / "src", "release")
    converted = quantized_checkpoint(src, tmp_path / "4bit", bits=4)
    outcome = check_import(converted, tmp_path)
    assert outcome.refused is None, outcome.refused
    assert not outcome.differences, "; ".join(outcome.differences[:8])
