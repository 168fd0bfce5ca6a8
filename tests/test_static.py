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

from decoding.core.graphs import use_graphs
from decoding.core.plain import autoregressive_generate
from decoding.core.speculative import speculative_generate
from decoding.core.tree import TreeShape
from decoding.drafts import HeadDraft, LayerDraft, ModelDraft, NGramDraft
from decoding.runtime.forward import crop, forward, new_cache
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
