"""The app on Hugging Face Spaces: the model-bound handlers run through the real `spaces` package (a
no-op on a CPU, so the wiring is exercised here), each ZeroGPU call's duration comes from its
request, nothing is compiled on ZeroGPU, and the GPU pairs offered follow CUDA and free memory."""

from __future__ import annotations

import sys

import pytest
import spaces
from conftest import tiny_model_folder

from app import common
from app.tabs import explore
from app.ui import HUB_PAIR_SETTINGS, OFFLINE_PAIRS, offered_pairs, pair_controls
from decoding.api import RunConfig
from decoding.errors import SpecLensError
from decoding.models import GPU_PAIRS, PRESETS
from decoding.models.loading import load_model
from decoding.models.memory import gpu_pairs, pair_bytes
from decoding.models.presets import params_of

NGRAM = next(label for label, kind in common.DRAFT_SOURCES.items() if kind == "ngram")
HEAD = next(label for label, kind in common.DRAFT_SOURCES.items() if kind == "head")
MODEL = next(label for label, kind in common.DRAFT_SOURCES.items() if kind == "model")
GIB = 2**30


def explore_args(**settings) -> list:
    """Explore's inputs in the page's order, as Gradio hands them to the handler."""
    values = {
        "prompt": "a b c d a b c", "target": "smollm2-135m", "draft_source": NGRAM, "n_layers": 2,
        "draft_model": None, "k": 3, "tree_nodes": 0, "branch": 2, "policy": "fixed", "confidence": 0.4,
        "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "max_new_tokens": 64, "compare": True,
    } | settings  # fmt: skip
    return [values[name] for name in explore.EXPLORE_INPUTS]


def test_the_decorated_run_goes_through_the_real_spaces_package(tmp_path, monkeypatch):
    """`spaces` is installed (requirements-dev.txt) and wraps the handler; on a CPU its GPU call is
    the handler itself, which must still check, run and compare a real model end to end."""
    assert common.spaces is spaces and "spaces" in sys.modules
    folder = tiny_model_folder(tmp_path / "tiny")
    monkeypatch.setenv("SPECLENS_MODEL_DIRS", str(tmp_path))
    args = explore_args(target=str(folder), max_new_tokens=12)
    explore.check_explore(*args)
    views = list(explore.run_explore(*args))
    trace = next(v for v in views[-1] if isinstance(v, dict) and "rounds" in v)
    assert len(trace["output"]["token_ids"]) == 12 and trace["baseline"]["token_ids"]
    assert explore.run_explore.gpu_duration(*args) == common.gpu_seconds(
        dict(zip(explore.EXPLORE_INPUTS, args, strict=True))
    )


def test_a_calls_duration_grows_with_the_tokens_asked_and_the_pair():
    duration = explore.run_explore.gpu_duration
    small = duration(*explore_args(max_new_tokens=64))
    assert duration(*explore_args(max_new_tokens=512)) > small
    assert duration(*explore_args(max_new_tokens=64, compare=False)) < small
    pair = {"target": "smollm2-1.7b", "draft_source": MODEL, "draft_model": "smollm2-135m"}
    assert duration(*explore_args(**pair)) > small
    llama = {
        "target": "llama3.1-8b",
        "draft_source": HEAD,
        "draft_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
    }
    assert duration(*explore_args(**llama)) > duration(*explore_args(**pair))
    # Within the decoding budget plus loading and capture, however many tokens are asked for.
    longest = duration(*explore_args(**llama, max_new_tokens=10**6))
    assert longest == common.gpu_seconds({**llama, "n_layers": 2, "k_from": 1})  # a sweep's: the budget
    assert longest <= common.TIME_LIMIT_S + 90
    # A request with no token count: a probe of the target alone.
    assert common.gpu_seconds({"target": "smollm2-135m"}) < common.gpu_seconds({"target": "qwen2.5-7b"})


def test_on_zerogpu_nothing_compiles_and_a_check_captures_no_graphs(monkeypatch):
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    with pytest.raises(SpecLensError, match="torch.compile is not supported on ZeroGPU"):
        load_model("smollm2-135m", "cpu", compile=True)
    assert common.outside_gpu_call(RunConfig(prompt="x")).graphs is False
    monkeypatch.delenv("SPACES_ZERO_GPU")
    assert common.outside_gpu_call(RunConfig(prompt="x")).graphs is True


