"""Token trees: lossless for every draft source and shape, the tree pass equal to each
path run alone, the caches kept to the accepted path, and the multi-candidate
sampling rule following the target's distribution."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import first_of
from test_heads import random_head
from test_sampling import ALPHA, chi2_pvalue

from app.tabs.theory import run_tree_theory
from decoding import costmodel
from decoding.api import RunConfig, generate
from decoding.core.plain import Clock, autoregressive_generate, prefill
from decoding.core.speculative import Decoder, speculative_generate, tree_round
from decoding.core.tree import TokenTree, TreeShape, grow_tree, tree_inputs, verify_tree
from decoding.drafts import LayerDraft, ModelDraft, NGramDraft
from decoding.drafts.head import HeadDraft
from decoding.errors import SpecLensError, TraceError
from decoding.runtime.forward import forward, new_cache
from decoding.settings.policies import make_policy
from decoding.settings.sampling import Sampling
from decoding.trace import Trace, validate
from visualize.explain import explain_round
from visualize.timeline import timeline_html
from visualize.tree import STATE_NAMES, tree_figure

SHAPES = [(1, 1, 1), (4, 2, 2), (8, 2, 4), (16, 3, 5), (30, 4, 6)]  # nodes, branch, depth
PROMPTS = [[1, 5, 9, 3, 7, 5, 9, 3, 7], [2, 2, 2, 8, 2, 2], [42]]


def tiny_sources(target, draft) -> dict:
    return {
        "ngram": lambda: NGramDraft(),
        "layers:2": lambda: LayerDraft(target, 2, 64),
        "model": lambda: ModelDraft(draft, 64, "tiny-draft"),
        "self": lambda: ModelDraft(target, 64, "self"),  # always right: whole paths are kept
        "head": lambda: HeadDraft(random_head(target, list(range(0, 64, 2)), std=0.2), target, "h"),
    }


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_trees_are_lossless_for_every_source_and_shape(tiny_target, tiny_draft, prompt):
    ids = torch.tensor([prompt])
    expected = autoregressive_generate(tiny_target, ids, max_new_tokens=40).token_ids
    for name, make in tiny_sources(tiny_target, tiny_draft).items():
        for nodes, branch, depth in SHAPES:
            trace = speculative_generate(
                tiny_target,
                ids,
                make(),
                make_policy("fixed", depth),
                max_new_tokens=40,
                tree=TreeShape(nodes, branch),
            )
            assert trace.output.token_ids == expected, f"{name} {nodes}/{branch}/{depth}"
            validate(trace)
            assert all(r.tree is not None and len(r.tree) <= nodes for r in trace.rounds)


def test_a_tree_keeps_more_than_a_chain_when_the_draft_hesitates(tiny_target, tiny_draft):
    ids = torch.tensor([PROMPTS[0]])

    def tokens_per_round(tree):
        draft = LayerDraft(tiny_target, 2, 64)
        trace = speculative_generate(
            tiny_target, ids, draft, make_policy("fixed", 3), max_new_tokens=60, tree=tree
        )
        return trace.totals.tokens_per_round

    assert tokens_per_round(TreeShape(16, 3)) > tokens_per_round(None)


@pytest.mark.parametrize("source", ["layers:2", "model", "head"])
def test_a_one_branch_tree_drafts_what_the_chain_drafts(tiny_target, tiny_draft, source):
    """Branch 1 is a chain: the same drafts and verdicts, through the tree's masks and caches."""
    make = tiny_sources(tiny_target, tiny_draft)[source]
    ids = torch.tensor([PROMPTS[0]])
    for k in (1, 3, 5):
        chain = speculative_generate(tiny_target, ids, make(), make_policy("fixed", k), max_new_tokens=40)
        tree = speculative_generate(
            tiny_target, ids, make(), make_policy("fixed", k), max_new_tokens=40, tree=TreeShape(k, 1)
        )
        assert [[d.id for d in r.draft[: r.n_accepted]] for r in tree.rounds] == [
            [d.id for d in r.draft[: r.n_accepted]] for r in chain.rounds
        ]
        assert [r.emitted.id for r in tree.rounds if r.emitted] == [
            r.emitted.id for r in chain.rounds if r.emitted
        ]


