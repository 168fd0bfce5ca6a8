"""Greedy speculative output must equal the target's own greedy output, token for token."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import first_of

from decoding.api import encode_prompt
from decoding.core.plain import autoregressive_generate
from decoding.core.speculative import speculative_generate
from decoding.core.tree import TreeShape
from decoding.drafts import LayerDraft, ModelDraft, NGramDraft, build_draft
from decoding.models import load_model
from decoding.models.text import eos_ids
from decoding.settings.policies import StopRule, make_policy
from decoding.settings.sampling import Sampling
from decoding.trace import validate

TINY_PROMPTS = [[1, 5, 9, 3, 7, 5, 9], [2, 2, 2, 8, 2, 2], [42]]


def tiny_drafts(target, draft):
    return {
        "ngram": NGramDraft(),
        "layers:1": LayerDraft(target, 1, 64),
        "layers:3": LayerDraft(target, 3, 64),
        "model": ModelDraft(draft, 64, "tiny-draft"),
        "self": ModelDraft(target, 64, "self"),  # always right: exercises the bonus path
    }


@pytest.mark.parametrize("prompt", TINY_PROMPTS)
def test_tiny_every_draft_every_k(tiny_target, tiny_draft, prompt):
    ids = torch.tensor([prompt])
    expected = autoregressive_generate(tiny_target, ids, max_new_tokens=40).token_ids
    for name, draft in tiny_drafts(tiny_target, tiny_draft).items():
        for k in range(1, 9):
            trace = speculative_generate(tiny_target, ids, draft, make_policy("fixed", k), max_new_tokens=40)
            assert trace.output.token_ids == expected, f"{name} k={k}"
            validate(trace)


@pytest.mark.parametrize("policy", ["heuristic", "confidence", "entropy"])
def test_tiny_adaptive_policies(tiny_target, tiny_draft, policy):
    ids = torch.tensor([TINY_PROMPTS[0]])
    expected = autoregressive_generate(tiny_target, ids, max_new_tokens=60).token_ids
    for draft in tiny_drafts(tiny_target, tiny_draft).values():
        trace = speculative_generate(tiny_target, ids, draft, make_policy(policy, 5, 0.3), max_new_tokens=60)
        assert trace.output.token_ids == expected
        validate(trace)


def test_the_entropy_rule_on_hand_made_distributions():
    """AdaEDL's bound 1 − √H: a sure draft goes on, an unsure one stops, and two equal
    favourites stop it where the top probability alone (0.5) would not."""
    rule = StopRule("entropy", 0.3)
    sure = torch.tensor([0.98, 0.01, 0.01])  # H = 0.112 nats: bound 0.665
    assert rule.predicted_acceptance(sure) == pytest.approx(1 - math.sqrt(0.1120), abs=1e-3)
    assert not rule.stops(sure)
    assert rule.stops(torch.full((10,), 0.1))  # H = ln 10: bound below 0
    torn = torch.tensor([0.5, 0.5, 0.0])  # H = ln 2 = 0.693: bound 0.167
    assert rule.stops(torn) and not StopRule("confidence", 0.3).stops(torn)
    assert rule.predicted_acceptance(torch.tensor([1.0, 0.0])) == 1.0


def test_a_stopping_policy_shortens_rounds_where_the_draft_is_unsure(tiny_target):
    """The tiny model drafting for itself: each round stops right after its first position whose
    predicted acceptance falls below the threshold, and never drafts past k."""
    ids = torch.tensor([TINY_PROMPTS[0]])
    draft = ModelDraft(tiny_target, 64, "self")
    for name in ("confidence", "entropy"):
        policy = make_policy(name, 8, 0.5)
        trace = speculative_generate(tiny_target, ids, draft, policy, max_new_tokens=60)
        ks = [r.drafted for r in trace.rounds if r.drafted]
        assert max(ks) <= 8 and min(ks) < 8, (name, ks)  # some rounds stopped early


def test_ngram_draft_length_follows_the_matchs_support():
    """After "1 2 3" the text went on with 9 once and 8 once: an even vote, so a stopping policy
    proposes one token there; after "5 6" every occurrence went on "7 0 0": all of it."""
    seq = torch.tensor([[1, 2, 3, 9, 4, 1, 2, 3, 8, 5, 6, 7, 0, 0, 5, 6, 7, 0, 0, 1, 2, 3]])
    draft, args = NGramDraft(), (Sampling(), torch.Generator())
    assert draft.propose(seq, 4, *args).tokens.tolist() == [9, 4, 1, 2]  # no policy: the first copy
    for rule in (StopRule("entropy", 0.3), StopRule("confidence", 0.6)):
        assert draft.propose(seq, 4, *args, rule).tokens.tolist() == [9]
    agreed = torch.tensor([[5, 6, 7, 0, 0, 3, 5, 6, 7, 0, 0, 4, 5, 6]])
    assert draft.propose(agreed, 3, *args, StopRule("entropy", 0.3)).tokens.tolist() == [7, 0, 0]


def test_heuristic_changes_k(tiny_target):
    ids = torch.tensor([TINY_PROMPTS[0]])
    trace = speculative_generate(
        tiny_target, ids, ModelDraft(tiny_target, 64, "self"), make_policy("heuristic", 2), max_new_tokens=60
    )
    ks = [s.drafted for s in trace.rounds]
    assert ks[:3] == [2, 4, 6], ks  # +2 after every fully accepted round


def test_eos_stops_and_budget_is_exact(tiny_target):
    ids = torch.tensor([TINY_PROMPTS[0]])
    expected = autoregressive_generate(tiny_target, ids, max_new_tokens=40).token_ids
    eos = expected[10]
    plain = autoregressive_generate(tiny_target, ids, max_new_tokens=40, eos_ids=[eos]).token_ids
    assert plain[-1] == eos and len(plain) <= 11
    for k in (1, 3, 8):
        for draft in (NGramDraft(), ModelDraft(tiny_target, 64, "self")):
            trace = speculative_generate(
                tiny_target, ids, draft, make_policy("fixed", k), max_new_tokens=40, eos_ids=[eos]
            )
            assert trace.output.token_ids == plain
            validate(trace)
        for budget in (1, 2, 7):
            trace = speculative_generate(
                tiny_target,
                ids,
                ModelDraft(tiny_target, 64, "self"),
                make_policy("fixed", k),
                max_new_tokens=budget,
            )
            assert trace.output.token_ids == expected[:budget]


def test_layer_draft_shares_weights(tiny_target):
    draft = LayerDraft(tiny_target, 2, 64)
    assert draft.model.lm_head.weight.data_ptr() == tiny_target.lm_head.weight.data_ptr()
    assert draft.model.model.layers[1] is tiny_target.model.layers[1]
    assert len(draft.model.model.layers) == 2


def test_model_draft_never_reruns_seen_tokens(tiny_target, tiny_draft):
    """Round by round, the draft model is fed only what it has not seen: the
    prompt first, then one token after a rejection (the correction) or two
    after a fully accepted round (its last draft token and the bonus)."""
    fed: list[int] = []
    hook = tiny_draft.model.embed_tokens.register_forward_hook(lambda m, a, out: fed.append(a[0].shape[1]))
    try:
        ids = torch.tensor([TINY_PROMPTS[0]])
        trace = speculative_generate(
            tiny_target, ids, ModelDraft(tiny_draft, 64, "d"), make_policy("fixed", 4), max_new_tokens=40
        )
    finally:
        hook.remove()
    expected, previous = [], None
    for step in trace.rounds:
        if step.drafted == 0:  # the budget left room for the target's token only
            continue
        first = ids.shape[1] if previous is None else 1 + (previous.n_accepted == previous.drafted)
        expected += [first] + [1] * (step.drafted - 1)
        previous = step
    assert fed == expected


@pytest.mark.slow
def test_smollm2_greedy_is_lossless(smol, specbench):
    """The real offline model, Spec-Bench prompts, every draft source."""
    cases = [
        ("summarization", "ngram", (1, 3, 8)),
        ("rag", "ngram", (2, 5)),
        ("math_reasoning", "layers:22", (2, 5, 8)),
        ("qa", "smollm2-135m", (3,)),
    ]
    for category, spec, ks in cases:
        prompt = encode_prompt(smol, first_of(specbench, category)["prompt"], chat=True)
        eos = eos_ids(smol.model, smol.tokenizer)
        expected = autoregressive_generate(smol.model, prompt, max_new_tokens=32, eos_ids=eos).token_ids
        draft = build_draft(spec, smol)
        for k in ks:
            trace = speculative_generate(
                smol.model, prompt, draft, make_policy("fixed", k), max_new_tokens=32, eos_ids=eos
            )
            assert trace.output.token_ids == expected, f"{category} {spec} k={k}"
            validate(trace)


@pytest.mark.slow
def test_gemma3_offline_preset_is_lossless():
    """The second offline preset (Gemma-3-270M base, sliding-window attention)."""
    gemma = load_model("gemma3-270m", "cpu")
    prompt = encode_prompt(gemma, "The capital of France is Paris. The capital of Italy is", chat=False)
    expected = autoregressive_generate(
        gemma.model, prompt, max_new_tokens=12, eos_ids=eos_ids(gemma.model, gemma.tokenizer)
    ).token_ids
    # Trees too: Gemma-3 takes the tree's 4D mask for its sliding-window layers as well.
    for spec, k, tree in [("ngram", 3, None), ("layers:9", 2, None), ("layers:9", 3, TreeShape(8, 2))]:
        trace = speculative_generate(
            gemma.model,
            prompt,
            build_draft(spec, gemma),
            make_policy("fixed", k),
            max_new_tokens=12,
            eos_ids=eos_ids(gemma.model, gemma.tokenizer),
            tree=tree,
        )
        assert trace.output.token_ids == expected, (spec, tree)
        validate(trace)
