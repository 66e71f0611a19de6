"""A store served over several hosts, with the generation methods a review uses (what `serve --hosts` opens).

`ClusterModel` stands where one process's `Model` stands in a review: `chat_tokens`, `generate_tokens`
(one prompt) and `generate_batch` (a split narrative's chats as one batch) run the worker on every host
for that one generation, and give back the same chunks, statistics and batch as one process would.

Ranks are launched per generation, not kept up between runs: a run then starts on whatever hosts answer
now (a host that was down last night is simply used again), a failed run leaves nothing running anywhere,
and idle hosts hold no RAM and spin no ring sockets between nightly runs. The price is the start of the
ranks (imports, the trunk's load, the ring's connect) once per narrative: measured in docs/results.md
("Pipeline over hosts"), seconds against the minutes a narrative takes.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nightshift.engine.distributed.hosts import Host, PipelineError, load_hosts
from nightshift.engine.distributed.launch import (
    PipelineResult,
    Timeouts,
    free_port,
    pipeline_request,
    run_pipeline,
)
from nightshift.engine.distributed.worker import Request
from nightshift.engine.generation import (
    DEFAULT_CHUNK,
    BatchProgress,
    BatchStats,
    BatchText,
    ChatBatch,
    Chunk,
    Decoding,
    GenerationStats,
    Message,
    ReadFigures,
    chat_prompt,
    token_chunks,
)
from nightshift.engine.moe.settings import parse_budget
from nightshift.engine.store.manifest import is_store, read_manifest

DEFAULT_PORT = 32323  # the first ring port when some host is remote (rank r listens on PORT + r)


class ClusterModel:
    """Generation over `hosts` for the store at `store` (the same path on every host), per generation."""

    def __init__(
        self,
        store: Path,
        hosts: list[Host],
        memory_budget: int = 0,
        port: int | None = None,
        timeouts: Timeouts | None = None,
    ):
        # mlx-lm when a review opens the model, not when `serve --hosts` starts.
        from mlx_lm.tokenizer_utils import load as load_tokenizer

        self.path = Path(store).absolute()
        self.hosts = hosts
        self.memory_budget = memory_budget
        self.port = port
        self.timeouts = timeouts or Timeouts()
        self.tokenizer = load_tokenizer(self.path, eos_token_ids=read_manifest(self.path).config.get("eos_token_id"))
        self.last: PipelineResult | None = None  # the last finished generation's (each rank's figures, start time)
        self.reads: dict[int, dict[str, int]] = {}  # per rank: bytes read per drive in the running (or last) generation
        self.earlier: Counter[str] = Counter()  # bytes read per drive by the generations before that one

    def chat_tokens(self, messages: list[Message]) -> list[int]:
        """Token ids of `messages` formatted with the model's chat template, ready to answer."""
        return chat_prompt(self.tokenizer, messages)

    def generate(self, messages: list[Message], **options: Any) -> Iterator[Chunk]:
        """Stream the answer to `messages`, chat-formatted; `options` are `generate_tokens`'."""
        yield from self.generate_tokens(self.chat_tokens(messages), **options)

    def close(self) -> None:
        """Nothing is held between generations (the ranks live for one each)."""

    def drive_bytes(self) -> dict[str, int]:
        """Bytes read per drive over every host in the running generation (drive names are unique across hosts)."""
        return {name: n for per_rank in self.reads.values() for name, n in per_rank.items()}

    def figures(self) -> ReadFigures:
        """Bytes read per drive over every host since this model was opened (each host's cache and prefetch
        figures live with its ranks, one generation: they come with the generation's statistics)."""
        return ReadFigures(drive_bytes=dict(self.earlier + Counter(self.drive_bytes())))

    def _port(self) -> int:
        if self.port is not None:
            return self.port
        return free_port(len(self.hosts)) if all(h.local for h in self.hosts) else DEFAULT_PORT

    def _events(self, request: Request, cancel: threading.Event | None) -> Generator[tuple[int, dict], None, None]:
        """Every rank's events as they come, the ranks run by a thread; the ranks are stopped when this ends
        early (a cancel, a consumer that stops) and a fault is raised here as the launcher's PipelineError."""
        events: queue.Queue = queue.Queue()
        stop = threading.Event()
        outcome: dict = {}
        self.earlier.update(self.drive_bytes())
        self.reads = {}

        def body() -> None:
            try:
                outcome["result"] = run_pipeline(
                    self.hosts, request, self._port(), self.timeouts, lambda r, e: events.put((r, e)), stop
                )
            except BaseException as exc:  # handed to the consumer's thread, raised there
                outcome["error"] = exc
            finally:
                events.put(None)

        thread = threading.Thread(target=body, name="pipeline", daemon=True)
        thread.start()
        try:
            while (item := events.get()) is not None:
                rank, event = item
                if "drive_bytes" in event:
                    self.reads[rank] = event["drive_bytes"]
                yield item
                if cancel is not None and cancel.is_set():
                    stop.set()
        finally:
            stop.set()
            thread.join()
        if "error" in outcome:
            raise outcome["error"]
        self.last = outcome["result"]

    def generate_tokens(
        self,
        prompt: list[int],
        *,
        max_tokens: int = 256,
        temp: float = 0.0,
        seed: int = 0,
        cancel: threading.Event | None = None,
        prefill_chunk: int = DEFAULT_CHUNK,
        draft_depth: int | None = None,
        on_prefill: Callable[[GenerationStats], None] | None = None,
        decoding: Decoding | None = None,
    ) -> Iterator[Chunk]:
        """As `Model.generate_tokens`, over the hosts: rank 0's tokens, every host's reads in the statistics.

        `on_prefill` also sees each beat while the prompt is read, so the reads show before the first token."""
        if draft_depth:
            raise PipelineError("speculative decoding is not available over hosts; open the model without a drafter")
        request = pipeline_request(
            self.path, self.hosts, max_tokens, self.memory_budget,
            prompt=list(prompt), temp=temp, seed=seed, prefill_chunk=prefill_chunk,
            decodings=None if decoding is None else [asdict(decoding)],
        )  # fmt: skip
        stats = GenerationStats(prompt_tokens=len(prompt))
        start = time.perf_counter()
        events = self._events(request, cancel)

        def timed() -> Iterator[tuple[int, float]]:
            """Rank 0's tokens with its times; the prompt's progress (and each beat's reads) to `on_prefill`."""
            for _, event in events:
                stats.drive_bytes = self.drive_bytes()
                kind = event["event"]
                if kind in ("prefill", "beat") and stats.generated_tokens == 0:
                    stats.prompt_done = event["done"] if kind == "prefill" else stats.prompt_done
                    stats.elapsed = time.perf_counter() - start
                    if on_prefill is not None:
                        on_prefill(stats)
                if kind == "token":
                    yield event["token"], event["elapsed"]

        def reads(stats: GenerationStats) -> None:
            stats.drive_bytes = self.drive_bytes()

        try:
            yield from token_chunks(timed(), self.tokenizer, stats, max_tokens, cancel, reads)
            if stats.finish_reason != "cancelled":
                for _ in events:  # after the last token the ranks go on until every one has finished and said so
                    stats.drive_bytes = self.drive_bytes()
        finally:
            events.close()  # a cancel, or a consumer that stopped: the ranks are stopped

    def generate_batch(
        self,
        conversations: list[list[Message]],
        max_tokens: int,
        *,
        prefill_chunk: int = DEFAULT_CHUNK,
        cancel: threading.Event | None = None,
        progress: BatchProgress | None = None,
        decodings: list[Decoding] | None = None,
    ) -> ChatBatch:
        """As `Model.generate_batch`, over the hosts: the chats decoded together by the pipeline; rank 0
        sends the texts as they grow and the batch's result; every host's reads are in the statistics."""
        prompts = [self.chat_tokens(messages) for messages in conversations]
        request = pipeline_request(
            self.path, self.hosts, max_tokens, self.memory_budget,
            conversations=conversations, prefill_chunk=prefill_chunk,
            decodings=None if decodings is None else [asdict(d) for d in decodings],
        )  # fmt: skip
        stats = GenerationStats(prompt_tokens=sum(len(p) for p in prompts))
        texts = ["" for _ in prompts]
        if progress is not None:
            progress(stats, texts)
        batch = None
        for rank, event in self._events(request, cancel):
            kind = event["event"]
            if kind == "progress":
                stats, texts = GenerationStats.from_dict(event["stats"]), event["texts"]
            elif kind == "done" and rank == 0:
                found = event["batch"]
                batch = ChatBatch(
                    [BatchText(**part) for part in found["parts"]],
                    BatchStats(**found["stats"]),
                    GenerationStats.from_dict(found["generation"]),
                )
            stats.drive_bytes = self.drive_bytes()
            if progress is not None and kind in ("progress", "beat"):
                progress(stats, texts)
        if batch is None:  # cancelled: what was written so far
            stats.finish_reason = "cancelled"
            parts = [BatchText(text, len(p), 0, "cancelled", 0.0, 0.0) for text, p in zip(texts, prompts, strict=True)]
            return ChatBatch(parts, BatchStats(width=len(prompts)), stats)
        batch.generation.drive_bytes = self.drive_bytes()
        if progress is not None:
            progress(batch.generation, [part.text for part in batch.parts])
        return batch


@dataclass(frozen=True)
class Cluster:
    """The hosts `nightshift serve --hosts` generates over: every store a review names is opened over them."""

    hosts: list[Host]
    port: int | None = None

    @classmethod
    def load(cls, path: Path, port: int | None = None) -> Cluster:
        return cls(load_hosts(path), port)

    def open(self, path: Path, memory_budget: str = "auto") -> ClusterModel:
        """The review's model over the hosts; a model that is not a store cannot be split, and says so."""
        if not is_store(path):
            raise PipelineError(
                f"{path} is not a store: only a store's layers can be spread over hosts; import it with "
                "`nightshift model import` or serve without --hosts"
            )
        return ClusterModel(path, self.hosts, parse_budget(memory_budget), self.port)

    def describe(self) -> list[dict]:
        """Each host and its drives, for `ping`/`jobs` and the dashboard's hosts panel."""
        return [{"host": h.label, "drives": [d.name for d in h.drives]} for h in self.hosts]