def random_tree(n: int, vocab: int, seed: int) -> TokenTree:
    gen = torch.Generator().manual_seed(seed)
    tree = TokenTree()
    for i in range(n):
        parent = int(torch.randint(-1, i, (1,), generator=gen)) if i else -1
        tree.add(int(torch.randint(0, vocab, (1,), generator=gen)), parent, 0.5)
    return tree


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_tree_pass_equals_each_path_run_alone(tiny_target, seed):
    prompt = torch.tensor([[3, 14, 15, 9, 26, 5]])
    tree = random_tree(12, 64, seed)
    cache = new_cache(tiny_target)
    forward(tiny_target, prompt[:, :-1], cache)
    past = prompt.shape[1] - 1
    ids, positions, mask = tree_inputs(tree, prompt[0, -1], past, tiny_target.dtype)
    logits = forward(tiny_target, ids, cache, position_ids=positions, mask=mask)
    alone = forward(tiny_target, prompt, new_cache(tiny_target))[-1]
    assert torch.allclose(logits[0], alone, atol=1e-9)
    for i in range(len(tree)):
        path = torch.tensor([[tree.tokens[j] for j in tree.path(i)]])
        alone = forward(tiny_target, torch.cat([prompt, path], dim=1), new_cache(tiny_target))[-1]
        assert torch.allclose(logits[i + 1], alone, atol=1e-9), f"node {i}"


@pytest.mark.parametrize("source", ["self", "layers:2"])
def test_after_a_round_the_cache_is_a_fresh_forward_over_the_kept_tokens(tiny_target, tiny_draft, source):
    draft = tiny_sources(tiny_target, tiny_draft)[source]()
    prompt = torch.tensor([PROMPTS[0]])
    dec = Decoder(
        tiny_target, draft, Sampling(), torch.Generator(), set(), Clock(prompt.device), TreeShape(12, 3)
    )
    draft.reset()
    cache = prefill(tiny_target, prompt, draft)
    seq, kept_any = prompt, False
    for _ in range(4):
        r = tree_round(dec, cache, seq, 4)
        kept = r.new_tokens[:-1]  # the emitted token is fed next round
        kept_any |= bool(kept)
        fresh = new_cache(tiny_target)
        forward(tiny_target, torch.cat([seq, torch.tensor([kept], dtype=torch.long)], dim=1), fresh)
        assert cache.get_seq_length() == fresh.get_seq_length() == seq.shape[1] + len(kept)
        for ours, theirs in zip(cache.layers, fresh.layers):
            assert torch.allclose(ours.keys, theirs.keys, atol=1e-9)
            assert torch.allclose(ours.values, theirs.values, atol=1e-9)
        seq = torch.cat([seq, torch.tensor([r.new_tokens])], dim=1)
    assert kept_any  # the accepted path was compacted at least once, not only cropped


P_ROOT = torch.tensor([0.05, 0.40, 0.10, 0.30, 0.15], dtype=torch.float64)
P_NODE = torch.tensor([0.30, 0.10, 0.20, 0.20, 0.20], dtype=torch.float64)


def two_tokens(gen: torch.Generator, wrong: bool = False) -> tuple[int, int | None]:
    """The first two tokens a tree round gives: root children 3, 1, 0 (best first), 3 has child 4."""
    tree = TokenTree()
    for token in (3, 1, 0):
        tree.add(token, -1, 0.3)
    tree.add(4, 0, 0.5)
    probs = torch.stack([P_ROOT, P_NODE, P_ROOT, P_ROOT, P_ROOT])  # rows: root, then each node
    if wrong:  # try each child against p itself, never removing refused mass: biased towards drafts
        for c in (0, 1, 2):
            if float(torch.rand(1, generator=gen)) < float(P_ROOT[tree.tokens[c]]):
                return tree.tokens[c], None
        return int(torch.multinomial(P_ROOT, 1, generator=gen)), None
    v = verify_tree(probs.log(), tree, probs, gen)
    out = [tree.tokens[i] for i in v.path] + [v.emitted]
    return out[0], out[1] if out[0] == 3 else None