def test_gpu_pairs_are_offered_by_cuda_and_free_memory():
    assert gpu_pairs(False, 10**15) == ([], {})
    everything, none_unfit = gpu_pairs(True, 80 * GIB)
    assert everything == GPU_PAIRS and none_unfit == {}
    fits, unfit = gpu_pairs(True, 12 * GIB)
    assert fits == [("smollm2-1.7b", "smollm2-135m"), ("qwen3-1.7b", "head:AngelSlim/Qwen3-1.7B_eagle3")]
    assert set(unfit) == {
        ("qwen2.5-7b", "qwen2.5-0.5b"),
        ("llama3.1-8b", "head:yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
    }
    assert unfit[("qwen2.5-7b", "qwen2.5-0.5b")] == "needs about 18.9 GiB on the GPU, 12.0 GiB is free"
    assert gpu_pairs(True, 1 * GIB) == (
        [],
        {pair: line for pair, line in gpu_pairs(True, 1 * GIB)[1].items()},
    )
    # Every pair is sized before anything downloads: bfloat16 weights of known parameter counts.
    for target, draft in GPU_PAIRS:
        assert params_of(target) and params_of(draft) and pair_bytes(target, draft)


def test_the_sidebar_offers_gpu_pairs_only_with_cuda():
    cpu, cpu_lines = offered_pairs(hub=True, cuda=False, free=0)
    assert cpu == OFFLINE_PAIRS | HUB_PAIR_SETTINGS and cpu_lines == []
    offline, _ = offered_pairs(hub=False, cuda=True, free=80 * GIB)
    assert offline == OFFLINE_PAIRS  # GPU pairs come from the hub
    gpu, lines = offered_pairs(hub=True, cuda=True, free=12 * GIB)
    assert "Qwen3-1.7B ← EAGLE-3 head AngelSlim/Qwen3-1.7B_eagle3 (GPU)" in gpu
    assert "SmolLM2-1.7B-Instruct ← SmolLM2-135M-Instruct (GPU)" in gpu
    assert "SmolLM2-1.7B-Instruct ← SmolLM2-135M-Instruct (hub)" not in gpu  # the same pair once
    assert lines == [
        "Qwen2.5-7B-Instruct ← Qwen2.5-0.5B-Instruct (GPU): needs about 18.9 GiB on the GPU, 12.0 GiB is free",
        "Llama-3.1-8B-Instruct ← EAGLE-3 head yuhuili/EAGLE3-LLaMA3.1-Instruct-8B (GPU): "
        "needs about 19.7 GiB on the GPU, 12.0 GiB is free",
    ]
    # A head pair sets the sidebar to the head draft with its hub id, which makes the same spec again.
    for target, spec in offered_pairs(hub=True, cuda=True, free=80 * GIB)[0].values():
        assert target in PRESETS
        chosen, source, n_layers, draft_model = pair_controls(target, spec)
        assert common.draft_spec(source, n_layers if isinstance(n_layers, int) else 0, draft_model) == spec


def test_the_model_box_names_the_head_for_the_head_drafts():
    """Empty, the head draft is the one SpecLens ships; a hub id or folder there names another; a
    model's name left from a model draft is cleared, not read as a head."""
    _, box = common.draft_controls(HEAD, "smollm2-135m")
    assert box["visible"] and box["label"] == common.HEAD_BOX_LABEL and box["value"] is None
    _, box = common.draft_controls(HEAD, "AngelSlim/Qwen3-1.7B_eagle3")
    assert box["visible"] and "value" not in box
    _, box = common.draft_controls(NGRAM, "AngelSlim/Qwen3-1.7B_eagle3")
    assert not box["visible"] and box["label"] == common.MODEL_BOX_LABEL
    assert common.draft_spec(HEAD, 0, "") == common.draft_spec(HEAD, 0, "smollm2-135m") == "head"
    assert common.draft_spec(HEAD, 0, "AngelSlim/Qwen3-1.7B_eagle3") == "head:AngelSlim/Qwen3-1.7B_eagle3"
    hybrid = next(label for label, kind in common.DRAFT_SOURCES.items() if kind == "ngram+head")
    assert common.spec_controls("ngram+head:org/h") == (hybrid, None, "org/h")
    with pytest.raises(SpecLensError, match="outside the folders"):
        common.draft_spec(HEAD, 0, "/etc")
