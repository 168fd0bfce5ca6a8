"""A self-draft: the target's own first N layers, its final norm and its head."""

from __future__ import annotations

import copy

import torch

from ..errors import SpecLensError
from .model import ModelDraft


class LayerDraft(ModelDraft):
    """The target's first N layers plus its final norm and head (a self-draft).

    The weights are the target's own modules, shared, not copied; only the
    KV cache is separate.
    """

    kind = "layers"

    def __init__(self, target: torch.nn.Module, n_layers: int, vocab_size: int) -> None:
        super().__init__(cut_layers(target, n_layers), vocab_size, f"layers:{n_layers}")


def cut_layers(model: torch.nn.Module, n_layers: int) -> torch.nn.Module:
    total = model.config.num_hidden_layers
    if not 1 <= n_layers < total:
        raise SpecLensError(f"layers:N needs 1 <= N < {total} (the target's layer count), got {n_layers}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:n_layers]
    with torch.device("meta"):
        cut = type(model)(config)
    for name, child in model.model.named_children():
        setattr(cut.model, name, child)
    cut.model.layers = torch.nn.ModuleList(model.model.layers[:n_layers])
    cut.lm_head = model.lm_head
    left = [n for n, t in [*cut.named_parameters(), *cut.named_buffers()] if t.is_meta]
    if left:
        raise SpecLensError(f"cannot cut layers from {type(model).__name__}: {left[0]} is not shared")
    return cut.eval()
