"""One forward pass of a causal LM over new tokens, extending its KV cache.

A Llama on the CPU takes SpecLens's own pass (`llama.py`, the default CPU
mode); a model given static buffers (`static.py`, the GPU path) the static
pass, replayed from CUDA graphs; any other model its own forward. A model's
cache comes from `new_cache`, which picks the kind its pass writes.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from . import llama, static

Cache = DynamicCache | llama.StepCache | static.StaticCache


def new_cache(model: torch.nn.Module) -> Cache:
    if (runner := static.runner_of(model)) is not None and (cache := runner.new_cache()) is not None:
        return cache
    return llama.StepCache(model) if _lean(model) else DynamicCache(config=model.config)


def _lean(model: torch.nn.Module) -> bool:
    # A model whose forward was replaced (compiled, `models.compile_forward`) keeps it.
    return llama.fits(model) and "forward" not in vars(model)


@torch.inference_mode()
def forward(
    model: torch.nn.Module,
    ids: torch.Tensor,
    cache: Cache,
    keep: int = 0,
    position_ids: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits for the last `keep` positions of `ids` ([1, n]); all positions when 0.

    Returns [keep or n, vocab]. Computing only the rows we need matters: the
    output layer is the largest single matrix product of a small model.
    A token tree passes its `position_ids` and an additive 4D `mask`
    ([1, 1, n, cached + n]); transformers uses such a mask as it is.
    """
    if isinstance(cache, static.StaticCache):
        return static.step(cache, ids, keep, position_ids, mask)
    if isinstance(cache, llama.StepCache):
        return llama.forward(model, ids, cache, keep, position_ids, mask)
    out = model(
        input_ids=ids,
        cache=cache,
        use_cache=True,
        logits_to_keep=keep,
        position_ids=position_ids,
        attention_mask=mask,
    )
    return out.logits[0]


def forward_batch(
    model: torch.nn.Module,
    ids: list[torch.Tensor],
    caches: list[Cache],
    position_ids: list[torch.Tensor | None] | None = None,
    masks: list[torch.Tensor | None] | None = None,
) -> list[torch.Tensor]:
    """Each sequence's logits [n_j, vocab] for its new tokens `ids[j]` ([1, n_j]) after its own
    cache `caches[j]`, all of them in one pass where the lean Llama pass runs (the linear layers
    over every row at once) or where they are slots of one model's static buffers (the GPU path);
    elsewhere (the model's own forward) a pass per sequence, the same figures without the
    batching. A sequence checking a token tree gives its `position_ids[j]` and `masks[j]`, as
    `forward` takes them."""
    positions, masks = position_ids or [None] * len(ids), masks or [None] * len(ids)
    if all(isinstance(c, llama.StepCache) for c in caches):
        return llama.forward_batch(model, ids, caches, positions, masks)
    if all(isinstance(c, static.StaticCache) for c in caches) and len({c.runner for c in caches}) == 1:
        return static.step_batch(caches, ids, positions, masks)
    return [
        forward(model, i, c, position_ids=p, mask=m)
        for i, c, p, m in zip(ids, caches, positions, masks, strict=True)
    ]


def crop(cache: Cache, length: int) -> None:
    """Roll the cache back so that it holds the first `length` tokens."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
