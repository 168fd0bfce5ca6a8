"""Speculative sampling must follow the target's distribution exactly.

Chi-square tests on fixed seeds (so they are deterministic), each paired
with a control showing the same test rejects a subtly wrong rule.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import tiny_llama
from scipy.stats import chisquare

from decoding.core.speculative import speculative_generate
from decoding.core.verify import verify_sampling, warp
from decoding.drafts import ModelDraft, NGramDraft
from decoding.runtime.forward import forward, new_cache
from decoding.settings.policies import make_policy
from decoding.settings.sampling import Sampling

ALPHA = 1e-3


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit, pooling cells expected to hold fewer than 5."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


P = torch.tensor([[0.05, 0.40, 0.10, 0.30, 0.15], [0.30, 0.10, 0.20, 0.20, 0.20]], dtype=torch.float64)
Q = torch.tensor([[0.30, 0.20, 0.30, 0.10, 0.10]], dtype=torch.float64)


def first_token(draft_id: int, probs_q, gen, wrong: bool = False) -> int:
    ids = torch.tensor([draft_id])
    if wrong:  # resample from p instead of the residual: biased towards the draft
        u = torch.rand(1, generator=gen)
        q = 1.0 if probs_q is None else probs_q[0, draft_id]
        if u < min(1.0, float(P[0, draft_id] / q)):
            return draft_id
        return int(torch.multinomial(P[0], 1, generator=gen))
    v = verify_sampling(P, ids, probs_q, gen)
    return draft_id if v.n_accepted else int(v.emitted)


@pytest.mark.parametrize("deterministic", [False, True])
def test_rejection_rule_gives_target_distribution(deterministic):
    gen = torch.Generator().manual_seed(0)
    n = 20000
    counts = {False: np.zeros(5), True: np.zeros(5)}
    for _ in range(n):
        d = 3 if deterministic else int(torch.multinomial(Q[0], 1, generator=gen))
        q = None if deterministic else Q
        for wrong in (False, True):
            counts[wrong][first_token(d, q, gen, wrong)] += 1
    assert chi2_pvalue(counts[False], P[0].numpy()) > ALPHA
    assert chi2_pvalue(counts[True], P[0].numpy()) < ALPHA  # the test has teeth


def exact_pair_distribution(model, prompt, sampling: Sampling) -> np.ndarray:
    """P(t1, t2) of the target alone, by enumerating every first token."""
    cache = new_cache(model)
    p1 = warp(forward(model, prompt, cache, keep=1)[-1], sampling)
    vocab = p1.shape[0]
    joint = np.zeros((vocab, vocab))
    for t1 in range(vocab):
        ids = torch.cat([prompt, torch.tensor([[t1]])], dim=1)
        p2 = warp(forward(model, ids, new_cache(model), keep=1)[-1], sampling)
        joint[t1] = (p1[t1] * p2).numpy()
    return joint


def noisy_copy(model, scale: float):
    """A draft that is close to the target but not equal: q differs from p."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(11)
    w = draft.lm_head.weight
    w += scale * w.std() * torch.randn(w.shape, generator=gen, dtype=w.dtype)
    return draft


SETTINGS = [Sampling(temperature=1.0), Sampling(temperature=0.7, top_k=6, top_p=0.9)]


@pytest.mark.parametrize("sampling", SETTINGS, ids=["t1.0", "t0.7-k6-p0.9"])
@pytest.mark.parametrize("draft_kind", ["model", "ngram"])
def test_end_to_end_pairs_follow_target(sampling, draft_kind):
    vocab = 10
    target = tiny_llama(seed=3, layers=2, vocab=vocab, init=0.6)
    draft_model = noisy_copy(target, scale=0.5)
    prompt = torch.tensor([[3, 5, 3, 5, 3]])
    joint = exact_pair_distribution(target, prompt, sampling)
    counts = np.zeros((vocab, vocab))
    accepted = 0
    runs = 2500
    for seed in range(runs):
        draft = ModelDraft(draft_model, vocab, "d") if draft_kind == "model" else NGramDraft()
        s = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed)
        trace = speculative_generate(target, prompt, draft, make_policy("fixed", 2), s, max_new_tokens=2)
        t1, t2 = trace.output.token_ids
        counts[t1, t2] += 1
        accepted += trace.totals.accepted
    # Both paths must be exercised for the test to mean something.
    assert runs * 0.2 < accepted < runs * 2 * 0.95
    assert chi2_pvalue(counts.ravel(), joint.ravel()) > ALPHA


def test_warp_top_k_top_p():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    assert torch.count_nonzero(warp(logits, Sampling(1.0, top_k=2))) == 2
    probs = warp(logits, Sampling(1.0, top_p=0.7))  # 0.5 + 0.2 reaches 0.7: keep two
    assert torch.count_nonzero(probs) == 2
    assert torch.allclose(probs[:2], torch.tensor([0.5, 0.2]) / 0.7)
    assert torch.count_nonzero(warp(logits, Sampling(1.0, top_p=0.01))) == 1
    sharp = warp(logits, Sampling(0.1))
    assert sharp[0] > 0.99


def test_same_seed_same_output(tiny_target):
    prompt = torch.tensor([[1, 2, 3]])
    runs = [
        speculative_generate(
            tiny_target, prompt, NGramDraft(), make_policy("fixed", 3), Sampling(1.0, seed=7), 30
        ).output.token_ids
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
