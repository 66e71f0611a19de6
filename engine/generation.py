"""What generating text means, whichever model does it: the contract, its typed results, and the token loop.

`LanguageModel` is what the app asks of a model: `runtime.Model` (one process) and `distributed.model.
ClusterModel` (a store over several hosts) both are one, checked by the type checker (.ci/typecheck), so a
review, the service and the batch code call either the same way. Both stream `Chunk`s through `token_chunks`,
the one loop that turns token ids into text, statistics and a finish reason.

Nothing here imports MLX: the app imports these types at start-up for free.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nightshift.engine.errors import NightshiftError

Message = dict[str, str]  # {"role": ..., "content": ...}, as a chat template takes it
# mlx-lm's logits processor: (tokens generated so far, logits of shape (1, vocab)) -> logits, MLX arrays.
LogitsProcessor = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Decoding:
    """What shapes each token's logits besides the sampler, said as data so that it travels to other hosts:
    every rank builds the same logits processors from it (engine/decoding.py) where the tokens are chosen."""

    no_numerals: bool = False  # block every token whose text holds a digit or another numeral...
    numerals_after: str = ""  # ...except where the text so far ends matching this pattern (a tag such as "F3")
    repetition_penalty: float = 1.0  # mlx-lm's, over the last tokens (1: none)


# Rows per forward pass while prefilling (a chunk reads each selected expert once): mlx-lm's generate_step default
# (`prefill_step_size`), so that a default generation reads the prompt in mlx-lm's steps (engine/prefill.py).
DEFAULT_CHUNK = 2048


@dataclass
class DraftStats:
    """What drafting did in one generation; reported live with the generation's statistics."""

    depth: int = 0
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # of those, the ones the target agreed with
    rounds: int = 0  # draft+verify rounds (= verify passes of the target)
    plain_steps: int = 0  # single-token target steps (calibration, depth 0, after switch-off)
    replays: int = 0  # target passes re-run to rewind a recurrent cache after a rejection
    verify_layer_calls: int = 0  # streaming layer calls during verify passes
    verify_unique_experts: int = 0  # unique experts those calls read, summed
    plain_layer_calls: int = 0
    plain_unique_experts: int = 0
    plain_step_s: float = 0.0  # measured time of one plain step (calibration)
    round_s: float = 0.0  # mean time of one draft+verify round (recent window)
    break_even_acceptance: float | None = None  # acceptance at which a round yields tokens as fast as plain steps
    switched_off: int = 0  # switch-off events (at most one per generation)
    switched_off_after: int | None = None  # tokens generated when drafting switched off
    switch_off_reason: str | None = None

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def union_per_verify(self) -> float:
        """Mean unique experts one MoE layer read per verify pass (its k+1 rows together)."""
        return self.verify_unique_experts / self.verify_layer_calls if self.verify_layer_calls else 0.0

    @property
    def experts_per_plain_step(self) -> float:
        """Mean unique experts one MoE layer read per plain step (one row: the router's top-k)."""
        return self.plain_unique_experts / self.plain_layer_calls if self.plain_layer_calls else 0.0

    def describe(self) -> str:
        """One line for people: what drafting did and whether it switched itself off."""
        line = (
            f"draft depth {self.depth}: {self.accepted}/{self.drafted} drafts accepted ({self.acceptance_rate:.0%}) "
            f"in {self.rounds} verify passes, {self.union_per_verify:.1f} experts per layer per verify "
            f"({self.experts_per_plain_step:.1f} per plain step)"
        )
        if self.break_even_acceptance is not None:
            line += f"; break-even acceptance {self.break_even_acceptance:.0%}"
        if self.switched_off:
            line += f"; switched off after {self.switched_off_after} tokens ({self.switch_off_reason})"
        return line

    def as_dict(self) -> dict:
        return {
            **asdict(self),
            "acceptance_rate": self.acceptance_rate,
            "union_per_verify": self.union_per_verify,
            "experts_per_plain_step": self.experts_per_plain_step,
        }


@dataclass
class AnswerFigures:
    """One answer of a batch (engine/batch.py) so far: its prompt read, its tokens against its own limit, and how
    it ended. A batch's progress is told from these (its real plan), not from its summed figures alone."""

    prompt_tokens: int
    max_tokens: int
    prompt_done: int = 0
    tokens: int = 0  # written so far, an end token included
    finish_reason: str | None = None  # stop (an end token) or length (its max_tokens), once it ended


