"""Model loading: the .gguf path, size estimates, devices and dtypes."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from conftest import tiny_model_folder

from decoding.api import encode_prompt
from decoding.core.plain import autoregressive_generate
from decoding.core.speculative import speculative_generate
from decoding.drafts import NGramDraft, same_tokenizer
from decoding.errors import SpecLensError
from decoding.models import loading, memory, presets
from decoding.models.text import eos_ids
from decoding.settings.policies import make_policy


@pytest.mark.slow
def test_a_gguf_file_loads_like_its_preset(smol, tmp_path, monkeypatch):
    """A .gguf path is converted once into the cache and decodes like the preset made from it."""
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path))
    gguf = presets._smollm2_gguf()
    folder = loading.resolve_source(str(gguf))
    assert folder.startswith(str(tmp_path)) and (tmp_path / "models").is_dir()
    assert loading.resolve_source(str(gguf)) == folder  # converted once
    loaded = loading.load_model(str(gguf), "cpu")
    prompt = encode_prompt(smol, "Name a colour.", chat=True)
    ours = autoregressive_generate(
        loaded.model, prompt, max_new_tokens=8, eos_ids=eos_ids(smol.model, smol.tokenizer)
    ).token_ids
    preset = autoregressive_generate(
        smol.model, prompt, max_new_tokens=8, eos_ids=eos_ids(smol.model, smol.tokenizer)
    ).token_ids
    assert ours == preset


@pytest.mark.slow
def test_size_estimate_and_same_model_loads_once(smol):
    # 135M parameters, the tied embedding counted once, 4 bytes each.
    assert 500e6 < memory.estimate_bytes(smol.model.config, torch.float32) < 560e6
    assert loading.load_model("smollm2-135m", "cpu") is smol
    assert same_tokenizer(smol.tokenizer, smol.tokenizer)


def test_device_and_dtype_choices():
    assert loading.pick_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert loading.pick_dtype(torch.device("cpu")) == torch.float32
    assert loading.pick_dtype(torch.device("cuda")) == torch.bfloat16
    assert loading.pick_dtype(torch.device("cpu"), "bfloat16") == torch.bfloat16
    with pytest.raises(SpecLensError, match="unknown dtype"):
        loading.pick_dtype(torch.device("cpu"), "int3")
    with pytest.raises(SpecLensError, match="no model given"):
        loading.load_model("  ")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_greedy_is_lossless(tiny_target):
    model = tiny_target.to("cuda")
    ids = torch.tensor([[1, 5, 9, 3, 7, 5, 9]], device="cuda")
    expected = autoregressive_generate(model, ids, max_new_tokens=30).token_ids
    trace = speculative_generate(model, ids, NGramDraft(), make_policy("fixed", 4), max_new_tokens=30)
    assert trace.output.token_ids == expected
    tiny_target.to("cpu")


def test_loaded_models_stay_within_their_budget_least_recently_used_out(tmp_path, monkeypatch):

    folders = [str(tiny_model_folder(tmp_path / f"m{i}", seed=i)) for i in range(3)]
    monkeypatch.setattr(loading, "_loaded", OrderedDict())
    first = loading.load_model(folders[0], "cpu")
    monkeypatch.setenv("SPECLENS_MODEL_BUDGET_GB", str(2.5 * first.nbytes / 2**30))  # room for two
    loading.load_model(folders[1], "cpu")
    assert loading.load_model(folders[0], "cpu") is first  # used again: now the most recent
    loading.load_model(folders[2], "cpu")
    assert [key[0] for key in loading._loaded] == [folders[0], folders[2]]
    assert sum(m.nbytes for m in loading._loaded.values()) <= memory.model_budget_bytes()
    monkeypatch.setenv("SPECLENS_MODEL_BUDGET_GB", "0.000001")  # a model larger than the whole budget
    with pytest.raises(SpecLensError, match="more than the"):
        loading.load_model(folders[1], "cpu")
    assert len(loading._loaded) == 2, "a refused model must not evict the loaded ones"
