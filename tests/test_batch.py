"""Batched decoding: several sequences in one target pass, each as if alone."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from decoding.runtime import llama, rowlinear
from decoding.runtime.forward import forward, forward_batch, new_cache
from decoding.runtime.rowlinear import use_row_kernel

needs_kernel = pytest.mark.skipif(rowlinear.library() is None, reason="the kernel did not build here")


def _kernel_llama(seed: int) -> torch.nn.Module:
    model = tiny_llama(seed=seed).to(torch.float32)
    assert use_row_kernel(model) and llama.use_layer_kernel(model)
    return model


def _same(a: torch.Tensor, b: torch.Tensor, exact: bool) -> bool:
    return torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-12, atol=1e-12)


# The kernel computes each row on its own, in a fixed order: bit for bit. torch's float64
# products (the module path) sum in an order that depends on the row count: to rounding.
MODELS = [
    pytest.param(lambda: tiny_llama(seed=3), False, id="modules"),
    pytest.param(lambda: _kernel_llama(3), True, marks=needs_kernel, id="kernel"),
]


@pytest.mark.parametrize("make,exact", MODELS)
def test_a_batched_pass_gives_each_sequence_what_it_gets_alone(make, exact):
    """Sequences of different cached lengths, checking 1 to 5 rows each: every row's logits, and
    every cache afterwards, are those of the same pass over that sequence alone."""
    model = make()
    torch.manual_seed(0)
    prompts = [torch.randint(0, 64, (1, n)) for n in (7, 300, 2, 40)]
    alone, together = [new_cache(model) for _ in prompts], [new_cache(model) for _ in prompts]
    for p, a, t in zip(prompts, alone, together, strict=True):
        forward(model, p, a)
        forward(model, p, t)
    for sizes in ((1, 1, 1, 1), (5, 1, 3, 2), (1, 4, 1, 5)):
        ids = [torch.randint(0, 64, (1, n)) for n in sizes]
        batched = forward_batch(model, ids, together)
        for i, a, b in zip(ids, alone, batched, strict=True):
            assert _same(forward(model, i, a), b, exact)
    for a, t in zip(alone, together, strict=True):
        assert a.get_seq_length() == t.get_seq_length()
        for la, lt in zip(a.layers, t.layers, strict=True):
            assert _same(la.keys, lt.keys, exact) and _same(la.values, lt.values, exact)
