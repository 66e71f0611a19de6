"""Speculative decoding: greedy tokens equal plain decoding at every depth, drafting shows in the counters,
it switches itself off when it cannot pay, and bad drafters or depths are refused clearly.

Targets are tiny streamed stores (the experts come from the drive files on every verify pass).
Drafters: the target's own trunk without routed experts (partial acceptance), the target itself
held in RAM (near-total acceptance), and for a MoEfied tiny llama its dense original, as for the
default model. Times are never asserted; the switch-off test uses a drafter that always disagrees,
whose acceptance (0) is at or below any break-even.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from nightshift.app.cli import main
from nightshift.engine.errors import NightshiftError
from nightshift.engine.generation import DraftStats
from nightshift.engine.io.drives import Drive
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.row_attention import attention_row_by_row
from nightshift.engine.runtime import open_model
from nightshift.engine.speculative import MIN_ROUNDS, BreakEven, DraftError
from nightshift.engine.store.drafter import make_drafter
from nightshift.engine.store.importer import import_checkpoint
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.synth import write_tokenizer
from tests.helpers.stores import QUICK, import_tiny, tiny_checkpoint, tiny_moefy

PROMPT = np.random.default_rng(7).integers(3, 500, size=40).tolist()
TOKENS = 16


def kimi_logits(store: Path, rows: list[int], row_by_row: bool) -> tuple[mx.array, mx.array]:
    """Kimi K3 in RAM after PROMPT: logits of `rows` fed one decode step at a time, and in one pass of many rows."""
    model, _ = load_store(store)
    caches = []
    for _ in range(2):
        caches.append(make_prompt_cache(model))
        model(mx.array(PROMPT)[None], cache=caches[-1])
    steps = mx.concatenate([model(mx.array([[t]]), cache=caches[0])[0] for t in rows])
    with attention_row_by_row(model) if row_by_row else nullcontext():
        one_pass = model(mx.array(rows)[None], cache=caches[1])[0]
    return steps, one_pass


def test_a_pass_of_many_rows_computes_each_row_as_a_decode_step_with_attention_row_by_row(stores):
    rows = [11, 250, 37, 400, 9]
    steps, plain_pass = kimi_logits(stores["kimi_k3"], rows, row_by_row=False)
    assert not mx.array_equal(steps, plain_pass)  # bfloat16 Kimi K3: one row and many rows by other formulas
    steps, row_by_row = kimi_logits(stores["kimi_k3"], rows, row_by_row=True)
    assert mx.array_equal(steps, row_by_row)  # bit for bit


def generate(
    store: Path,
    drafter: Path | None,
    depth: int | None,
    switch_off: bool = False,
    tokens: int = TOKENS,
    prompt: list[int] = PROMPT,
):
    model = open_model(store, stream=StreamSettings(), drafter=drafter)
    try:
        chunks = list(model.generate_tokens(prompt, max_tokens=tokens, draft_depth=depth, draft_switch_off=switch_off))
    finally:
        model.close()
    return [c.token for c in chunks], chunks[-1].stats


@pytest.fixture(scope="module")
def trunk_drafters(stores, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("drafters")
    return {arch: make_drafter(stores[arch], root / arch, routed=False) for arch in QUICK}


@pytest.fixture(scope="module")
def plain(stores) -> dict[str, list[int]]:
    return {arch: generate(stores[arch], None, None)[0] for arch in QUICK}


@pytest.mark.parametrize("depth", [0, 2, 4])
@pytest.mark.parametrize("arch", QUICK)
def test_drafted_greedy_tokens_equal_plain_decoding(arch, depth, stores, trunk_drafters, plain):
    for drafter in (trunk_drafters[arch], stores[arch]):  # partial acceptance; the target itself in RAM
        tokens, stats = generate(stores[arch], drafter, depth)
        assert tokens == plain[arch]
        draft = stats.draft
        assert draft.depth == depth
        if depth == 0:
            assert draft.drafted == 0 and draft.rounds == 0
            continue
        assert draft.drafted > 0 and draft.rounds > 0  # drafting fired
        assert draft.union_per_verify >= 1  # every verify pass read experts through the streaming layers
    assert draft.acceptance_rate > 0.5 if depth else True  # the target drafting for itself agrees with itself


def test_a_recurrent_cache_is_rewound_by_replaying_the_accepted_rows(stores, trunk_drafters, plain):
    tokens, stats = generate(stores["kimi_k3"], trunk_drafters["kimi_k3"], 3)  # Kimi K3's delta attention
    assert tokens == plain["kimi_k3"]
    assert stats.draft.accepted < stats.draft.drafted and stats.draft.replays > 0


def test_verify_reads_the_union_of_its_rows_experts_once_per_layer(stores):
    _, stats = generate(stores["qwen3_moe"], stores["qwen3_moe"], 4)
    draft = stats.draft
    # 5 rows of top-2 of 8 experts: at least one row's 2, at most all 8; one pass per MoE layer per verify.
    assert 2 <= draft.union_per_verify <= 8
    assert draft.verify_layer_calls == draft.rounds * 3


@pytest.fixture(scope="module")
def tiny_llama_moe(tiny_dense, tmp_path_factory) -> Path:
    """A MoEfied tiny llama (8 experts, 6 active) imported into a store: the default model in miniature."""
    root = tmp_path_factory.mktemp("llama-moe")
    src = tiny_moefy(tiny_dense, root / "src", experts=8, k=6)
    import_checkpoint(src, root / "store", [Drive("d0", root / "drive")])
    return root / "store"


@pytest.mark.parametrize("depth", [0, 2, 4])
def test_a_llama_moe_drafted_by_its_dense_original_decodes_its_own_tokens(tiny_llama_moe, tiny_dense, depth):
    prompt = [t % 200 for t in PROMPT[:12]]  # ids inside the tiny llama's vocabulary
    reference, _ = generate(tiny_llama_moe, None, None, prompt=prompt)
    tokens, stats = generate(tiny_llama_moe, tiny_dense, depth, prompt=prompt)
    assert tokens == reference
    assert (stats.draft.drafted > 0) == (depth > 0)


def test_a_drafter_that_always_disagrees_switches_itself_off(stores, trunk_drafters, tmp_path):
    store = stores["qwen3_moe"]
    reference, _ = generate(store, None, None, tokens=40)
    model = open_model(store, stream=StreamSettings(), drafter=stores["qwen3_moe"])
    try:
        head = model.drafter.model.lm_head
        head.weight = -head.weight  # its favourite token is now the target's least likely one
        chunks = list(model.generate_tokens(PROMPT, max_tokens=40, draft_depth=3))
    finally:
        model.close()
    draft = chunks[-1].stats.draft
    assert [c.token for c in chunks] == reference
    assert draft.accepted == 0 and draft.drafted == 3 * MIN_ROUNDS
    assert draft.switched_off == 1 and draft.switched_off_after is not None
    assert "break-even" in draft.switch_off_reason
    assert draft.plain_steps > 20  # the rest of the generation decoded plainly


def test_break_even_is_the_acceptance_at_which_a_round_pays_like_plain_steps():
    stats = DraftStats(depth=4)
    judge = BreakEven(stats, calibrate=True)
    for seconds in (5.0, 1.0, 1.0):  # the first plain step (warm-up) is not used
        judge.plain(seconds)
    assert stats.plain_step_s == 1.0
    # A round of 4 drafts taking 2 s pays when it yields more than 2 tokens: acceptance above 1/4.
    assert [judge.round(2.0, 4, 2) for _ in range(MIN_ROUNDS)] == [False] * MIN_ROUNDS
    assert stats.break_even_acceptance == pytest.approx(0.25)
    for _ in range(8):
        off = judge.round(2.0, 4, 1)  # the window fills with rounds at acceptance 1/4: not worth it
    assert off


def test_a_negative_depth_or_a_depth_without_drafter_is_refused(stores, trunk_drafters):
    with pytest.raises(DraftError, match="draft depth -1"):
        generate(stores["qwen3_moe"], trunk_drafters["qwen3_moe"], -1)
    with pytest.raises(NightshiftError, match="needs a drafter"):
        generate(stores["qwen3_moe"], None, 2)


def test_a_drafter_with_another_tokenizer_is_refused(stores, tmp_path):
    drafter = make_drafter(stores["qwen3_moe"], tmp_path / "other", layers=1)
    write_tokenizer(drafter, 300)  # a tokenizer trained to another size: other ids
    with pytest.raises(DraftError, match="another tokenizer"):
        open_model(stores["qwen3_moe"], drafter=drafter)


def test_make_drafter_refuses_bad_layer_counts_and_used_directories(stores, tmp_path):
    with pytest.raises(NightshiftError, match="--layers 3"):
        make_drafter(stores["qwen3_moe"], tmp_path / "d", layers=3)  # all 3 layers with their experts: the model
    make_drafter(stores["qwen3_moe"], tmp_path / "d", layers=1)
    with pytest.raises(NightshiftError, match="not empty"):
        make_drafter(stores["qwen3_moe"], tmp_path / "d", layers=1)


def test_cli_drafter_generate_and_draft_sweep_recorded_with_proof(home, tmp_path, capsys):
    store = import_tiny(tmp_path, tiny_checkpoint(tmp_path, "qwen3_moe"), "q")
    assert main(["model", "drafter", "--from", str(store), "--name", "q-draft", "--no-routed-experts"]) == 0
    drafter = Path(capsys.readouterr().out.strip())
    assert (
        main(
            [
                "generate",
                "--model",
                str(store),
                "--drafter",
                "q-draft",
                "--draft-depth",
                "2",
                "--max-tokens",
                "8",
                "hello",
            ]
        )
        == 0
    )
    assert "draft depth 2:" in capsys.readouterr().err
    assert main(["generate", "--model", str(store), "--draft-depth", "2", "hello"]) == 1
    assert "--draft-depth needs --drafter" in capsys.readouterr().err
    assert (
        main(
            [
                "bench",
                "draft",
                "--model",
                str(store),
                "--drafter",
                str(drafter),
                "--depths",
                "0,2",
                "--tokens",
                "6",
                "--repeats",
                "2",
            ]
        )
        == 0
    )
    assert "best depth" in capsys.readouterr().err
    assert main(["runs", "export"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [(r["kind"], r["config"]["depth"]) for r in runs] == [("draft", 0), ("draft", 2)]
    assert runs[1]["counters"]["drafted"] > 0 and runs[1]["figures"]["union_per_verify"] > 0
    assert runs[0]["figures"]["experts_per_layer_pass"] == 2  # plain decoding: one row, the router's top 2 of 8
    assert all(len(r["figures"]["tokens_per_s_runs"]) == 2 for r in runs)
    best = json.loads((store / "draft.json").read_text())["q-draft"]
    assert best["depth"] in (0, 2) and best["run"] in (runs[0]["id"], runs[1]["id"])
