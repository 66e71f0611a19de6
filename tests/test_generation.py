"""The contract every model generates by (engine/generation.py): how a stream of tokens ends, and a model's
figures as the sum of its generations' reads. That `Model` and `ClusterModel` both are a `LanguageModel` is
checked by the type checker (.ci/typecheck), not here."""

from __future__ import annotations

import threading

import pytest

from nightshift.engine.errors import NightshiftError
from nightshift.engine.generation import GenerationStats, ReadFigures, token_chunks
from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import Model, open_model


@pytest.fixture(scope="module")
def tiny_in_ram(tiny_model) -> Model:
    return open_model(tiny_model)


def chunks_of(model: Model, tokens: list[int], max_tokens: int, cancel: threading.Event | None = None):
    stats = GenerationStats(prompt_tokens=3)
    timed = ((token, 0.1 * (i + 1)) for i, token in enumerate(tokens))
    return list(token_chunks(timed, model.tokenizer, stats, max_tokens, cancel, lambda s: None)), stats


def test_a_stream_ends_at_its_token_limit_at_an_end_token_or_at_a_cancel(tiny_in_ram):
    plain = [t for t in range(100, 200) if t not in tiny_in_ram.tokenizer.eos_token_ids][:6]
    chunks, stats = chunks_of(tiny_in_ram, plain, max_tokens=4)
    assert [c.token for c in chunks] == plain[:4] and stats.finish_reason == "length"
    assert stats.generated_tokens == 4 and stats.time_to_first_token == 0.1 and stats.prompt_done == 3
    end = next(iter(tiny_in_ram.tokenizer.eos_token_ids))
    chunks, stats = chunks_of(tiny_in_ram, [*plain[:2], end, *plain[2:]], max_tokens=10)
    assert [c.token for c in chunks] == [*plain[:2], end] and stats.finish_reason == "stop"
    assert "".join(c.text for c in chunks) == tiny_in_ram.tokenizer.decode(plain[:2])  # the end token adds no text
    cancel = threading.Event()
    cancel.set()
    chunks, stats = chunks_of(tiny_in_ram, plain, max_tokens=10, cancel=cancel)
    assert len(chunks) == 1 and stats.finish_reason == "cancelled"  # looked at after each token


def test_a_stream_asked_for_no_token_is_refused(tiny_in_ram):
    with pytest.raises(NightshiftError, match="at least 1 token"):
        chunks_of(tiny_in_ram, [100], max_tokens=0)


def test_a_model_held_in_ram_has_read_nothing(tiny_in_ram):
    list(tiny_in_ram.generate_tokens([1, 2, 3], max_tokens=2))
    assert tiny_in_ram.figures() == ReadFigures()


def test_a_streamed_model_s_figures_are_the_sum_of_its_generations_reads(stores):
    streamed = open_model(stores["qwen3_moe"], stream=StreamSettings(cache_bytes=0))
    try:
        opened = streamed.figures()
        first = list(streamed.generate_tokens([1, 2, 3, 4], max_tokens=3))[-1].stats
        second = list(streamed.generate_tokens([5, 6, 7], max_tokens=3))[-1].stats
        now = streamed.figures(settled=True)
    finally:
        streamed.close()
    assert sum(first.drive_bytes.values()) > 0 and set(first.drive_bytes) == {"d0", "d1"}
    for drive, read in now.drive_bytes.items():
        assert read - opened.drive_bytes.get(drive, 0) == first.drive_bytes[drive] + second.drive_bytes[drive]


def test_a_forced_generation_yields_the_given_ids_and_routes_as_for_them(stores):
    """A bench compares engines on the same tokens: each step is fed the given id whatever the logits said. Forced
    to its own greedy ids a model routes every layer call as its free run did; forced to others, it does not."""
    routing: list = []
    streamed = open_model(
        stores["qwen3_moe"], stream=StreamSettings(cache_bytes=0), instruments=Instruments(routing=routing)
    )
    runs = []
    try:
        free = [c.token for c in streamed.generate_tokens([1, 2, 3], max_tokens=4)]
        given = [t for t in range(200, 240) if t not in free and t not in streamed.tokenizer.eos_token_ids][:4]
        for ids in (None, free, given):
            routing.clear()
            chunks = list(streamed.generate_tokens([1, 2, 3], max_tokens=4, forced=ids))
            streamed.figures(settled=True)
            runs.append(([c.token for c in chunks], list(routing)))
        with pytest.raises(NightshiftError, match="3 ids for 4 tokens"):
            list(streamed.generate_tokens([1, 2, 3], max_tokens=4, forced=given[:3]))
    finally:
        streamed.close()
    (again, free_calls), (same, same_calls), (other, other_calls) = runs
    assert again == same == free and other == given
    assert same_calls == free_calls and other_calls != free_calls