@dataclass(frozen=True)
class ReadFigures:
    """What a model has read since it was opened: bytes per drive, and for a stream in this process its expert
    cache (lookups served from RAM, its budget and what it holds now) and prefetch recall."""

    drive_bytes: dict[str, int] = field(default_factory=dict)
    cache_hits: int = 0
    cache_misses: int = 0
    cache_budget: int = 0
    cache_used: int = 0
    recall_hits: int = 0
    recall_needed: int = 0
    last_landed: str = ""  # the drive whose read landed last (the barrier) most often in recent passes


@dataclass
class GenerationStats:
    """Live figures of one generation; times in seconds."""

    prompt_tokens: int = 0
    prompt_done: int = 0  # prompt rows prefilled so far (the prompt is read a chunk at a time)
    generated_tokens: int = 0
    time_to_first_token: float = 0.0
    elapsed: float = 0.0
    peak_memory_bytes: int = 0
    finish_reason: str | None = None
    # Streamed stores only, this generation's own (the stream outlives it): bytes read per drive,
    # experts served by the RAM cache, prefetch recall so far.
    drive_bytes: dict[str, int] = field(default_factory=dict)
    cache_hits: int = 0
    cache_misses: int = 0
    # The expert cache's budget now and the bytes it holds (streamed stores with a cache; not deltas).
    cache_budget: int = 0
    cache_used: int = 0
    prefetch_recall: float = 0.0
    # Expert bytes the prompt needed (each (layer, expert) once) and bytes read while prefilling it.
    prefill_unique_bytes: int = 0
    prefill_bytes_read: int = 0
    last_landed: str = ""  # the drive whose read landed last (the barrier) most often in recent passes
    # With a drafter: drafted/accepted tokens, verify passes, union size per verify, switch-off (engine/speculative.py).
    draft: DraftStats | None = None
    # A batch of answers (engine/batch.py): each one's own figures, in the batch's order; empty for one answer.
    answers: list[AnswerFigures] = field(default_factory=list)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GenerationStats:
        """Back from `asdict` (a host's progress line): the answers as `AnswerFigures` again."""
        answers = [AnswerFigures(**answer) for answer in values.get("answers", [])]
        return cls(**{**values, "answers": answers})

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first, over the time after the first (prefill excluded)."""
        decode_time = self.elapsed - self.time_to_first_token
        return (self.generated_tokens - 1) / decode_time if self.generated_tokens > 1 and decode_time > 0 else 0.0

    @property
    def prefill_read_amplification(self) -> float:
        """Bytes read during prefill / unique expert bytes the prompt needed (1.0: each expert read once)."""
        return self.prefill_bytes_read / self.prefill_unique_bytes if self.prefill_unique_bytes else 0.0

    @property
    def cache_hit_rate(self) -> float:
        """This generation's expert lookups served from RAM."""
        lookups = self.cache_hits + self.cache_misses
        return self.cache_hits / lookups if lookups else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.time_to_first_token if self.time_to_first_token > 0 else 0.0

    def count_reads(self, now: ReadFigures, before: ReadFigures) -> None:
        """This generation's own reads: the model's figures `now` less those `before` it began (a loaded model
        serves many generations); the cache's budget and holding, and the barrier drive, as they are now."""
        self.drive_bytes = {name: n - before.drive_bytes.get(name, 0) for name, n in now.drive_bytes.items()}
        self.cache_hits = now.cache_hits - before.cache_hits
        self.cache_misses = now.cache_misses - before.cache_misses
        self.cache_budget, self.cache_used = now.cache_budget, now.cache_used
        needed = now.recall_needed - before.recall_needed
        self.prefetch_recall = (now.recall_hits - before.recall_hits) / needed if needed else 0.0
        self.last_landed = now.last_landed


@dataclass
class Chunk:
    """One generated token: its id, the text it completes, and the statistics so far."""

    token: int
    text: str
    stats: GenerationStats = field(default_factory=GenerationStats)


