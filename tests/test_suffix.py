"""Suffix decoding: drafts from this run's and earlier runs' text, lossless, within its memory bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_llama
from test_sampling import ALPHA, SETTINGS, chi2_pvalue, exact_pair_distribution

from decoding.core.plain import autoregressive_generate
from decoding.core.speculative import speculative_generate
from decoding.core.tree import TreeShape
from decoding.drafts.suffix import SuffixCorpus, SuffixDraft
from decoding.settings.policies import make_policy
from decoding.settings.sampling import Sampling
from decoding.trace import validate


def test_a_repeated_request_is_drafted_from_the_earlier_output(tiny_target):
    corpus = SuffixCorpus()
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    expected = autoregressive_generate(tiny_target, ids, max_new_tokens=40).token_ids
    first = speculative_generate(
        tiny_target, ids, SuffixDraft(corpus), make_policy("fixed", 8), max_new_tokens=40
    )
    again = speculative_generate(
        tiny_target, ids, SuffixDraft(corpus), make_policy("fixed", 8), max_new_tokens=40
    )
    assert first.output.token_ids == again.output.token_ids == expected  # lossless, both times
    validate(again)
    assert again.totals.tokens_per_round > first.totals.tokens_per_round
    assert again.totals.acceptance_rate > 0.9  # the earlier run wrote exactly this


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_chains_and_trees_are_lossless(tiny_target, k):
    corpus = SuffixCorpus()
    for prompt in ([2, 2, 2, 8, 2, 2], [1, 5, 9, 3, 7, 5, 9], [42]):
        ids = torch.tensor([prompt])
        expected = autoregressive_generate(tiny_target, ids, max_new_tokens=30).token_ids
        chain = speculative_generate(
            tiny_target, ids, SuffixDraft(corpus), make_policy("fixed", k), max_new_tokens=30
        )
        tree = speculative_generate(
            tiny_target,
            ids,
            SuffixDraft(corpus),
            make_policy("fixed", k),
            max_new_tokens=30,
            tree=TreeShape(8, 2),
        )
        assert chain.output.token_ids == tree.output.token_ids == expected
        validate(chain)
        validate(tree)


def test_the_corpus_stays_within_its_bound_dropping_the_oldest_runs():
    corpus = SuffixCorpus(max_tokens=100)
    for run in range(10):
        corpus.update(run, torch.arange(30) + 100 * run)
    assert corpus.tokens() <= 100
    flat = corpus.flat()
    assert int(flat[flat >= 0].max()) == 929 and int(flat[flat >= 0].min()) >= 700  # the newest runs
    corpus.update(99, torch.arange(500))  # one run larger than the bound stays alone
    assert corpus.tokens() == 500


def test_the_flat_corpus_is_every_run_in_order_whichever_run_grows():
    """Runs interleave in a shared corpus: the one updated last is the newest, and restoring a
    snapshot gives back its runs and count."""
    corpus = SuffixCorpus(max_tokens=40)
    steps = [(0, 5), (1, 3), (0, 8), (2, 4), (2, 9), (1, 12), (3, 15)]
    for run, length in steps:
        corpus.update(run, torch.arange(length) + 100 * run)
        runs = corpus.snapshot()
        expected = [t for ids in runs.values() for t in ids.tolist()]
        assert corpus.flat().tolist() == expected
        assert corpus.tokens() == len(expected) - len(runs) and corpus.tokens() <= 40
        assert all(ids[-1] == -1 for ids in runs.values())
    assert list(corpus.snapshot()) == [2, 1, 3]  # run 0 went first, once run 3 came
    kept = corpus.snapshot()
    corpus.update(4, torch.arange(30))
    corpus.restore(kept)
    assert corpus.tokens() == 9 + 12 + 15 and corpus.flat().tolist()[-16:] == [*range(300, 315), -1]


def test_the_draft_length_follows_the_match():
    corpus = SuffixCorpus()
    corpus.update(0, torch.tensor([5, 6, 7, 8, 9, 10, 11, 12, 13, 14]))
    draft = SuffixDraft(corpus, alpha=1.0)
    short = draft.propose(torch.tensor([[40, 41, 7]]), 16, Sampling(), torch.Generator())
    long = draft.propose(torch.tensor([[5, 6, 7]]), 16, Sampling(), torch.Generator())
    assert short.tokens.tolist() == [8] and long.tokens.tolist() == [8, 9, 10]


@pytest.mark.parametrize("sampling", SETTINGS, ids=["t1.0", "t0.7-k6-p0.9"])
def test_sampling_with_suffix_drafts_follows_the_target(sampling):
    vocab = 10
    target = tiny_llama(seed=3, layers=2, vocab=vocab, init=0.6)
    prompt = torch.tensor([[3, 5, 3, 5, 3]])
    joint = exact_pair_distribution(target, prompt, sampling)
    counts, accepted, runs = np.zeros((vocab, vocab)), 0, 2500
    corpus = SuffixCorpus()  # earlier runs' outputs feed later drafts, as in a server
    for seed in range(runs):
        s = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed)
        trace = speculative_generate(
            target, prompt, SuffixDraft(corpus), make_policy("fixed", 2), s, max_new_tokens=2
        )
        t1, t2 = trace.output.token_ids
        counts[t1, t2] += 1
        accepted += trace.totals.accepted
    assert runs * 0.2 < accepted < runs * 2 * 0.95  # both paths exercised
    assert chi2_pvalue(counts.ravel(), joint.ravel()) > ALPHA
