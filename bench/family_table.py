"""The families x layouts x quantizations table of docs/store.md, from the conformance suite's own checks.

    .venv/bin/python -m bench.family_table SCRATCH_DIR [--out TABLE.md] [--catalogue PATH] [--families a,b]
        [--rss-layers 4,32] [--rss-scale 4]

For every MoE family of the installed mlx-lm (bench/helpers/moe_families.py): a tiny random checkpoint in mlx-lm's
converted layout and in the release layout, both again with every boolean option of the family switched on
(tied embeddings, norm_head, biases, ...), and mlx-lm `convert` 4-bit and mxfp4 conversions of it, each
imported and compared with `mlx_lm.load` (tensors bit for bit, 24 greedy tokens streamed and in RAM). Each cell
is `pass`, `refused: why`, `fail: what` or `-: why no such checkpoint exists`. Then the peak RSS of an import of
the family with the largest experts at two layer counts (each in a fresh process), which must stay flat.
Both results go into the run catalogue.
"""

from __future__ import annotations

# First, before mlx: nightshift.engine routes MLX's float matmuls to an OpenBLAS (engine/cpu_blas.py).
import nightshift.engine  # noqa: F401

# isort: split
import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from bench.helpers.moe_families import (
    EXPERT_FIELDS,
    HIDDEN_FIELDS,
    INTERMEDIATE_FIELDS,
    LAYER_FIELDS,
    LAYERS,
    LAYOUTS,
    QUANTIZATIONS,
    FamilyError,
    build,
    check_import,
    moe_families,
    option_flags,
    quantized_checkpoint,
    random_weights,
    release_weights,
    switch_sites,
    tiny_config,
    write_checkpoint,
)
from nightshift.engine.instruments.catalogue import Catalogue, Run

OPTIONS = "options on"  # the same checks with every boolean option of the family switched on
COLUMNS = [*LAYOUTS, *(f"{layout}, {OPTIONS}" for layout in LAYOUTS), *QUANTIZATIONS, OPTIONS, "release experts as"]
CHECKED = COLUMNS[:-2]


def _cell(outcome) -> str:
    if outcome.refused is not None:
        return f"refused: {_short(outcome.refused)}"
    if outcome.differences:
        more = f" (+{len(outcome.differences) - 2} more)" if len(outcome.differences) > 2 else ""
        return "fail: " + "; ".join(_short(d) for d in outcome.differences[:2]) + more
    if outcome.tokens_unchecked:
        return f"tensors pass; tokens unchecked: {_short(outcome.tokens_unchecked)}"
    return "pass"


def _short(text: str, limit: int = 110) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def family_row(family: str, root: Path) -> dict[str, str]:
    """One table row: each layout (as sized, and with the family's options on) and each quantization, checked."""
    row: dict[str, str] = {}
    sources: dict[str, Path] = {}
    for options in (False, True):
        try:
            config = tiny_config(family, options=options)
        except FamilyError as exc:
            row.update(dict.fromkeys(LAYOUTS if not options else [], f"-: {_short(str(exc))}"))
            continue
        flags = option_flags(family) if options else []
        for layout in LAYOUTS:
            column = f"{layout}, {OPTIONS}" if options else layout
            if options and not flags:
                row[column] = "-: no options"
                continue
            try:
                sources[column] = write_checkpoint(family, root / f"{family}-{column}", layout, config=config)
            except FamilyError as exc:
                row[column] = f"-: {_short(str(exc))}"
                continue
            row[column] = _checked(sources[column], root / f"{family}-{column}-work")
        if options:
            row[OPTIONS] = ", ".join(k for k in flags if _on(config, k)) or "-"
    base = sources.get("release") or sources.get("mlx")
    for name in QUANTIZATIONS:
        if base is None:
            row[name] = "-: no checkpoint to convert"
            continue
        try:
            converted = quantized_checkpoint(base, root / f"{family}-{name}", **QUANTIZATIONS[name])
        except FamilyError as exc:
            row[name] = f"-: {_short(str(exc))}"
            continue
        row[name] = _checked(converted, root / f"{family}-{name}-work")
    if "release" in sources:
        release = release_weights(family)
        transformed = f"; sanitize changes {len(release.transformed)} tensors" if release.transformed else ""
        row["release experts as"] = re.sub(r"\.(layers|h)\.\d+\.", r".\1.N.", release.expert_form) + transformed
    return row


def _on(config: dict, flag: str) -> bool:
    """Whether option `flag` (`text_config.<name>` for a text model's) is on in `config`."""
    *parents, name = flag.split(".")
    for parent in parents:
        config = config.get(parent, {})
    return config.get(name) is True


def _checked(src: Path, work: Path) -> str:
    try:
        return _cell(check_import(src, work))
    except Exception as exc:  # a crash is a result of the table, not the end of it
        return f"fail: crashed: {_short(f'{type(exc).__name__}: {exc}')}"


