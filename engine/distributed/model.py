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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nightshift.engine.distributed.hosts import Host, PipelineError, load_hosts
from nightshift.engine.distributed.launch import (
    PipelineResult,
    Timeouts,
    free_port,
    pipeline_request,
    run_pipeline,
)
from nightshift.engine.distributed.worker import Request
from nightshift.engine.prefill import DEFAULT_CHUNK
from nightshift.engine.runtime import Chunk, GenerationStats, Message

DEFAULT_PORT = 32323  # the first ring port when some host is remote (rank r listens on PORT + r)


class ClusterModel:
    """Generation over `hosts` for the store at `store` (the same path on every host), per generation."""

    stream = None  # no stream in this process: each host's reads come with its lines
    drafter = None

    def __init__(
        self,
        store: Path,
        hosts: list[Host],
        memory_budget: int = 0,
        port: int | None = None,
        timeouts: Timeouts | None = None,
    ):
        from mlx_lm.tokenizer_utils import load as load_tokenizer

        from nightshift.engine.store.manifest import read_manifest

        self.path = Path(store).absolute()
        self.hosts = hosts
        self.memory_budget = memory_budget
        self.port = port
        self.timeouts = timeouts or Timeouts()
        self.tokenizer = load_tokenizer(self.path, eos_token_ids=read_manifest(self.path).config.get("eos_token_id"))
        self.last: PipelineResult | None = None  # the last finished generation's (each rank's figures, start time)
        self.reads: dict[int, dict[str, int]] = {}  # per rank: bytes read per drive in the running generation

    def chat_tokens(self, messages: list[Message]) -> list[int]:
        """Token ids of `messages` formatted with the model's chat template, ready to answer."""
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    def close(self) -> None:
        """Nothing is held between generations (the ranks live for one each)."""

    def drive_bytes(self) -> dict[str, int]:
        """Bytes read per drive over every host in the running generation (drive names are unique across hosts)."""
        return {name: n for per_rank in self.reads.values() for name, n in per_rank.items()}

    def _port(self) -> int:
        if self.port is not None:
            return self.port
        return free_port(len(self.hosts)) if all(h.local for h in self.hosts) else DEFAULT_PORT

    def _events(self, request: Request, cancel: threading.Event | None) -> Iterator[tuple[int, dict]]:
        """Every rank's events as they come, the ranks run by a thread; the ranks are stopped when this ends
        early (a cancel, a consumer that stops) and a fault is raised here as the launcher's PipelineError."""
        events: queue.Queue = queue.Queue()
        stop = threading.Event()
        outcome: dict = {}
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
        max_tokens: int = 256,
        temp: float = 0.0,
        seed: int = 0,
        cancel: threading.Event | None = None,
        prefill_chunk: int = DEFAULT_CHUNK,
        draft_depth: int | None = None,
        on_prefill=None,
    ) -> Iterator[Chunk]:
        """As `Model.generate_tokens`, over the hosts: rank 0's tokens, every host's reads in the statistics.

        `on_prefill` also sees each beat while the prompt is read, so the reads show before the first token."""
        if max_tokens < 1:
            raise PipelineError(f"max_tokens {max_tokens}: ask for at least 1 token")
        if draft_depth:
            raise PipelineError("speculative decoding is not available over hosts; open the model without a drafter")
        request = pipeline_request(
            self.path, self.hosts, max_tokens, self.memory_budget,
            prompt=list(prompt), temp=temp, seed=seed, prefill_chunk=prefill_chunk,
        )  # fmt: skip
        stats = GenerationStats(prompt_tokens=len(prompt))
        detokenizer = self.tokenizer.detokenizer
        start = time.perf_counter()
        for _, event in self._events(request, cancel):
            stats.drive_bytes = self.drive_bytes()
            kind = event["event"]
            if kind in ("prefill", "beat") and stats.generated_tokens == 0:
                stats.prompt_done = event["done"] if kind == "prefill" else stats.prompt_done
                stats.elapsed = time.perf_counter() - start
                if on_prefill is not None:
                    on_prefill(stats)
            if kind != "token":
                continue
            token = event["token"]
            if stats.generated_tokens == 0:
                stats.time_to_first_token, stats.prompt_done = event["elapsed"], len(prompt)
            stats.generated_tokens += 1
            stats.elapsed = event["elapsed"]
            done = token in self.tokenizer.eos_token_ids
            if not done:
                detokenizer.add_token(token)
            if done or stats.generated_tokens == max_tokens:
                detokenizer.finalize()
                stats.finish_reason = "stop" if done else "length"
            yield Chunk(token=token, text=detokenizer.last_segment, stats=stats)
            if stats.finish_reason is None and cancel is not None and cancel.is_set():
                stats.finish_reason = "cancelled"
                return  # the ranks are stopped as the events end
            # After the last token the events go on until every rank has finished and said so.

    def generate_batch(
        self,
        conversations: list[list[Message]],
        max_tokens: int,
        prefill_chunk: int = DEFAULT_CHUNK,
        cancel: threading.Event | None = None,
        progress=None,
    ):
        """As `engine.batch.generate_batch`, over the hosts: the chats decoded together by the pipeline; rank 0
        sends the texts as they grow and the batch's result; every host's reads are in the statistics."""
        from nightshift.engine.batch import BatchStats, BatchText, ChatBatch

        prompts = [self.chat_tokens(messages) for messages in conversations]
        request = pipeline_request(
            self.path, self.hosts, max_tokens, self.memory_budget,
            conversations=conversations, prefill_chunk=prefill_chunk,
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
        from nightshift.engine.moe.settings import parse_budget
        from nightshift.engine.store.manifest import is_store

        if not is_store(path):
            raise PipelineError(
                f"{path} is not a store: only a store's layers can be spread over hosts; import it with "
                "`nightshift model import` or serve without --hosts"
            )
        return ClusterModel(path, self.hosts, parse_budget(memory_budget), self.port)

    def describe(self) -> list[dict]:
        """Each host and its drives, for `ping`/`jobs` and the dashboard's hosts panel."""
        return [{"host": h.label, "drives": [d.name for d in h.drives]} for h in self.hosts]
