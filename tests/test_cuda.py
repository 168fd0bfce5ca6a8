"""The decoder on a CUDA device: greedy chains and trees lossless, sampling and bfloat16 runs that
hold together, and the same with each step replayed from a CUDA graph over a static cache
(decoding/runtime/static.py). Skipped where there is no CUDA (scripts/device-check.sh runs them
where there is)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama, tiny_model_folder
from test_heads import random_head

from decoding.api import RunConfig, generate, prepare
from decoding.core.batch import BatchSettings, batch_generate
from decoding.core.graphs import use_batch_graphs, use_graphs
from decoding.core.plain import autoregressive_generate
from decoding.core.speculative import speculative_generate
from decoding.core.tree import TreeShape
from decoding.drafts import HeadDraft, LayerDraft, ModelDraft, NGramDraft
from decoding.models import load_model
from decoding.runtime.static import drop_static, runner_of
from decoding.settings.policies import make_policy
from decoding.settings.sampling import Sampling
from decoding.tools.probe import probe
from decoding.trace import validate

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROMPT = [1, 5, 9, 3, 7, 5, 9]


@pytest.fixture(scope="module")
def pair():
    # float64 on the GPU too, so a k-token pass and a one-token pass cannot round a near-tie apart.
    return tiny_llama(seed=0).to("cuda"), tiny_llama(seed=1, layers=2).to("cuda")


def drafts(target, draft):
    return {
        "ngram": NGramDraft(),
        "layers:2": LayerDraft(target, 2, 64),
        "model": ModelDraft(draft, 64, "tiny-draft"),
    }


def test_greedy_chains_are_lossless_on_cuda(pair):
    target, draft = pair
    ids = torch.tensor([PROMPT], device="cuda")
    expected = autoregressive_generate(target, ids, max_new_tokens=40).token_ids
    for name, d in drafts(target, draft).items():
        for k in (1, 3, 6):
            trace = speculative_generate(target, ids, d, make_policy("fixed", k), max_new_tokens=40)
            assert trace.output.token_ids == expected, f"{name} k={k}"
            validate(trace)


def test_greedy_trees_are_lossless_on_cuda(pair):
    target, draft = pair
    ids = torch.tensor([PROMPT], device="cuda")
    expected = autoregressive_generate(target, ids, max_new_tokens=30).token_ids
    for name, d in drafts(target, draft).items():
        trace = speculative_generate(
            target, ids, d, make_policy("fixed", 3), max_new_tokens=30, tree=TreeShape(8, 2)
        )
        assert trace.output.token_ids == expected, name
        assert any(r.tree for r in trace.rounds), name
        validate(trace)


def test_sampling_on_cuda_keeps_the_trace_consistent(pair):
    target, draft = pair
    ids = torch.tensor([PROMPT], device="cuda")
    sampling = Sampling(temperature=0.8, top_p=0.9, seed=3)
    for d in drafts(target, draft).values():
        trace = speculative_generate(target, ids, d, make_policy("fixed", 4), sampling, max_new_tokens=30)
        assert len(trace.output.token_ids) == 30
        validate(trace)


def test_a_bfloat16_run_through_the_api(tmp_path):
    folder = tiny_model_folder(tmp_path / "tiny")
    config = RunConfig(
        target=str(folder),
        draft=str(folder),
        k=3,
        prompt="a b c a b c a b",
        chat=False,
        max_new_tokens=16,
        baseline=True,
        device="cuda",
        dtype="bfloat16",
    )
    trace = generate(config)
    validate(trace)
    assert trace.meta.device.startswith("cuda") and trace.meta.dtype == "bfloat16"
    assert trace.baseline is not None and 0 < trace.totals.new_tokens <= 16


def graph_drafts(target, draft) -> dict:
    """Every draft source the graphs serve: the target's own steps (n-gram), a separate model,
    `layers:N` (their own graphs) and the head (the target's replayed pass feeds its features)."""
    head = random_head(target, list(range(0, 64, 2)))
    return {**drafts(target, draft), "head": HeadDraft(head, target, "h")}


def graphs_on(target, d, k: int, tree: TreeShape | None = None) -> None:
    assert use_graphs(target, d, len(PROMPT) + 40, k, tree)
    d.reset()


@pytest.fixture
def fresh_pair():
    # Models of their own: the static buffers and graphs are a model's.
    target, draft = tiny_llama(seed=0).to("cuda"), tiny_llama(seed=1, layers=2).to("cuda")
    yield target, draft
    drop_static(target)
    drop_static(draft)


def test_graph_replayed_greedy_chains_and_trees_are_lossless(fresh_pair):
    target, draft = fresh_pair
    ids = torch.tensor([PROMPT], device="cuda")
    expected = autoregressive_generate(target, ids, max_new_tokens=40).token_ids
    for name, d in graph_drafts(target, draft).items():
        for k, tree in ((1, None), (4, None), (3, TreeShape(8, 2))):
            graphs_on(target, d, k, tree)
            before = runner_of(target).replays
            assert autoregressive_generate(target, ids, max_new_tokens=40).token_ids == expected
            trace = speculative_generate(
                target, ids, d, make_policy("fixed", k), max_new_tokens=40, tree=tree
            )
            assert trace.output.token_ids == expected, f"{name} k={k} {tree}"
            validate(trace)
            assert runner_of(target).replays > before + 40, name  # the steps were replays
        if isinstance(d, ModelDraft):
            assert runner_of(d.model).replays > 0, name


def test_graph_replayed_batches_are_lossless(fresh_pair):
    """A batch of 3 over static slots, each pass one replayed graph: every sequence gives its own
    plain run's tokens, plainly, with n-gram chains and with the head (its features split back)."""
    target, _ = fresh_pair
    draw = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (1, n), generator=draw).cuda() for n in (5, 9, 3, 12, 7)]
    expected = [autoregressive_generate(target, p, max_new_tokens=30).token_ids for p in prompts]
    head = HeadDraft(random_head(target, list(range(0, 64, 2))), target, "h")
    for draft in (None, NGramDraft(), head):
        assert use_batch_graphs(target, 3, 12 + 30, 3 if draft else 0, None)
        before = runner_of(target).replays
        policy = (lambda: make_policy("fixed", 3)) if draft else None
        run = batch_generate(target, prompts, BatchSettings(3, max_new_tokens=30), draft, policy)
        assert run.outputs == expected, draft
        assert runner_of(target).replays - before == len(run.passes)  # every pass a replay


