"""How much memory a model needs and whether it fits, before it is loaded."""

from __future__ import annotations

import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ..errors import ModelNotFoundError, ModelTooLargeError, first_line
from ..settings.environment import available_memory_bytes, total_memory_bytes


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
        free, _ = torch.cuda.mem_get_info(device)
        return free
    return available_memory_bytes()


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
