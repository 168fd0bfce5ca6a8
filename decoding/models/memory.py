"""How much memory a model needs and whether it fits, before it is loaded."""

from __future__ import annotations

import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ..errors import ModelNotFoundError, ModelTooLargeError, first_line
from ..settings.environment import available_memory_bytes, on_zerogpu, total_memory_bytes
from .presets import GPU_PAIRS, params_of

# What a run holds beside a pair's weights (KV caches, the graphs' memory pool, activations),
# as a fraction of the weights: a pair is offered only with that much room to spare.
RUN_HEADROOM = 0.25


def model_budget_bytes() -> int:
    """How much memory the loaded models may hold together: $SPECLENS_MODEL_BUDGET_GB, else
    half of this machine's memory (or of the GPU's), so a long-lived Space switching models
    keeps room for the runs themselves."""
    if os.environ.get("SPECLENS_MODEL_BUDGET_GB"):
        return int(float(os.environ["SPECLENS_MODEL_BUDGET_GB"]) * 2**30)
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory // 2
    return total_memory_bytes() // 2


def model_bytes(model: torch.nn.Module) -> int:
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return gpu_free_bytes(device)
    return available_memory_bytes()


def gpu_free_bytes(device: torch.device | None = None) -> int:
    """Free memory on the GPU. In a ZeroGPU Space's main process CUDA must not start (`spaces` fakes
    the card there): the slice's whole size, which every GPU call gets afresh."""
    if on_zerogpu() and not torch.cuda.is_initialized():
        return torch.cuda.get_device_properties(0).total_memory
    free, _ = torch.cuda.mem_get_info(device)
    return free


def estimate_bytes(config, dtype: torch.dtype) -> int:
    """Weights size of a model built from `config`, without allocating it."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = {id(p): p.numel() for p in model.parameters()}  # tied weights once
    return sum(params.values()) * torch.finfo(dtype).bits // 8


def needed_bytes(source: str, dtype: torch.dtype) -> int:
    try:
        config = AutoConfig.from_pretrained(source)
    except Exception as exc:  # a hub error, a broken config.json
        raise ModelNotFoundError(f"cannot read the configuration of '{source}': {first_line(exc)}") from exc
    return estimate_bytes(config, dtype)


def check_fits(source: str, need: int, dtype: torch.dtype, device: torch.device) -> None:
    have = available_bytes(device)
    if need > 0.9 * have:
        raise ModelTooLargeError(
            f"'{source}' needs about {need / 2**30:.1f} GiB in {str(dtype).removeprefix('torch.')} "
            f"but only {have / 2**30:.1f} GiB is free on {device}; pick a smaller model"
        )


def gpu_status() -> tuple[bool, int]:
    """Whether this machine has CUDA, and how many bytes are free on its GPU (0 without one)."""
    cuda = torch.cuda.is_available()
    return cuda, gpu_free_bytes() if cuda else 0


def pair_bytes(target: str, draft: str, dtype: torch.dtype = torch.bfloat16) -> int | None:
    """The weights of a target and its draft spec in `dtype`; None where either is unknown."""
    sizes = [params_of(target), params_of(draft)]
    if None in sizes:
        return None
    return int(sum(sizes) * torch.finfo(dtype).bits // 8)


def gpu_pairs(cuda: bool, free: int) -> tuple[list[tuple[str, str]], dict[tuple[str, str], str]]:
    """Which of GPU_PAIRS to offer: none without CUDA; with it, those whose weights in bfloat16,
    and a quarter more for the run, fit `free` bytes. The others come back with the words that say
    why, to show instead."""
    offered: list[tuple[str, str]] = []
    refused: dict[tuple[str, str], str] = {}
    if not cuda:
        return offered, refused
    for target, draft in GPU_PAIRS:
        need = (pair_bytes(target, draft) or 0) * (1 + RUN_HEADROOM)
        if need <= free:
            offered.append((target, draft))
        else:
            refused[(target, draft)] = (
                f"needs about {need / 2**30:.1f} GiB on the GPU, {free / 2**30:.1f} GiB is free"
            )
    return offered, refused
