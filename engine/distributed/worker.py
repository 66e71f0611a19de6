"""One rank of a pipelined generation: `python -m nightshift.engine.distributed.worker --request JSON`.

Started on every host by the launcher (engine/distributed/launch.py) or by `mlx.launch`, with mlx's ring
environment (MLX_RANK, MLX_HOSTFILE). Each rank opens the store streamed with its share, reading its
experts from its own drives, and runs the same generation: in a pipeline its layers only (a
`PipelineStage`; the transport is mlx-lm's: send/recv between neighbours, an all_gather at the end of
each pass), in expert parallelism every layer and its share of the experts (an `ExpertShare`: one
all_sum per MoE layer).

It speaks JSON lines on stdout: `ready`, `beat` (every `beat_s`, from a thread: a rank that stops
beating has stopped; with the bytes read per drive so far once the model is open), `prefill` (rank 0: prompt
rows read), `token` (rank 0, one prompt) or `progress` (rank 0, a batch of chats: every text so far, at most
every `beat_s`), `done` with its figures (a batch's whole result on rank 0), or `error` with the message.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nightshift.engine.errors import NightshiftError
from nightshift.engine.generation import DEFAULT_CHUNK, Decoding


@dataclass
class Request:
    """What every rank runs: the store, the layers per rank, each rank's drives, the prompt."""

    store: str
    split: list[int]
    drives: list[dict[str, str]]  # per rank: drive name -> root on that host
    prompt: list[int]
    max_tokens: int
    memory_budget: int = 0
    prefill_chunk: int = DEFAULT_CHUNK  # mlx-lm's prefill step, as one process reads a prompt
    beat_s: float = 0.5
    ceilings: list[str | None] = field(default_factory=list)  # per rank: drive_ceilings.json on that host, or None
    temp: float = 0.0  # every rank samples with the same seed from the same (all-gathered) logits
    seed: int = 0
    conversations: list[list[dict[str, str]]] | None = None  # set: answer these chats as one batch, not `prompt`
    shape: str = "pipeline"  # or "experts": every rank every layer, a share of each layer's experts (experts.py)
    # generation.Decoding's fields, one per chat (one for `prompt`): every rank builds the same processors
    decodings: list[dict] | None = None

    def decoding(self) -> list[Decoding] | None:
        return None if self.decodings is None else [Decoding(**d) for d in self.decodings]

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))


class Lines:
    """JSON lines on stdout, one writer at a time (the beat thread and the generation share it)."""

    def __init__(self, rank: int):
        self.rank = rank
        self._lock = threading.Lock()

    def say(self, event: str, **fields) -> None:
        with self._lock:
            sys.stdout.write(json.dumps({"rank": self.rank, "event": event, **fields}) + "\n")
            sys.stdout.flush()


class Reads:
    """The bytes this rank's stream has read per drive, for the beats (none until the model is open)."""

    def __init__(self) -> None:
        self.counters = None

    def now(self) -> dict[str, int]:
        counters = self.counters
        if counters is None:
            return {}
        return {name: s.bytes for name, s in zip(counters.names, counters.snapshot(), strict=True)}


def beat(lines: Lines, every: float, stop: threading.Event, reads: Reads) -> None:
    """Say `beat` every `every` seconds until `stop`: proof of life while a pass computes or waits, with the
    drives' bytes so far (the dashboard's per-host read rates come from their differences)."""
    while not stop.wait(every):
        lines.say("beat", drive_bytes=reads.now())