def test_tree_sampling_follows_the_target_and_a_wrong_rule_is_caught():
    gen = torch.Generator().manual_seed(0)
    n = 20000
    first, second = np.zeros(5), np.zeros(5)
    for _ in range(n):
        a, b = two_tokens(gen)
        first[a] += 1
        if b is not None:
            second[b] += 1
    assert chi2_pvalue(first, P_ROOT.numpy()) > ALPHA
    assert chi2_pvalue(second, P_NODE.numpy()) > ALPHA  # after an accepted 3, its child's row
    wrong = np.zeros(5)
    for _ in range(n):
        wrong[two_tokens(gen, wrong=True)[0]] += 1
    assert chi2_pvalue(wrong, P_ROOT.numpy()) < ALPHA


def test_sampled_tree_runs_are_valid_traces(tiny_target, tiny_draft):
    ids = torch.tensor([PROMPTS[0]])
    for make in tiny_sources(tiny_target, tiny_draft).values():
        trace = speculative_generate(
            tiny_target,
            ids,
            make(),
            make_policy("fixed", 3),
            Sampling(temperature=0.8, top_p=0.95, seed=3),
            max_new_tokens=30,
            tree=TreeShape(10, 3),
        )
        validate(trace)
        assert len(trace.output.token_ids) == 30


def test_grow_tree_keeps_the_best_nodes_and_their_parents():
    def expand(tree, frontier):
        return [[(10 + j, q) for j, q in enumerate((0.6, 0.3, 0.1))] for _ in frontier]

    tree = grow_tree(expand, depth=3, shape=TreeShape(5, 2))
    assert len(tree) == 5
    assert all(p < i for i, p in enumerate(tree.parents))  # parents first
    assert sorted(tree.score, reverse=True) == pytest.approx([0.6, 0.36, 0.3, 0.216, 0.18])  # of 10 drafted
    assert tree.tokens[:2] == [10, 11] and tree.score[0] == 0.6
    stopped = grow_tree(expand, depth=3, shape=TreeShape(20, 2), stop_ids={10, 11})
    assert len(stopped) == 2  # nothing grows after a stop token


def test_tree_traces_round_trip_and_a_broken_tree_is_refused(tiny_target):
    ids = torch.tensor([PROMPTS[0]])
    trace = speculative_generate(
        tiny_target, ids, NGramDraft(), make_policy("fixed", 3), max_new_tokens=30, tree=TreeShape(6, 2)
    )
    again = Trace.from_json(trace.to_json())
    assert again.to_dict() == trace.to_dict()
    rnd = next(r for r in again.rounds if r.tree)
    assert rnd.checked == len(rnd.tree) + 1
    data = json.loads(trace.to_json())
    node = next(r for r in data["rounds"] if r["tree"])["tree"][0]
    node["parent"] = 5
    with pytest.raises(TraceError, match="tree node 0: its parent"):
        validate(Trace.from_dict(data))


@pytest.mark.parametrize(("nodes", "branch", "message"), [(65, 2, "1 to 64 nodes"), (8, 0, "branch factor")])
def test_a_tree_shape_out_of_range_is_refused(nodes, branch, message):
    with pytest.raises(SpecLensError, match=message):
        generate(RunConfig(prompt="hi", tree_nodes=nodes, branch=branch))


@pytest.mark.slow
def test_trees_are_lossless_on_smollm2(smol, specbench):
    for category, draft in (("summarization", "ngram"), ("math_reasoning", "head"), ("qa", "layers:8")):
        config = RunConfig(
            prompt=first_of(specbench, category)["prompt"], draft=draft, k=4, max_new_tokens=32, baseline=True
        )
        trace = generate(replace(config, tree_nodes=12, branch=3))
        assert trace.totals.identical_to_baseline, (category, draft)
        assert trace.meta.tree_nodes == 12 and all(r.tree is not None for r in trace.rounds)
        validate(trace)