def test_graph_replayed_sampling_draws_what_the_models_forward_draws(fresh_pair):
    target, draft = fresh_pair
    ids = torch.tensor([PROMPT], device="cuda")
    sampling = Sampling(temperature=0.8, top_p=0.9, seed=3)
    for name, tree in (("model", None), ("layers:2", TreeShape(8, 2))):
        runs = []
        for on in (False, True):
            d = graph_drafts(target, draft)[name]
            if on:
                graphs_on(target, d, 4, tree)
            trace = speculative_generate(
                target, ids, d, make_policy("fixed", 4), sampling, max_new_tokens=30, tree=tree
            )
            runs.append(([r.n_accepted for r in trace.rounds], trace.output.token_ids))
            drop_static(target)
            drop_static(d.model)
        assert runs[0] == runs[1], name


def test_a_run_and_the_probe_say_whether_graphs_were_used(tmp_path):
    folder = tiny_model_folder(tmp_path / "tiny")
    other = tiny_model_folder(tmp_path / "draft", seed=1)
    config = RunConfig(target=str(folder), draft=str(other), prompt="a b c a b", chat=False, device="cuda")
    run = prepare(config)
    assert runner_of(run.target.model).captured and runner_of(run.draft.model).captured  # before any run
    target = load_model(str(folder), "cuda", None)
    assert probe(target, rows=(1, 2))["graphs"] is True
    assert probe(target, rows=(1, 2), graphs=False)["graphs"] is False
    prepare(RunConfig(**{**config.__dict__, "graphs": False}))
    assert runner_of(run.target.model) is None
