"""Which models of a run, or of a batched run, take the static-cache path
(decoding/runtime/static.py), and the widths captured for them before anything is timed."""

from __future__ import annotations

import torch

from ..runtime.static import drop_static, graphed, use_static, warm_up
from ..settings.policies import K_MAX
from .proposal import Draft
from .tree import MAX_TREE_NODES, TreeShape

ROUND_UP = 128  # buffer rows: prompts of similar length share buffers, and so their graphs


def draft_model(draft: Draft) -> torch.nn.Module | None:
    """The model a draft runs with its own KV cache in the target's tokens (a separate model,
    `layers:N`); None for the others (n-gram, suffix and the head have none, a draft with another
    tokenizer counts in its own tokens)."""
    model = getattr(draft, "model", None)
    return model if draft.kind in ("model", "layers") and isinstance(model, torch.nn.Module) else None


def use_graphs(
    target: torch.nn.Module, draft: Draft, length: int, k: int, tree: TreeShape | None, on: bool = True
) -> bool:
    """On CUDA (and `on`): static buffers for `length` tokens (prompt and new ones) for the target
    and the draft's model, every width a round of depth `k` (or a `tree`) can use captured now.
    Otherwise both keep their own forward. True where the target's steps are replayed graphs."""
    models = [m for m in (target, draft_model(draft)) if m is not None]
    cuda = target.get_output_embeddings().weight.device.type == "cuda"
    if not (on and cuda):
        for m in models:
            drop_static(m)
        return False
    capacity = _static_target(target, length, k, tree)
    if len(models) > 1:
        draft.reset()  # the last run's cache lets go of the model's buffers
    if len(models) > 1 and use_static(models[1], capacity) is not None:
        # A draft model reads one token (two after a round that kept all), its last row kept;
        # a tree's levels are as wide as its branch factor, every row kept.
        levels = [(n, 0) for n in range(1, tree.branch + 1)] if tree else []
        warm_up(models[1], [(1, 1), (2, 1), *levels])
    return graphed(target)


def use_batch_graphs(
    target: torch.nn.Module, size: int, length: int, k: int, tree: TreeShape | None, on: bool = True
) -> bool:
    """On CUDA (and `on`): static buffers with a slot for each of `size` sequences of up to `length`
    tokens, and every width of a batched pass captured now (1 for plain decoding, k = 0; up to k + 1
    or a `tree`'s nodes + 1). Otherwise the target keeps its own pass. True where the batch's passes
    are replayed graphs. A draft's own model keeps its own forward, a pass per sequence."""
    cuda = target.get_output_embeddings().weight.device.type == "cuda"
    if not (on and cuda):
        drop_static(target)
        return False
    _static_target(target, length, k, tree, size)
    return graphed(target)


def _static_target(
    target: torch.nn.Module, length: int, k: int, tree: TreeShape | None, slots: int = 1
) -> int:
    """The target's static buffers for `slots` sequences of `length` tokens, every width a round of
    depth `k` (or a `tree`) can use captured; their capacity."""
    # Room past the run's end for a tree's nodes, whose pass may reach beyond the last token.
    capacity = -(-(length + MAX_TREE_NODES + 1) // ROUND_UP) * ROUND_UP
    widest = max(min(k, K_MAX) + 1, tree.nodes + 1 if tree else 0)
    if use_static(target, capacity, slots=slots) is not None:
        warm_up(target, [(n, 0) for n in range(1, widest + 1)])
    return capacity
