"""One forward pass of a causal LM over new tokens, extending its KV cache."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache(model: torch.nn.Module) -> DynamicCache:
    return DynamicCache(config=model.config)


@torch.inference_mode()
def forward(
    model: torch.nn.Module,
    ids: torch.Tensor,
    cache: DynamicCache,
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
    out = model(
        input_ids=ids,
        cache=cache,
        use_cache=True,
        logits_to_keep=keep,
        position_ids=position_ids,
        attention_mask=mask,
    )
    return out.logits[0]


def crop(cache: DynamicCache, length: int) -> None:
    """Roll the cache back so that it holds the first `length` tokens."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
