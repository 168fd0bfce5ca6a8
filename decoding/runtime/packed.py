"""The output layer packed once for oneDNN: the fast path of the default CPU mode.

A small model's output layer is its largest matrix (49,152 × 576 for
SmolLM2-135M, a fifth of its weights). Through eager `F.linear` it costs
about twice as much for 5 or 9 rows as for one, though it reads the same
weights; through oneDNN, with the weight laid out once in its blocked format,
1 to 9 rows cost about the same (see `python -m decoding probe`). Plain
decoding runs the very same module, so the speedups the app shows stay
honest. The decoder layers' smaller products gain nothing measurable from
the same treatment here, so they stay as they are.
"""

from __future__ import annotations

import os

import torch

ROWS_HINT = 8  # oneDNN lays the weight out for products of about this many rows


class PackedLinear(torch.nn.Module):
    """A bias-free or biased linear layer whose weight oneDNN has pre-packed."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # Kept for what reads a model's output layer (tied embeddings, vocab size, probe).
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), ROWS_HINT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)


def pack_output_layer(model: torch.nn.Module) -> bool:
    """Swap the output layer of a float32 CPU model for a packed one; False where it does not apply.

    SPECLENS_PACK=0 turns it off, to measure against plain eager.
    """
    head = model.get_output_embeddings()
    applies = (
        os.environ.get("SPECLENS_PACK", "1") != "0"
        and isinstance(head, torch.nn.Linear)
        and head.weight.device.type == "cpu"
        and head.weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
    )
    if applies:
        model.set_output_embeddings(PackedLinear(head))
    return applies
