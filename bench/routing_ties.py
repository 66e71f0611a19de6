"""Where nightshift's tokens on 16-bit experts part from a float32 reference of the same weights, and the gaps there.

    .venv/bin/python -m bench.routing_ties [--families deepseek_v3,minimax] [--forms fp8,bf16]

For each family and form a tiny random release checkpoint with FP8 or bfloat16 experts (bench/helpers/
routing_ties.py) is imported; nightshift's runtime generates 24 greedy tokens after a 48-token prompt, and mlx-lm
generates them from the same weights cast to float32. Both models then read the same tokens side by side, each
MoE layer's router scores and chosen experts recorded at every position. Printed: where the tokens part; the
first position where a router took other experts, with the reference's gap between its k-th and (k+1)-th scores
there against how far the 16-bit run's scores moved (the shift), beside the medians of both over every layer and
position; the final logits' top-two gap at the parting step; and the same models with the reference's routing
forced on nightshift's. What tests/test_float_experts.py asserts, printed; asserts nothing.
"""

from __future__ import annotations

# First, before mlx: nightshift.engine routes MLX's float matmuls to an OpenBLAS (engine/cpu_blas.py).
import nightshift.engine  # noqa: F401

# isort: split
import argparse
import tempfile
from pathlib import Path

from bench.helpers.moe_families import PROMPT, STEPS, float32_reference, nightshift_tokens
from bench.helpers.reference import greedy_tokens
from bench.helpers.routing_ties import (
    FORMS,
    ROUTER_LOGITS,
    Run,
    final_gap,
    flips,
    logprob_shift,
    position_of,
    routing_spread,
    shift_before,
    teacher_forced,
    write_float_experts,
)
from nightshift.engine.bench.decode import first_difference
from nightshift.engine.io.drives import Drive
from nightshift.engine.runtime import open_model
from nightshift.engine.store.importer import ImportOptions, import_checkpoint


def _where(position: int) -> str:
    step = position - position_of(0)
    return f"prompt position {position}" if step < 0 else f"step {step} (position {position})"


def _forced_line(reference: Run, forced: Run, expected: list[int]) -> str:
    shifts = [logprob_shift(reference, forced, step) for step in range(len(expected))]
    parted = first_difference(forced.picks, expected)
    head = f"max log-prob shift {max(shifts):.3f}; "
    if parted is None:
        return head + f"{len(expected)}/{len(expected)} picks equal"
    return head + (
        f"picks part at step {parted}: the reference's top-two gap {final_gap(reference, parted):.5f} "
        f"< log-prob shift {shifts[parted]:.3f}"
    )


def report(family: str, form: str, root: Path) -> list[str]:
    """The lines for one family and form, built and measured under `root`."""
    src = write_float_experts(family, form, root / "src")
    store = root / "store"
    import_checkpoint(src, store, [Drive("d0", root / "drive")], ImportOptions())
    reference = float32_reference(src)
    tokens, _ = nightshift_tokens(store, streamed=False)
    expected = greedy_tokens(reference, len(tokens), PROMPT)
    model = open_model(store)
    try:
        own, along = teacher_forced(model.model, family, tokens), teacher_forced(reference, family, tokens)
        chosen = teacher_forced(reference, family, expected)
        forced = teacher_forced(model.model, family, expected, forced=chosen.chosen)
    finally:
        model.close()
    gap, shift = routing_spread(along, own)
    parted = first_difference(tokens, expected)
    found = flips(along, own)
    lines = [
        f"{family} {form}: {STEPS} tokens after a {len(PROMPT)}-token prompt: "
        + (
            "all equal to the float32 reference's"
            if parted is None
            else f"part at step {parted} (reference {expected[parted]}, nightshift {tokens[parted]})"
        ),
        f"  routers, {len(along.scores)} MoE layers x {len(own.picks) + len(PROMPT) - 1} positions: median k-th to "
        f"(k+1)-th gap {gap:.4f}, median score shift {shift:.5f}; positions routed otherwise: {len(found)}",
    ]
    if found:
        first = found[0]
        lines.append(
            f"  first routing flip: {_where(first.position)}, layer {first.layer}: experts {first.reference} -> "
            f"{first.other}; reference gap {first.gap:.5f} vs shift {first.shift:.5f} ({first.shift / first.gap:.1f}x); "
            f"largest shift before it {shift_before(along, own, first.position):.5f}"
        )
    if parted is not None:
        there = next((flip for flip in found if flip.position == position_of(parted)), None)
        lines.append(
            f"  at step {parted}: "
            + (
                "no routing flip at its position"
                if there is None
                else f"routing flip at layer {there.layer}, gap {there.gap:.5f} vs shift {there.shift:.5f}"
            )
            + f"; the reference's final top-two gap {final_gap(along, parted):.3f}, "
            f"log-prob shift {logprob_shift(along, own, parted):.3f}"
        )
    lines.append(f"  the reference's routing forced: {_forced_line(chosen, forced, expected)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--families", default=",".join(ROUTER_LOGITS), help="comma-separated, of " + ", ".join(ROUTER_LOGITS)
    )
    parser.add_argument("--forms", default=",".join(FORMS), help="comma-separated, of " + ", ".join(FORMS))
    args = parser.parse_args(argv)
    for family in args.families.split(","):
        for form in args.forms.split(","):
            if family not in ROUTER_LOGITS or form not in FORMS:
                parser.error(f"{family} {form}: families are {', '.join(ROUTER_LOGITS)}; forms {', '.join(FORMS)}")
            with tempfile.TemporaryDirectory() as scratch:
                print("\n".join(report(family, form, Path(scratch))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
