"""The decoder on a CUDA device: greedy chains and trees lossless, sampling and bfloat16 runs that
hold together. Skipped where there is no CUDA (scripts/device-check.sh runs them where there is)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama, tiny_model_folder

from decoding.api import RunConfig, generate
from decoding.core.plain import autoregressive_generate
from decoding.core.speculative import speculative_generate
from decoding.core.tree import TreeShape
from decoding.drafts import LayerDraft, ModelDraft, NGramDraft
from decoding.settings.policies import make_policy
from decoding.settings.sampling import Sampling
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
