"""Local model paths: which folders a served app may load from, and how a trace names a model
without naming this machine's folders."""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub.constants import HF_HUB_CACHE

from ..errors import ModelNotFoundError
from ..settings.environment import cache_dir
from .presets import PRESETS


def is_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists()


def allowed_model_dirs() -> list[Path]:
    """Where the app may load local models from: $SPECLENS_MODEL_DIRS (separated by the path
    separator), else SpecLens's cache and the Hugging Face cache."""
    if os.environ.get("SPECLENS_MODEL_DIRS"):
        return [
            Path(p).expanduser().resolve() for p in os.environ["SPECLENS_MODEL_DIRS"].split(os.pathsep) if p
        ]
    return [cache_dir().resolve(), Path(HF_HUB_CACHE).resolve()]


def check_allowed(name: str) -> None:
    """A served app loads local models only from allowed folders: a public page must not open
    whatever folder of the server a visitor names. Presets and hub ids pass."""
    name = (name or "").strip()
    if not name or name in PRESETS or not is_local(name):
        return
    path = Path(name).expanduser().resolve()
    roots = allowed_model_dirs()
    if not any(path.is_relative_to(root) for root in roots):
        raise ModelNotFoundError(
            f"'{name}' is outside the folders this app loads models from; use a preset or a hub id "
            "(the server's SPECLENS_MODEL_DIRS lists the allowed folders)"
        )


def public_name(name: str) -> str:
    """What a trace may say about a model: a preset or hub id as typed, a local path by its last part."""
    name = (name or "").strip()
    return Path(name).name if name not in PRESETS and is_local(name) else name


def public_source(name: str, source: str) -> str:
    """Where a model came from, without the folders of this machine: a trace is made to be shared."""
    preset = PRESETS.get(name)
    if preset is not None:
        return f"{preset.hub_id} ({preset.gguf_name})" if is_local(source) else preset.hub_id
    return Path(source).name if is_local(source) else source
