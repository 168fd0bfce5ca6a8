"""Where the kernel cannot build: the output layer packed once for oneDNN, the same for both loops."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from decoding.core.plain import autoregressive_generate
from decoding.core.speculative import speculative_generate
from decoding.drafts import LayerDraft, NGramDraft
from decoding.runtime.forward import forward, new_cache
from decoding.runtime.packed import PackedLinear, pack_output_layer
from decoding.settings.policies import make_policy


def tiny_packed(seed: int = 0):
    model = tiny_llama(seed=seed, init=0.3).to(torch.float32)
    assert pack_output_layer(model)
    return model


def test_packed_output_layer_computes_what_the_linear_did():
    plain = tiny_llama(seed=0).to(torch.float32)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    before = forward(plain, ids, new_cache(plain))
    assert pack_output_layer(plain)
    assert isinstance(plain.get_output_embeddings(), PackedLinear)
    after = forward(plain, ids, new_cache(plain))
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-4)


def test_only_float32_cpu_models_are_packed(monkeypatch):
    assert not pack_output_layer(tiny_llama(seed=0))  # float64
    monkeypatch.setenv("SPECLENS_PACK", "0")
    assert not pack_output_layer(tiny_llama(seed=0).to(torch.float32))


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_stays_lossless_on_the_packed_path(seed):
    assert_chain_drafts_lossless(tiny_packed(seed))


def assert_chain_drafts_lossless(target) -> None:
    """Greedy with n-gram and layer drafts, k = 1..8: every output is plain decoding's."""
    prompt = torch.tensor([[1, 5, 9, 3, 7, 5, 9, 3]])
    plain = autoregressive_generate(target, prompt, max_new_tokens=48).token_ids
    for draft in (NGramDraft(), LayerDraft(target, 2, 64)):
        for k in range(1, 9):
            trace = speculative_generate(target, prompt, draft, make_policy("fixed", k), max_new_tokens=48)
            assert trace.output.token_ids == plain, (draft.name, k)
