"""The static-cache pass (decoding/runtime/static.py) on the CPU, run eagerly: what a GPU replays
from CUDA graphs, checked here where CI runs. Lossless for every draft source with its own model or
the target's features, chains and trees; rollback moves a length; sampling takes the same tokens as
the model's own forward."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama
from test_heads import random_head
from test_sampling import noisy_copy

from decoding.core.batch import BatchSettings, batch_generate
from decoding.core.graphs import use_batch_graphs, use_graphs
from decoding.core.plain import autoregressive_generate
from decoding.core.speculative import speculative_generate
from decoding.core.tree import TreeShape
from decoding.drafts import HeadDraft, LayerDraft, ModelDraft, NGramDraft
from decoding.runtime import static as static_pass
from decoding.runtime.forward import crop, forward, forward_batch, new_cache
from decoding.runtime.llama import StepCache
from decoding.runtime.static import StaticCache, drop_static, graphed, use_static
from decoding.settings.policies import make_policy
from decoding.settings.sampling import Sampling
from decoding.trace import validate

PROMPT = torch.tensor([[1, 5, 9, 3, 7, 5, 9, 3, 7]])


@pytest.fixture
def pair():
    """A target and a separate draft close to it, of their own (the static buffers are a model's)."""
    target = tiny_llama(seed=0)
    return target, noisy_copy(target, scale=0.3)


def drafts(target, draft_model) -> dict:
    return {
        "ngram": NGramDraft(),
        "model": ModelDraft(draft_model, 64, "tiny-draft"),
        "layers:2": LayerDraft(target, 2, 64),
        "head": HeadDraft(random_head(target, list(range(0, 64, 2)), std=0.2), target, "h"),
    }


def static(target, draft, capacity: int = 64) -> None:
    use_static(target, capacity, graphs=False)
    if isinstance(draft, ModelDraft):
        use_static(draft.model, capacity, graphs=False)
        draft.reset()


def test_static_pass_is_lossless_for_every_draft_source(pair):
    """Greedy output equals plain decoding's, and each round drafts what it drafts over the
    model's own forward (the head reads the target's features from the static pass)."""
    target, draft_model = pair
    expected = autoregressive_generate(target, PROMPT, max_new_tokens=24).token_ids
    for name, draft in drafts(target, draft_model).items():
        own = speculative_generate(target, PROMPT, draft, make_policy("fixed", 4), max_new_tokens=24)
        static(target, draft)
        assert isinstance(new_cache(target), StaticCache)
        if name == "ngram":
            assert autoregressive_generate(target, PROMPT, max_new_tokens=24).token_ids == expected
        for k in (1, 4):
            trace = speculative_generate(target, PROMPT, draft, make_policy("fixed", k), max_new_tokens=24)
            assert trace.output.token_ids == expected, f"{name} k={k}"
            validate(trace)
        assert [[d.id for d in r.draft] for r in trace.rounds] == [
            [d.id for d in r.draft] for r in own.rounds
        ], name
        drop_static(target)


def test_static_trees_are_lossless_for_every_draft_source(pair):
    target, draft_model = pair
    expected = autoregressive_generate(target, PROMPT, max_new_tokens=20).token_ids
    for name, draft in drafts(target, draft_model).items():
        static(target, draft)
        for shape in (TreeShape(8, 2), TreeShape(16, 3)):
            trace = speculative_generate(
                target, PROMPT, draft, make_policy("fixed", 3), max_new_tokens=20, tree=shape
            )
            assert trace.output.token_ids == expected, f"{name} {shape}"
            assert any(len(r.tree or []) > 1 for r in trace.rounds), name
            validate(trace)
        drop_static(target)


@pytest.mark.parametrize("tree", [None, TreeShape(8, 2)], ids=["chain", "tree"])
def test_sampling_takes_the_same_tokens_as_the_models_own_forward(pair, tree):
    """Same seed, same draws: the static pass computes what the model's forward does, so every
    verdict and token of a sampled run matches (the sampling tests check that path's statistics)."""
    target, draft_model = pair
    sampling = Sampling(temperature=0.9, top_p=0.95, seed=7)
    for name in ("model", "layers:2"):
        runs = []
        for on in (False, True):
            draft = drafts(target, draft_model)[name]
            if on:
                static(target, draft)
            trace = speculative_generate(
                target, PROMPT, draft, make_policy("fixed", 4), sampling, max_new_tokens=20, tree=tree
            )
            runs.append(([r.n_accepted for r in trace.rounds], trace.output.token_ids))
            drop_static(target)
            drop_static(draft.model)
        assert runs[0] == runs[1], name


def test_rollback_moves_a_length_and_copies_nothing(pair):
    target, _ = pair
    runner = use_static(target, 32, graphs=False)
    cache = new_cache(target)
    forward(target, PROMPT, cache)
    keys = runner.keys.clone()
    where = runner.keys.data_ptr()
    crop(cache, 4)
    assert cache.get_seq_length() == 4
    assert runner.keys.data_ptr() == where and torch.equal(runner.keys, keys)
    # The next pass overwrites the rows past the length and sees only the first four.
    again = forward(target, PROMPT[:, 4:], cache)
    fresh = forward(target, PROMPT, new_cache(target))
    assert torch.allclose(again, fresh[4:], atol=1e-10)


def test_a_run_longer_than_its_buffers_grows_them(pair):
    target, draft_model = pair
    expected = autoregressive_generate(target, PROMPT, max_new_tokens=30).token_ids
    draft = ModelDraft(draft_model, 64, "d")
    static(target, draft, capacity=12)
    trace = speculative_generate(target, PROMPT, draft, make_policy("fixed", 4), max_new_tokens=30)
    assert trace.output.token_ids == expected


def test_the_cpu_keeps_its_own_path(pair):
    """Graphs are for CUDA: a run on the CPU keeps the lean pass and its C++ kernels' cache."""
    target, draft_model = pair
    draft = ModelDraft(draft_model, 64, "d")
    assert not use_graphs(target, draft, 40, 4, None)
    assert not graphed(target) and isinstance(new_cache(target), StepCache)
    assert isinstance(new_cache(draft_model), StepCache)


def test_a_draft_that_is_the_target_itself_keeps_its_own_cache(pair):
    """The buffers are the model's: a second cache while the first holds them is the model's own."""
    target, _ = pair
    expected = autoregressive_generate(target, PROMPT, max_new_tokens=16).token_ids
    draft = ModelDraft(target, 64, "itself")
    static(target, draft)
    assert isinstance(draft.cache, StaticCache) and not isinstance(new_cache(target), StaticCache)
    trace = speculative_generate(target, PROMPT, draft, make_policy("fixed", 4), max_new_tokens=16)
    assert trace.output.token_ids == expected and trace.totals.accepted > 0


def test_a_draft_model_keeps_its_buffers_from_run_to_run(pair):
    """A draft's cache from the last run lets go of the buffers when the next run starts, so every
    run drafts over them (and, on a GPU, over the graphs captured for them)."""
    target, draft_model = pair
    draft = ModelDraft(draft_model, 64, "d")
    static(target, draft)
    for _ in range(2):
        speculative_generate(target, PROMPT, draft, make_policy("fixed", 3), max_new_tokens=6)
        assert isinstance(draft.cache, StaticCache) and draft.cache.get_seq_length() > 0


def batch_prompts() -> list[torch.Tensor]:
    """Seven prompts of different lengths: a batch of 3 takes new ones as others finish."""
    draw = torch.Generator().manual_seed(1)
    return [torch.randint(0, 64, (1, n), generator=draw) for n in (5, 9, 3, 12, 7, 6, 4)]


@pytest.fixture
def batched_passes(monkeypatch):
    """How many sequences each pass over static slots checked (the real pass, counted)."""
    seen: list[int] = []

    def counted(caches, *rest):
        seen.append(len(caches))
        return step_batch(caches, *rest)

    step_batch = static_pass.step_batch
    monkeypatch.setattr(static_pass, "step_batch", counted)
    return seen


def test_a_batch_over_static_slots_is_lossless_in_one_pass_a_step(pair, batched_passes):
    """Each sequence of a batch, in a slot of the buffers, gives its own plain run's tokens, plainly,
    with chains and with trees, and every step is one pass over the slots (a finished sequence's
    slot goes to the next prompt)."""
    target, _ = pair
    prompts = batch_prompts()
    expected = [autoregressive_generate(target, p, max_new_tokens=20).token_ids for p in prompts]
    for size in (1, 3):
        use_static(target, 48, graphs=False, slots=size)
        for draft, tree in ((None, None), (NGramDraft(), None), (NGramDraft(), TreeShape(8, 2))):
            batched_passes.clear()
            policy = (lambda: make_policy("fixed", 3)) if draft else None
            settings = BatchSettings(size, max_new_tokens=20, tree=tree)
            run = batch_generate(target, prompts, settings, draft, policy)
            assert run.outputs == expected, (size, draft, tree)
            assert batched_passes == [p.sequences for p in run.passes] and max(batched_passes) == size
        drop_static(target)


def test_a_head_drafts_the_same_from_a_batch_over_static_slots(pair, batched_passes):
    """The head's feature taps are split back to each sequence: it drafts, round for round, what it
    drafts in the CPU's batched pass (a misrouted feature would draft other tokens, and the output
    would stay the same)."""
    target, _ = pair
    prompts = batch_prompts()
    head = HeadDraft(random_head(target, list(range(0, 64, 2)), std=0.2), target, "h")
    runs = []
    for static_slots in (False, True):
        if static_slots:
            use_static(target, 48, graphs=False, slots=3)
        run = batch_generate(
            target, prompts, BatchSettings(3, max_new_tokens=16), head, lambda: make_policy("fixed", 3)
        )
        runs.append([[r.proposal.tokens.tolist() for r in rounds] for rounds in run.rounds])
        drop_static(target)
    assert runs[0] == runs[1] and max(batched_passes) == 3


def test_padded_rows_leave_every_sequence_as_it_was(pair):
    """Two sequences of 2 and 5 new rows in one pass over 3 slots: each gets the logits its own pass
    gives, and a pass after it too (the padding wrote nowhere a real row lives)."""
    target, _ = pair
    runner = use_static(target, 32, graphs=False, slots=3)
    a, b = new_cache(target), new_cache(target)
    assert (a.slot, b.slot) == (0, 1) and runner.new_cache().slot == 2
    forward(target, PROMPT[:, :4], a)
    forward(target, PROMPT[:, :2], b)
    got = forward_batch(target, [PROMPT[:, 4:6], PROMPT[:, 2:7]], [a, b])
    after = forward_batch(target, [PROMPT[:, 6:7], PROMPT[:, 7:8]], [a, b])
    drop_static(target)
    for n, logits, next_logits in ((6, got[0], after[0]), (7, got[1], after[1])):
        own = forward(target, PROMPT[:, : n + 1], new_cache(target))
        assert torch.allclose(logits, own[n - len(logits) : n], atol=1e-10)
        assert torch.allclose(next_logits, own[n:], atol=1e-10)


def test_a_batch_on_the_cpu_keeps_its_own_pass(pair):
    target, _ = pair
    assert not use_batch_graphs(target, 4, 40, 3, None)
    assert isinstance(new_cache(target), StepCache)
