"""The default CPU mode: SpecLens's linear kernel and its lean Llama pass, each exactly what it replaces."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import PROMPTS, tiny_llama
from test_packed import assert_chain_drafts_lossless
from transformers import DynamicCache

from decoding.core.tree import additive
from decoding.drafts.layers import cut_layers
from decoding.runtime import llama, rowlinear
from decoding.runtime.forward import crop, forward, new_cache
from decoding.runtime.rowlinear import RowLinear, pack_panels, row_linear, use_row_kernel

needs_kernel = pytest.mark.skipif(rowlinear.library() is None, reason="the kernel did not build here")


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 9, 13, 17])
@pytest.mark.parametrize(("inputs", "outputs"), [(32, 5), (576, 192), (64, 37)])
def test_the_kernel_computes_a_linear_layer(rows, inputs, outputs):
    torch.manual_seed(rows)
    x, w, b = torch.randn(2, rows, inputs), torch.randn(outputs, inputs), torch.randn(outputs)
    torch.testing.assert_close(row_linear(x, w), F.linear(x, w), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(row_linear(x, w, b), F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    strided = x.transpose(0, 1)  # not contiguous: copied first
    torch.testing.assert_close(row_linear(strided, w), F.linear(strided, w), atol=1e-4, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 6, 9])
def test_float16_weights_give_the_float32_products_bits(rows):
    """A float16 weight is widened exactly as it loads: every value float16 holds (subnormals,
    zeros, the largest) gives the float32 product of the same values, bit for bit."""
    torch.manual_seed(rows)
    w = torch.randn(37, 576).half()
    every_half = torch.arange(0, 2**16 - 2**10, dtype=torch.int32).to(torch.int16).view(torch.float16)
    finite = every_half[every_half.isfinite()]
    w.view(-1)[: finite.numel()] = finite[torch.randperm(finite.numel())][: w.numel()]
    w[0, :8] = torch.tensor([0.0, -0.0, 2**-24, -(2**-24), 2**-14, 65504, -65504, 2**-20])
    x, b = torch.randn(rows, 576) * 1e-3, torch.randn(37)
    assert torch.equal(row_linear(x, w, b), row_linear(x, w.float(), b))
    assert torch.equal(row_linear(x, w), row_linear(x, w.float()))


@needs_kernel
def test_a_rows_result_does_not_depend_on_its_batch_or_on_the_other_weight_rows():
    """Bit for bit: one token alone or among 16, and a slice of a fused weight, give the same sums."""
    torch.manual_seed(0)
    x, w = torch.randn(17, 576), torch.randn(1536, 576)
    full = row_linear(x, w)
    for rows in (1, 2, 5, 9):
        assert torch.equal(row_linear(x[:rows], w), full[:rows])
        assert torch.equal(row_linear(x[rows : rows + 1], w), full[rows : rows + 1])
    assert torch.equal(row_linear(x, w[576:1152]), full[:, 576:1152])
    assert torch.equal(row_linear(x, w[3:8]), full[:, 3:8])  # a block of 4 rows, then a lone one


@needs_kernel
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 17, 25, 60])
@pytest.mark.parametrize(("inputs", "outputs"), [(32, 16), (80, 112), (576, 192), (1536, 576)])
def test_the_panels_compute_a_linear_layer_and_a_rows_bits_do_not_depend_on_its_batch(rows, inputs, outputs):
    """Through the packed copy: rows in several tiles and groups of tiles, K in partial chunks, a
    partial last panel; each row alone and each slice of the weight (a fused q/k/v's parts) give the same bits."""
    torch.manual_seed(rows)
    x, w, b = torch.randn(rows, inputs), torch.randn(outputs, inputs), torch.randn(outputs)
    panels = pack_panels(w)
    full = row_linear(x, w, b, panels)
    torch.testing.assert_close(full, F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    for r in range(rows):
        assert torch.equal(row_linear(x[r : r + 1], w, b, panels), full[r : r + 1])
    part = slice(outputs // 2 - outputs // 2 % 16, outputs)
    assert torch.equal(row_linear(x, w[part], b[part], pack_panels(w[part])), full[:, part])


@needs_kernel
@pytest.mark.parametrize("threads", [1, 3, 5])
def test_the_panels_give_the_same_bits_whatever_the_threads_that_share_them(threads):
    """Each thread takes its own panels, then others' from the back: any count of threads, more
    threads than panels included, computes every panel once and the same bits."""
    torch.manual_seed(threads)
    x, w = torch.randn(5, 576), torch.randn(1536 + 64, 576)
    shapes = [(w, pack_panels(w)), (w[:48], pack_panels(w[:48]))]  # 25 panels; 1 panel
    want = [row_linear(x, weight, None, panels) for weight, panels in shapes]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = [row_linear(x, weight, None, panels) for weight, panels in shapes for _ in range(3)]
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(g, want[i // 3]) for i, g in enumerate(got))


@needs_kernel
def test_a_weight_whose_rows_fill_no_vector_keeps_its_own_layout():
    w = torch.randn(37, 32)
    assert pack_panels(w) is None
    layer = RowLinear(torch.nn.Linear(32, 37))
    x = torch.randn(3, 32)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


@needs_kernel
def test_only_float32_linears_the_kernel_can_run_are_swapped():
    model = tiny_llama(seed=0)  # float64: nothing to swap
    assert not use_row_kernel(model)
    model = model.to(torch.float32)
    assert use_row_kernel(model)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear | RowLinear)]
    assert linears and all(isinstance(m, RowLinear) for m in linears)
    assert model.lm_head.weight is model.get_output_embeddings().weight


def test_without_the_kernel_models_keep_their_linear_layers(monkeypatch):
    monkeypatch.setenv("SPECLENS_KERNEL", "0")
    rowlinear.library.cache_clear()
    try:
        assert rowlinear.library() is None
        assert not use_row_kernel(tiny_llama(seed=0).to(torch.float32))
    finally:
        monkeypatch.undo()
        rowlinear.library.cache_clear()


def _hf_logits(model, ids, cache, **kwargs):
    with torch.inference_mode():
        return model(input_ids=ids, cache=cache, use_cache=True, **kwargs).logits[0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_lean_pass_computes_what_the_models_own_forward_does(dtype):
    """Prompt, one token, five tokens after a cached past, a cache grown past its first block: same bits."""
    model = tiny_llama(seed=0).to(dtype)
    if dtype == torch.float32 and use_row_kernel(model):
        llama.use_layer_kernel(model)  # as the default mode loads it
        assert model.model.layers[0].self_attn.qkv_proj.weight.shape == (32 + 2 * 16, 32)
    theirs, ours = DynamicCache(config=model.config), new_cache(model)
    assert isinstance(ours, llama.StepCache)
    torch.manual_seed(0)
    for n in (300, 1, 5, 2, 1):
        ids = torch.randint(0, 64, (1, n))
        assert torch.equal(forward(model, ids, ours), _hf_logits(model, ids, theirs))
    assert ours.get_seq_length() == theirs.get_seq_length() == 309
    crop(ours, 250)
    crop(theirs, 250)
    ids = torch.tensor([[7, 8, 9]])
    assert torch.equal(forward(model, ids, ours, keep=2), _hf_logits(model, ids, theirs)[-2:])


def _kernel_llama(seed: int, hidden: int = 32) -> torch.nn.Module:
    """A float32 tiny Llama in the default CPU mode: the linear kernel and the layer kernel."""
    model = tiny_llama(seed=seed, hidden=hidden).to(torch.float32)
    assert use_row_kernel(model) and llama.use_layer_kernel(model)
    return model


def _tiny_models() -> list:
    # The layer kernel twice: heads of 8 (its scalar dot product) and of 32 (its vector one).
    kernel = [
        pytest.param(lambda h=h: _kernel_llama(3, h), marks=needs_kernel, id=f"kernel{h}") for h in (32, 128)
    ]
    return [pytest.param(lambda: tiny_llama(seed=3), id="modules"), *kernel]


@pytest.mark.parametrize("make", _tiny_models())
def test_the_lean_pass_takes_a_trees_positions_and_mask(make):
    model = make()
    theirs, ours = DynamicCache(config=model.config), new_cache(model)
    prompt = torch.tensor([[1, 2, 3, 4, 5, 6]])
    forward(model, prompt, ours)
    _hf_logits(model, prompt, theirs)
    # A root and two children at depth 1, one grandchild under the first.
    ids = torch.tensor([[10, 11, 12, 13]])
    positions = torch.tensor([[6, 7, 7, 8]])
    allowed = torch.ones(4, 10, dtype=torch.bool)
    allowed[:, 6:] = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    mask = additive(allowed, model.dtype)[None, None]
    got = forward(model, ids, ours, position_ids=positions, mask=mask)
    want = _hf_logits(model, ids, theirs, position_ids=positions, attention_mask=mask)
    assert torch.equal(got, want)


@pytest.mark.parametrize("make", _tiny_models())
def test_layer_hooks_see_each_layers_input_in_the_lean_pass(make):
    """In a prompt and in the steps after it (where the kernel runs the layers between hooked
    ones in one call), a hooked layer sees the input the model's own forward gives it."""
    model = make()
    seen: dict[int, list[torch.Tensor]] = {0: [], 2: []}
    for i in seen:
        model.model.layers[i].register_forward_pre_hook(
            lambda module, args, kwargs, i=i: seen[i].append(args[0][0].clone()), with_kwargs=True
        )
    steps = [torch.tensor([[1, 2, 3]]), torch.tensor([[4]]), torch.tensor([[5, 6]])]
    cache = new_cache(model)
    for ids in steps:
        forward(model, ids, cache)
    lean = {i: seen[i][:] for i in seen}
    torch.testing.assert_close(lean[0][0], model.model.embed_tokens(steps[0][0]))
    for inputs in seen.values():
        inputs.clear()
    theirs = DynamicCache(config=model.config)
    for ids in steps:
        _hf_logits(model, ids, theirs)
    for i in seen:
        assert len(lean[i]) == len(seen[i]) == 3
        assert all(torch.equal(a, b) for a, b in zip(lean[i], seen[i], strict=True))


@needs_kernel
def test_a_self_draft_cut_from_the_target_runs_the_layer_kernel_over_its_own_layers(monkeypatch):
    """`layers:N` shares the target's first layers: its steps take the layer kernel over those N
    only, and give the bits its own forward does."""
    cut = cut_layers(_kernel_llama(seed=2), 2)
    stacks: list[int] = []
    original = llama._kernel_stack
    monkeypatch.setattr(
        llama, "_kernel_stack", lambda inner: stacks.append(len(inner.layers)) or original(inner)
    )
    ours, theirs = new_cache(cut), DynamicCache(config=cut.config)
    for ids in (torch.tensor([[1, 2, 3]]), torch.tensor([[4]]), torch.tensor([[5, 6, 7]])):
        assert torch.equal(forward(cut, ids, ours), _hf_logits(cut, ids, theirs))
    assert stacks == [2, 2]  # the two steps after the prompt


@needs_kernel
@pytest.mark.parametrize("hidden", [32, 128])
def test_the_layer_kernel_gives_a_token_the_same_bits_alone_and_checked_with_others(hidden):
    """A token's logits after a cached past: alone, first of a 5-token check, in a tree beside a sibling."""
    model = _kernel_llama(seed=1, hidden=hidden)
    cache = new_cache(model)
    forward(model, torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(0)), cache)
    alone = forward(model, torch.tensor([[5]]), cache)
    crop(cache, 40)
    checked = forward(model, torch.tensor([[5, 6, 7, 8, 9]]), cache)
    crop(cache, 40)
    # Nine siblings at the same depth: 49 keys, so the kernel scores keys 32-47 sixteen at a
    # time here and one at a time alone, which must give the same bits.
    allowed = torch.ones(9, 49, dtype=torch.bool)
    allowed[:, 40:] = torch.eye(9, dtype=torch.bool)
    sibling = forward(
        model, torch.tensor([[9, 5, *range(10, 17)]]), cache, position_ids=torch.full((1, 9), 40),
        mask=additive(allowed, torch.float32)[None, None],
    )  # fmt: skip
    assert torch.equal(alone[0], checked[0]) and torch.equal(alone[0], sibling[1])
    assert not torch.equal(alone[0], checked[1])


@needs_kernel
def test_the_layer_kernel_follows_its_cache_as_it_grows():
    """Checks that carry the cache past its first block (256 tokens): the kernel finds each
    layer's new buffers and gives the bits the model's own forward does."""
    model = _kernel_llama(seed=4)
    ours, theirs = new_cache(model), DynamicCache(config=model.config)
    generator = torch.Generator().manual_seed(0)
    buffers = set()
    while ours.get_seq_length() < 500:  # a 3-token prompt, then checks of 17
        ids = torch.randint(0, 64, (1, 17 if buffers else 3), generator=generator)
        assert torch.equal(forward(model, ids, ours), _hf_logits(model, ids, theirs))
        buffers.add(ours.layers[-1].k.data_ptr())
    assert len(buffers) == 2  # the prompt's, then one grown by a check


@needs_kernel
def test_the_layer_kernel_swaps_the_models_own_modules_for_its_functions():
    model = _kernel_llama(seed=0)
    layer = model.model.layers[0]
    assert model.config._attn_implementation == llama.KERNEL_ATTENTION
    assert isinstance(layer.input_layernorm, llama.KernelRMSNorm) and isinstance(
        model.model.norm, llama.KernelRMSNorm
    )
    x = torch.randn(3, 32)
    reference = tiny_llama(seed=0).to(torch.float32).model.layers[0]
    torch.testing.assert_close(layer.input_layernorm(x), reference.input_layernorm(x))
    wide = torch.cat([torch.linspace(-120, 120, 2401), torch.randn(999)])  # past both ends of its exp
    torch.testing.assert_close(layer.mlp.act_fn(wide), F.silu(wide))


@needs_kernel
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_stays_lossless_on_the_kernel_path(seed):
    target = tiny_llama(seed=seed, init=0.3).to(torch.float32)
    assert use_row_kernel(target)
    llama.use_layer_kernel(target)
    assert_chain_drafts_lossless(target)


@pytest.mark.slow
def test_the_default_cpu_mode_is_the_kernel_and_the_lean_pass(smol):
    assert smol.row_kernel == (rowlinear.library() is not None)
    if smol.row_kernel:
        assert isinstance(smol.model.model.layers[0].mlp.down_proj, RowLinear)
        assert isinstance(smol.model.get_output_embeddings(), RowLinear)
    assert isinstance(new_cache(smol.model), llama.StepCache)
    # Same bits as the model's own forward over a real prompt and a five-token check.
    ids = smol.tokenizer(PROMPTS.read_text().splitlines()[0][:400], return_tensors="pt").input_ids
    theirs, ours = DynamicCache(config=smol.model.config), new_cache(smol.model)
    assert torch.equal(forward(smol.model, ids, ours, keep=1), _hf_logits(smol.model, ids, theirs)[-1:])
    check = torch.tensor([[28, 253, 1029, 3, 17]])
    assert torch.equal(forward(smol.model, check, ours), _hf_logits(smol.model, check, theirs))
    step = torch.tensor([[1, 2, 3, 4, 5]])
    assert torch.equal(forward(smol.model, step, ours), _hf_logits(smol.model, step, theirs))


@pytest.mark.skipif(
    os.environ.get("SPECLENS_KERNEL_BUILD") == "portable", reason="already the portable build"
)
def test_the_portable_build_keeps_every_equality():
    """The kernel's bit-for-bit tests, rerun with the portable build forced: what an ARM laptop or an
    x86 without AVX2/FMA/F16C compiles (the compiler's generic vectors, no intrinsics)."""
    env = os.environ | {"SPECLENS_KERNEL_BUILD": "portable"}
    tests = [
        "test_the_kernel_computes_a_linear_layer",
        "test_float16_weights_give_the_float32_products_bits",
        "test_a_rows_result_does_not_depend_on_its_batch_or_on_the_other_weight_rows",
        "test_the_layer_kernel_gives_a_token_the_same_bits_alone_and_checked_with_others",
        "test_greedy_stays_lossless_on_the_kernel_path[0]",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *(f"{__file__}::{t}" for t in tests)],
        env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
