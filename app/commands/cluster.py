"""`nightshift cluster generate --hosts hosts.json "PROMPT"`: one model's layers pipelined over several hosts."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from nightshift.app.commands import say
from nightshift.app.commands.generate import _positive_int, memory_budget
from nightshift.app.models import resolve_model
from nightshift.app.paths import doc
from nightshift.engine.errors import NightshiftError


def cmd_generate(args: argparse.Namespace) -> int:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from nightshift.engine.distributed.hosts import load_hosts
    from nightshift.engine.distributed.launch import Timeouts, generate_over_hosts
    from nightshift.engine.moe.settings import parse_budget
    from nightshift.engine.store.manifest import is_store, read_manifest, write_json_atomic

    if not args.prompt.strip():
        raise NightshiftError('the prompt is empty; pass the text to answer, e.g. nightshift cluster generate "Hello"')
    store = resolve_model(args.model)
    if not is_store(store):
        raise NightshiftError(f"{store} is not a store; only a store's layers can be spread over hosts")
    hosts = load_hosts(Path(args.hosts))
    tokenizer = load_tokenizer(store, eos_token_ids=read_manifest(store).config.get("eos_token_id"))
    prompt = list(tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True))
    detokenizer = tokenizer.detokenizer
    say(f"{len(hosts)} hosts: " + ", ".join(f"{h.ssh} ({', '.join(d.name for d in h.drives)})" for h in hosts))

    def show(token: int) -> None:
        if token not in tokenizer.eos_token_ids:
            detokenizer.add_token(token)
            sys.stdout.write(detokenizer.last_segment)
            sys.stdout.flush()

    timeouts = Timeouts(start_s=args.start_timeout, stall_s=args.stall_timeout)
    result = generate_over_hosts(
        store, hosts, prompt, args.max_tokens, parse_budget(args.memory_budget), args.port, timeouts, show
    )
    detokenizer.finalize()
    sys.stdout.write(detokenizer.last_segment + "\n")
    decode = result.elapsed[-1] - result.elapsed[0] if len(result.elapsed) > 1 else 0.0
    say(
        f"{len(result.tokens)} tokens; time to first token {result.elapsed[0]:.2f} s; "
        + (f"{(len(result.tokens) - 1) / decode:.2f} tok/s after it; " if decode > 0 else "")
        + "; ".join(
            f"rank {i} read " + ", ".join(f"{d} {b / 1e6:.1f} MB" for d, b in r["drive_bytes"].items())
            for i, r in enumerate(result.ranks)
        )
    )
    if args.out:
        record = {"prompt": prompt, "tokens": result.tokens, "elapsed": result.elapsed, "ranks": result.ranks}
        write_json_atomic(Path(args.out), {**record, "finished_at": time.time()})  # only a finished run, whole
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run a store over several hosts with mlx.distributed (ring backend over TCP): each host runs a "
        f"contiguous range of layers and streams those layers' experts from its own drives. See {doc('distributed.md')}."
    )
    actions = parser.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    generate = actions.add_parser("generate", help="answer PROMPT greedily with the model pipelined over the hosts")
    generate.add_argument("prompt", metavar="PROMPT", help="what to ask")
    generate.add_argument("--hosts", required=True, metavar="JSON", help="hosts.json: mlx's hostfile with drives")
    generate.add_argument("--model", help="store name or directory (the same path on every host)")
    generate.add_argument("--max-tokens", type=_positive_int, default=256, help="most tokens to generate (256)")
    generate.add_argument(
        "--memory-budget", type=memory_budget, default="auto", metavar="auto|SIZE|0", help="RAM per host for experts"
    )
    generate.add_argument("--port", type=int, default=32323, help="first ring port; rank r listens on PORT+r")
    generate.add_argument(
        "--start-timeout", type=float, default=180.0, help="seconds a host may take to start and load (180)"
    )
    generate.add_argument(
        "--stall-timeout", type=float, default=30.0, help="seconds of silence after which a host counts as stopped"
    )
    generate.add_argument("--out", metavar="JSON", help="write the tokens and each host's figures here when done")
    generate.set_defaults(run=cmd_generate)
