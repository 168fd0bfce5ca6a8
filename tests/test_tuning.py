"""The kernel's measured choices: any of them gives the defaults' bits; the cache follows the kernel."""

from __future__ import annotations

import copy
import json
import time
import warnings

import pytest
import torch
from conftest import tiny_llama
from test_packed import assert_chain_drafts_lossless
from test_rowlinear import needs_kernel

from decoding.runtime import llama, rowlinear, tuning
from decoding.runtime.rowlinear import KERNEL_FILES, kernel_choices, kernel_file, row_linear, use_row_kernel

pytestmark = needs_kernel
EXTREMES = [
    {"prefetch_weight_rows_ahead": 0, "panel_chunk_steps": 1, "panel_prefetch_chunks_ahead": 0,
     "threads_per_product": 1},
    {"prefetch_weight_rows_ahead": 64, "panel_chunk_steps": 1000, "panel_prefetch_chunks_ahead": 9,
     "panel_prefetch_one_tile": 1, "threads_per_product": 64},  # more threads than there are: all
]  # fmt: skip


@pytest.fixture
def lib():
    """The loaded kernel, its tuned choices put back afterwards."""
    lib = rowlinear.library()
    before = {name: kernel_choices()[name] for name in tuning.TUNED}
    yield lib
    tuning.apply(lib, before)


def products() -> list[torch.Tensor]:
    """Products through the panels and through the weights' rows, in one tile and in several."""
    torch.manual_seed(0)
    x, w, b = torch.randn(17, 576), torch.randn(1536, 576), torch.randn(1536)
    panels = rowlinear.pack_panels(w)
    odd = torch.randn(37, 80)  # no panels: linear_rows
    return [
        *(row_linear(x[:n], w, b, panels) for n in (1, 5, 6, 9, 17)),
        *(row_linear(x[:n, :80], odd) for n in (1, 5, 9)),
    ]


@pytest.mark.parametrize(
    "choices",
    tuning.PANEL_CANDIDATES + tuning.ROW_CANDIDATES + [{"threads_per_product": 1}] + EXTREMES,
    ids=lambda c: ",".join(map(str, c.values())),
)
def test_every_choice_gives_the_defaults_bits(lib, choices):
    tuning.apply(lib, tuning.DEFAULTS)
    want = products()
    tuning.apply(lib, choices)
    assert {n: kernel_choices()[n] for n in choices} == choices
    assert all(torch.equal(g, w) for g, w in zip(products(), want, strict=True))


@pytest.mark.parametrize("choices", EXTREMES)
def test_greedy_stays_lossless_whatever_the_choices(lib, choices):
    tuning.apply(lib, choices)
    target = tiny_llama(seed=0, init=0.3).to(torch.float32)
    assert use_row_kernel(target) and llama.use_layer_kernel(target)
    assert_chain_drafts_lossless(target)


def test_choices_are_measured_once_per_kernel_and_machine_then_read_back(lib, tmp_path):
    kernel = tmp_path / "rowlinear-native-0123456789abcdef.so"
    assert tuning.tune(lib, kernel) == "measured"
    saved = json.loads(kernel.with_suffix(".tuning.json").read_text())
    assert saved["kernel"] == kernel.name and saved["machine"] == tuning.machine_key()
    assert set(saved["choices"]) == set(tuning.TUNED)
    assert tuning.tune(lib, kernel) == "cached"
    assert {n: kernel_choices()[n] for n in tuning.TUNED} == saved["choices"]
    # A file left by another kernel (or another machine) is not this one's: measured again.
    kernel.with_suffix(".tuning.json").write_text(json.dumps(saved | {"kernel": "rowlinear-native-old.so"}))
    assert tuning.tune(lib, kernel) == "measured"


def test_a_winning_candidate_comes_back_as_a_copy_so_the_candidate_lists_stay_as_written(lib):
    # A pass that is twice as fast with one choice: it wins, and what tune() merges into it must
    # not reach the list (pytest names this file's tests by those lists, alike in every worker).
    def one_pass(rows: int) -> None:
        time.sleep(0.002 if kernel_choices()["prefetch_weight_rows_ahead"] == 16 else 0.004)

    written = copy.deepcopy(tuning.ROW_CANDIDATES)
    best = tuning.fastest(lib, tuning.ROW_CANDIDATES, one_pass, (1, 3))
    assert best == {"prefetch_weight_rows_ahead": 16}
    best |= {"threads_per_product": 1}
    assert written == tuning.ROW_CANDIDATES


def test_a_new_kernel_source_gets_a_new_file_and_so_a_new_tuning():
    sources = b"".join(p.read_bytes() for p in KERNEL_FILES)
    assert kernel_file("native", sources) == kernel_file("native", sources)
    assert kernel_file("native", sources + b"// changed") != kernel_file("native", sources)
    assert kernel_file("portable", sources) != kernel_file("native", sources)


def test_a_broken_tuning_file_is_ignored_with_one_warning(lib, tmp_path):
    kernel = tmp_path / "rowlinear-native-fedcba9876543210.so"
    kernel.with_suffix(".tuning.json").write_text('{"kernel": "rowlinear-native-fedc')
    with pytest.warns(UserWarning, match="broken kernel tuning file") as caught:
        assert tuning.tune(lib, kernel) == "measured"
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning.tune(lib, kernel) == "cached"


def test_tuning_can_be_turned_off(lib, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLENS_KERNEL_TUNE", "0")
    tuning.apply(lib, EXTREMES[1])
    assert tuning.tune(lib, tmp_path / "rowlinear-native-1.so") == "defaults"
    assert {n: kernel_choices()[n] for n in tuning.TUNED} == tuning.DEFAULTS
    assert not (tmp_path / "rowlinear-native-1.tuning.json").exists()