def run(request: Request, lines: Lines, reads: Reads) -> None:
    """Open this rank's stage of the store and generate; rank 0 reports the tokens (or the batch's texts)."""
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    from nightshift.engine.io.ceilings import Ceilings
    from nightshift.engine.io.drives import Drive
    from nightshift.engine.moe.settings import StreamSettings
    from nightshift.engine.runtime import open_model

    from .experts import ExpertShare, share_settings
    from .stage import PipelineStage

    group = mx.distributed.init(backend="ring", strict=True)
    if group.size() != len(request.drives):
        raise NightshiftError(f"{group.size()} ranks started for a request over {len(request.drives)} hosts")
    rank = group.rank()
    experts = request.shape == "experts"
    stage = ExpertShare(group) if experts else PipelineStage(group, tuple(request.split))
    drives = [Drive(name, Path(root)) for name, root in request.drives[rank].items()]
    ceilings_file = request.ceilings[rank] if request.ceilings else None
    ceilings = Ceilings.load(Path(ceilings_file)) if ceilings_file and Path(ceilings_file).is_file() else None
    settings = StreamSettings(cache_bytes=request.memory_budget)
    if experts:
        settings = share_settings(settings)
    model = open_model(Path(request.store), stream=settings, drives=drives, ceilings=ceilings, stage=stage)
    if experts:
        stage.share(model.model)
    reads.counters = model.stream.counters
    try:
        # Every rank loaded before the first pass (mlx-lm's sharded_load does the same): a slow load is not a stall.
        mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu))
        lines.say("ready", shape=request.shape, drives=sorted(model.stream.manifest.drives))
        if request.conversations is not None:
            batch, stats = answer_batch(model, request, lines, rank)
        else:
            batch, stats = None, answer_prompt(model, request, lines, rank)
        # mlx-lm's decode loop builds (and starts) the step after the last token before yielding it; in a
        # pipeline that step's send and all_gather are still in flight. Finish them on every rank, then leave
        # together: a rank that exits first cuts a neighbour off mid-transfer ("connection to a peer was lost").
        mx.synchronize(generation_stream)
        mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu))
        figures = model.stream.trace.summary()
        busy_s, entry_s, steps = own_time(model.stream.trace.passes())
        lines.say(
            "done",
            busy_s=busy_s,
            entry_s=entry_s,
            decode_steps=steps,
            time_to_first_token=stats.time_to_first_token,
            elapsed=stats.elapsed,
            generated=stats.generated_tokens,
            drive_bytes=stats.drive_bytes,
            one_row_wait_s=figures.get("one_row_wait_s", 0.0),
            one_row_readback_s=figures.get("one_row_readback_s", 0.0),
            one_row_expert_s=figures.get("one_row_expert_s", 0.0),
            **({"batch": asdict(batch)} if batch is not None and rank == 0 else {}),
        )
    finally:
        model.close()


def answer_prompt(model, request: Request, lines: Lines, rank: int):
    """Generate for the request's prompt; rank 0 says how much of the prompt is read, then each token."""

    def prefilled(stats) -> None:
        lines.say("prefill", done=stats.prompt_done, total=stats.prompt_tokens)

    stats = None
    for chunk in model.generate_tokens(
        request.prompt,
        max_tokens=request.max_tokens,
        temp=request.temp,
        seed=request.seed,
        prefill_chunk=request.prefill_chunk,
        on_prefill=prefilled if rank == 0 else None,
        decoding=(request.decoding() or [None])[0],
    ):
        stats = chunk.stats
        if rank == 0:
            lines.say("token", token=chunk.token, elapsed=stats.elapsed)
    return stats


def answer_batch(model, request: Request, lines: Lines, rank: int):
    """Answer the request's chats as one batch (engine/batch.py, as one process does); rank 0 says every text
    so far at most every `beat_s`, and the batch's result with `done`."""
    said = [0.0]

    def progress(stats, texts: list[str]) -> None:
        now = time.monotonic()
        if now - said[0] >= request.beat_s or stats.finish_reason is not None:
            said[0] = now
            lines.say("progress", stats=asdict(stats), texts=texts)

    batch = model.generate_batch(
        request.conversations,
        request.max_tokens,
        prefill_chunk=request.prefill_chunk,
        progress=progress if rank == 0 else None,
        decodings=request.decoding(),
    )
    return batch, batch.generation


def own_time(passes: list) -> tuple[float, float, int]:
    """Seconds this rank spent on its own layers in decode steps, the seconds of each step's first pass
    until its router was read (the wait for the other ranks is there, with that layer's attention), and
    the steps counted.

    A step's first readback evaluates whatever the pass waits on (the previous rank's activations, or the
    last step's all_gather), so a step's own time runs from that readback's end to the end of its last pass.
    """
    busy = entry = 0.0
    steps = 0
    step: list = []
    for p in [p for p in passes if p.rows == 1] + [None]:
        if step and (p is None or p.layer <= step[-1].layer):  # layers start again: a new step
            first, last = step[0], step[-1]
            busy += last.began + last.readback_s + last.predict_s + last.wait_s - (first.began + first.readback_s)
            entry += first.readback_s
            steps += 1
            step = []
        if p is not None:
            step.append(p)
    return busy, entry, steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--request", required=True, help="the Request as JSON")
    args = parser.parse_args(argv)
    request = Request(**json.loads(args.request))
    import os

    lines = Lines(int(os.environ.get("MLX_RANK", "0")))
    stop = threading.Event()
    reads = Reads()
    threading.Thread(target=beat, args=(lines, request.beat_s, stop, reads), daemon=True).start()
    started = time.perf_counter()
    try:
        run(request, lines, reads)
    except Exception as exc:  # every failure is reported as a line the launcher reads, then the rank exits
        lines.say("error", message=f"{type(exc).__name__}: {exc}", after_s=time.perf_counter() - started)
        return 1
    finally:
        stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
