"""The Hugging Face Hub: whether a hub id can be had from here, and downloading one."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable
from pathlib import Path

from huggingface_hub import constants as hub_constants
from huggingface_hub import snapshot_download, try_to_load_from_cache

from ..errors import HubUnreachableError, first_line
from .presets import OFFLINE_PRESETS


def hub_source(hub_id: str) -> str:
    """Check a hub id can be had: cached already, or the hub can be reached."""
    if isinstance(try_to_load_from_cache(hub_id, "config.json"), str):
        return hub_id
    offline_hint = f"Offline presets: {', '.join(OFFLINE_PRESETS)}."
    if hub_constants.is_offline_mode() or not _hub_reachable():
        raise HubUnreachableError(
            f"cannot fetch '{hub_id}': the Hugging Face Hub is not reachable from here "
            f"(no network?) and the model is not cached. {offline_hint}"
        )
    return hub_id


def _hub_reachable(timeout: float = 3.0) -> bool:
    # transformers retries an unreachable hub for ~25 s; one quick socket
    # check gives the user an answer at once instead.
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def download(name: str, hub_id: str) -> str:
    """Download a hub model's weights (safetensors only, as transformers loads them) and
    configuration into the Hugging Face cache; returns its folder."""
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    try:
        return snapshot_download(hub_id, allow_patterns=patterns)
    except Exception as exc:  # an unknown repository, a gated model, a broken connection
        raise HubUnreachableError(f"cannot download '{name}': {first_line(exc)}") from None


# What a draft head's repository holds that SpecLens reads: EAGLE's pytorch_model.bin or safetensors
# (sharded or not), and config.json.
HEAD_FILES = ["config.json", "*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin"]


def head_snapshot(hub_id: str, check: Callable[[Path], object] | None = None) -> str:
    """A draft head's folder from its hub id: the local cache's copy where it holds the head (the
    only way offline), else downloaded. `check` reads the head's config.json first and refuses a
    repository that is not a head for this target before any weights come down."""
    cached = _cached(hub_id, HEAD_FILES)
    if cached and _holds_a_head(cached):
        return cached
    offline = hub_constants.is_offline_mode() or not _hub_reachable()
    config = _cached(hub_id, ["config.json"]) if offline else _download(hub_id, ["config.json"])
    if config and check is not None:
        check(Path(config))
    if offline:
        raise HubUnreachableError(
            f"cannot fetch the head '{hub_id}': the Hugging Face Hub is not reachable from here "
            "(no network?) and the head is not in the local cache"
        )
    return _download(hub_id, HEAD_FILES)


def _cached(hub_id: str, patterns: list[str]) -> str | None:
    try:
        return snapshot_download(hub_id, allow_patterns=patterns, local_files_only=True)
    except Exception:  # not in the cache
        return None


def _download(hub_id: str, patterns: list[str]) -> str:
    try:
        return snapshot_download(hub_id, allow_patterns=patterns)
    except Exception as exc:  # an unknown repository, a gated one, a broken connection
        raise HubUnreachableError(f"cannot download the head '{hub_id}': {first_line(exc)}") from None


def _holds_a_head(folder: str) -> bool:
    files = {p.name for p in Path(folder).iterdir()} if Path(folder).is_dir() else set()
    weights = any(n.endswith((".safetensors", ".bin")) for n in files)
    return "config.json" in files and weights


@functools.cache
def hub_available() -> bool:
    """Whether this process can reach the hub at all (asked once): the app offers hub models only then."""
    return not hub_constants.is_offline_mode() and _hub_reachable(timeout=1.5)