def table(rows: dict[str, dict[str, str]]) -> str:
    lines = ["| family | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for family, row in rows.items():
        lines.append(f"| {family} | " + " | ".join(row.get(c, "") for c in COLUMNS) + " |")
    return "\n".join(lines)


def largest_experts(families: list[str]) -> str:
    """The family whose tiny model holds the most expert bytes per MoE layer."""

    def expert_bytes(family: str) -> int:
        try:
            weights, sites = random_weights(family), switch_sites(build(family))
        except FamilyError:
            return 0
        if not sites:
            return 0
        return max(sum(v.nbytes for k, v in weights.items() if k.startswith(site + ".")) for site in sites)

    return max(families, key=expert_bytes)


def scaled_config(family: str, layers: int, scale: int) -> dict:
    """The family's tiny config with `layers` layers and hidden/expert widths `scale` times wider.

    Per-layer lists (layer kinds) are cycled to the new length; `mlp_only_layers` keeps its dense first layer.
    """

    def scaled(config: dict) -> dict:
        out = {}
        for key, value in config.items():
            if key == "text_config" and isinstance(value, dict):
                out[key] = scaled(value)
            elif isinstance(value, list) and len(value) == LAYERS:
                out[key] = [value[i % LAYERS] for i in range(layers)]
            elif key in LAYER_FIELDS:
                out[key] = layers
            elif key in (*HIDDEN_FIELDS, *INTERMEDIATE_FIELDS, *EXPERT_FIELDS):
                out[key] = value * scale
            else:
                out[key] = value
        return out

    return scaled(tiny_config(family))


# VmHWM, not getrusage: Linux carries ru_maxrss across exec, so a child would report the parent's peak.
RSS_CHILD = """
import re, sys
from pathlib import Path
from nightshift.engine.io.drives import Drive
from nightshift.engine.store.importer import import_checkpoint
def peak_kb():
    return int(re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1))
before = peak_kb()
src, work = Path(sys.argv[1]), Path(sys.argv[2])
import_checkpoint(src, work / "store", [Drive("d0", work / "drive")])
print(before, peak_kb())
"""


def import_rss(family: str, layers: int, scale: int, root: Path) -> dict:
    """Peak RSS (MB) of importing `family` at `layers` layers, in a fresh process, and the checkpoint's size."""
    src = root / f"rss-{family}-{layers}"
    write_checkpoint(
        family, src, "release" if _has_release(family) else "mlx", config=scaled_config(family, layers, scale)
    )
    size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    work = root / f"rss-{family}-{layers}-work"
    result = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, str(src), str(work)], capture_output=True, text=True, check=True
    )
    before, peak = (int(v) for v in result.stdout.split()[-2:])
    shutil.rmtree(work)
    shutil.rmtree(src)
    return {
        "layers": layers,
        "checkpoint_mb": round(size / 1e6, 1),
        "base_rss_mb": before // 1024,
        "peak_rss_mb": peak // 1024,
    }


def _has_release(family: str) -> bool:
    try:
        release_weights(family)
        return True
    except FamilyError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scratch", type=Path, help="folder for the checkpoints and stores (created)")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    parser.add_argument("--catalogue", type=Path, help="run catalogue (default: the data dir's)")
    parser.add_argument("--families", help="comma-separated subset (default: every MoE family of mlx-lm)")
    parser.add_argument("--rss-layers", default="4,32", help="two layer counts for the RSS measure ('' skips it)")
    parser.add_argument("--rss-scale", type=int, default=4, help="width factor of the RSS model over the tiny one")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    args.scratch.mkdir(parents=True, exist_ok=True)
    families = args.families.split(",") if args.families else moe_families()

    rows = {}
    for family in families:
        rows[family] = family_row(family, args.scratch)
        print(f"{family}: {rows[family]}", flush=True)
    text = table(rows)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")

    from nightshift.app.paths import catalogue_file

    catalogue = Catalogue(args.catalogue or catalogue_file())
    command = shlex.join(["python", "-m", "bench.family_table", *argv])
    counts = {c: {k: sum(r.get(c, "").startswith(k) for r in rows.values()) for k in ("pass", "refused", "fail", "-")}
              for c in CHECKED}  # fmt: skip
    run = Run(
        kind="family-conformance", model=f"{len(families)} mlx-lm MoE families", verdict="table", command=command,
        config={"families": families}, figures={"cells": counts}, note=json.dumps(rows),
    )  # fmt: skip
    print(f"recorded run {catalogue.record(run)}")

    if args.rss_layers:
        family = largest_experts(families)
        points = [import_rss(family, int(n), args.rss_scale, args.scratch) for n in args.rss_layers.split(",")]
        for point in points:
            print(f"import RSS, {family}: {point}")
        run = Run(
            kind="import-rss", model=family, verdict="measured", command=command,
            config={"scale": args.rss_scale}, figures={"points": points},
        )  # fmt: skip
        print(f"recorded run {catalogue.record(run)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