def test_a_tree_round_is_drawn_explained_and_labelled(tiny_target):
    ids = torch.tensor([PROMPTS[0]])
    draft = ModelDraft(tiny_target, 64, "self")  # always right: every round keeps a path
    trace = speculative_generate(
        tiny_target, ids, draft, make_policy("fixed", 3), max_new_tokens=20, tree=TreeShape(7, 2)
    )
    rnd = trace.rounds[0]
    fig = tree_figure(rnd, 0)
    names = {d.name for d in fig.data if d.name}
    assert {"accepted path", "tried, refused", "never tried", "last verified"} <= names
    drawn = sum(len(d.x) for d in fig.data if d.name in ("accepted path", "tried, refused", "never tried"))
    assert drawn == len(rnd.tree) and "3 kept" in fig.layout.title.text
    # Each node as large as the draft was sure of it: q = 1 the largest, a long shot the smallest.
    sizes = sorted(size for d in fig.data if d.name in STATE_NAMES.values() for size in d.marker.size)
    assert sizes == sorted(7 + 18 * node.q for node in rnd.tree) and sizes[0] < sizes[-1]
    assert explain_round(rnd, 0).startswith("Round 1: the draft proposed a tree of 7 tokens, up to 3 deep")
    html = timeline_html(trace)
    assert html.count('data-tree-nodes="7"') == sum(1 for r in trace.rounds if r.tree and len(r.tree) == 7)
    assert "tree of 7" in html
    chain = speculative_generate(tiny_target, ids, NGramDraft(), make_policy("fixed", 3), max_new_tokens=5)
    assert "chain, not a tree" in tree_figure(chain.rounds[0]).layout.annotations[0].text
    rnd.source = "head"  # a hybrid draft's round: the chart and the sentence name the source
    assert "by head, 3 kept" in tree_figure(rnd, 0).layout.title.text.replace("<br>", " ")
    assert explain_round(rnd, 0).startswith("Round 1: the draft (head) proposed a tree of 7 tokens")


def test_refused_branches_are_explained(tiny_target, tiny_draft):
    ids = torch.tensor([PROMPTS[0]])
    trace = speculative_generate(
        tiny_target,
        ids,
        ModelDraft(tiny_draft, 64, "d"),
        make_policy("fixed", 3),
        max_new_tokens=30,
        tree=TreeShape(8, 2),
    )
    turned = [(i, r) for i, r in enumerate(trace.rounds) if r.emitted and r.emitted.kind == "correction"]
    assert turned
    i, rnd = turned[0]
    sentence = explain_round(rnd, i)
    assert "and refused" in sentence and "its own top choice was" in sentence


def test_the_tree_cost_model_reduces_to_the_chain_and_grows_with_the_tree():
    for alpha in (0.3, 0.7, 0.95):
        assert costmodel.expected_tokens_tree([alpha], 5, 5) == pytest.approx(
            costmodel.expected_tokens(alpha, 5)
        )
    ranks = costmodel.rank_acceptance(0.6, 0.2, 3)
    assert ranks[:2] == [0.6, 0.2] and sum(ranks) <= 1
    assert (
        costmodel.rank_acceptance(0.7, 0.6, 3)[0] == 0.7 and sum(costmodel.rank_acceptance(0.7, 0.6, 3)) <= 1
    )
    sizes = [costmodel.expected_tokens_tree(ranks, 4, n) for n in (1, 4, 8, 16, 64)]
    assert sizes == sorted(sizes) and sizes[-1] <= 5  # never more than depth + 1
    # With four nodes the best tree already trades the chain's last node (0.6⁴) for a second choice (0.2).
    assert costmodel.expected_tokens_tree(ranks, 4, 4) == pytest.approx(1 + 0.6 + 0.36 + 0.216 + 0.2)
    # A second candidate worth having beats the chain of the same depth with the same node budget.
    assert costmodel.expected_tokens_tree(ranks, 4, 8) > costmodel.expected_tokens(0.6, 4)


def test_the_theory_tab_draws_the_best_tree_against_its_size():
    fig, text = run_tree_theory(0.6, 0.2, 3, 4, 0.05, 0.1)
    names = [d.name for d in fig.data]
    assert names == ["tokens per round (tree)", "tokens per round (chain of 4)", "speedup (tree)"]
    assert "fastest at **N =" in text and "against 2.31 for the chain of 4" in text