@dataclass
class BatchStats:
    """What one batch did: its width, tokens per sequence, times, and the streamed reads per decode step."""

    width: int
    tokens: list[int] = field(default_factory=list)  # generated per sequence
    prefill_seconds: float = 0.0
    shared_prefix: int = 0  # prompt tokens every sequence starts with, read once for all
    decode_seconds: float = 0.0
    steps: int = 0  # decode passes (each with one row per live sequence)
    rows: int = 0  # rows those passes carried, summed
    layer_calls: int = 0  # streaming layer calls during decode
    experts_read: int = 0  # unique experts those calls selected, summed (each read once per call)

    @property
    def decode_tokens_per_s(self) -> float:
        """All sequences' tokens after their first, over the decode time."""
        after_first = sum(max(t - 1, 0) for t in self.tokens)
        return after_first / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def experts_per_layer_call(self) -> float:
        """Mean union of experts one layer read per decode step: top-k for one row, less than B x top-k shared."""
        return self.experts_read / self.layer_calls if self.layer_calls else 0.0


@dataclass
class BatchText:
    """One sequence of a chat batch: its text, why it ended, and its own share of the batch's time."""

    text: str
    prompt_tokens: int
    tokens: int  # generated, an end token included (as a single generation counts it)
    finish_reason: str  # stop (an end token), length (max_tokens) or cancelled
    prefill_seconds: float  # reading its own prompt
    decode_seconds: float  # from the batch's first decode step to its own last token

    @property
    def decode_tokens_per_s(self) -> float:
        """Its tokens after the first over the decode time it was in the batch: its rate while sharing it."""
        return (self.tokens - 1) / self.decode_seconds if self.tokens > 1 and self.decode_seconds > 0 else 0.0


@dataclass
class ChatBatch:
    """A chat batch's texts, the batch's own figures, and the whole as one generation's statistics."""

    parts: list[BatchText]
    stats: BatchStats
    generation: GenerationStats  # summed over the parts; the first token: when every prompt had been read


# A batch's summed statistics and every text so far (engine/batch.py says when it is called).
BatchProgress = Callable[[GenerationStats, list[str]], None]


class LanguageModel(Protocol):
    """What the app asks of a model, wherever it runs: `runtime.Model` in this process, `distributed.model.
    ClusterModel` over several hosts. `path` is the model directory (the same path on every host)."""

    path: Path

    def chat_tokens(self, messages: list[Message]) -> list[int]:
        """Token ids of `messages` formatted with the model's chat template, ready to answer."""
        ...

    def generate(self, messages: list[Message], **options: Any) -> Iterator[Chunk]:
        """Stream the answer to `messages`, chat-formatted; `options` are `generate_tokens`'."""
        ...

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
        """Stream a continuation of the token ids `prompt`; `on_prefill` sees the statistics while it is read."""
        ...

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
        """Greedy answers to several chats, decoded together (engine/batch.py); `decodings`: one per chat."""
        ...

    def figures(self) -> ReadFigures:
        """What the model has read since it was opened."""
        ...

    def close(self) -> None:
        """Let go of what the model holds between generations (reader threads)."""
        ...


def chat_prompt(tokenizer: Any, messages: list[Message]) -> list[int]:
    """Token ids of `messages` formatted with `tokenizer`'s chat template (mlx-lm's), ready to answer."""
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def token_chunks(
    tokens: Iterable[tuple[int, float]],
    tokenizer: Any,
    stats: GenerationStats,
    max_tokens: int,
    cancel: threading.Event | None,
    refresh: Callable[[GenerationStats], None],
) -> Iterator[Chunk]:
    """The chunks of a generation from its `tokens` (each id with the seconds since the generation began).

    `refresh` brings the statistics up to date after each token (the reads so far). The stream ends with an
    end token (yielded, its text empty), the `max_tokens`-th token, or the first token after `cancel` is set,
    as mlx-lm's `stream_generate` ends; `stats.finish_reason` says which.
    """
    if max_tokens < 1:
        raise NightshiftError(f"max_tokens {max_tokens}: ask for at least 1 token")
    detokenizer = tokenizer.detokenizer
    for token, elapsed in tokens:
        if stats.generated_tokens == 0:
            stats.time_to_first_token, stats.prompt_done = elapsed, stats.prompt_tokens
        stats.generated_tokens += 1
        stats.elapsed = elapsed
        refresh(stats)
        done = token in tokenizer.eos_token_ids
        if not done:
            detokenizer.add_token(token)
        if done or stats.generated_tokens == max_tokens:
            detokenizer.finalize()
            stats.finish_reason = "stop" if done else "length"
        yield Chunk(token=token, text=detokenizer.last_segment, stats=stats)
        if stats.finish_reason is not None:
            return
        if cancel is not None and cancel.is_set():
            stats.finish_reason = "cancelled"
            return
