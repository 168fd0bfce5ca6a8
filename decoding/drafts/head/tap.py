"""Reading the target's hidden states while it verifies: the features a head drafts from."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import torch
from torch import nn


class FeatureTap:
    """Forward pre-hooks on the head's three target layers, installed once per model.

    They keep only the rows the target computes in that pass (the prompt at
    prefill, the k+1 rows of a round later), so nothing is kept for the
    whole sequence, and only into the rows of the draft whose `recording`
    block runs on that thread: the app runs several sessions' decoders on
    one shared model at once, and a run's rounds may hop between threads.
    """

    def __init__(self, target: nn.Module, layers: tuple[int, ...]) -> None:
        self.layers = layers
        self.local = threading.local()
        decoder_layers = target.model.layers
        for i in sorted(set(layers)):
            decoder_layers[i].register_forward_pre_hook(self._hook(i), with_kwargs=True)

    @classmethod
    def on(cls, target: nn.Module, layers: tuple[int, ...]) -> FeatureTap:
        """The model's tap for these layers, installed once."""
        taps = target.__dict__.setdefault("_speclens_taps", {})
        if layers not in taps:
            taps[layers] = cls(target, layers)
        return taps[layers]

    def _hook(self, layer: int):
        def hook(module, args, kwargs):
            readers = getattr(self.local, "readers", None)
            if readers is not None:
                hidden = (args[0] if args else kwargs["hidden_states"])[0]
                parts = [hidden] if self.local.sizes is None else hidden.split(self.local.sizes)
                for rows, part in zip(readers, parts, strict=True):
                    rows.setdefault(layer, []).append(part)

        return hook

    def recording(self, rows: dict[int, list[torch.Tensor]]) -> contextlib.AbstractContextManager:
        """Target passes run in this block, on this thread, add their rows to `rows`."""
        return self._recording([rows], None)

    def recording_split(
        self, readers: Sequence[dict[int, list[torch.Tensor]]], sizes: Sequence[int]
    ) -> contextlib.AbstractContextManager:
        """A pass over several sequences' rows (`sizes[i]` of them for `readers[i]`, in order) runs in
        this block: each reader gets its own sequence's rows."""
        return self._recording(readers, list(sizes))

    @contextlib.contextmanager
    def _recording(self, readers, sizes: list[int] | None) -> Iterator[None]:
        self.local.readers, self.local.sizes = readers, sizes
        try:
            yield
        finally:
            self.local.readers = None

    def take(self, rows: dict[int, list[torch.Tensor]]) -> torch.Tensor:
        """Every row in `rows`, as [n, 3 × hidden], and `rows` emptied."""
        if not rows:
            return torch.empty(0)
        feats = torch.cat([torch.cat(rows[i], dim=0) for i in self.layers], dim=-1)
        rows.clear()
        return feats
