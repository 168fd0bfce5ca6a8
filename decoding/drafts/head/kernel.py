"""The head's drafting step in the default CPU mode: one call of the target's layer kernel.

A head step is one decoder layer, a norm and an 8k-row output layer over one
row (a chain) or a tree level's few rows. In eager torch the products were
already the row kernel's, but the ~40 small ops around them (two norms, the
concatenation, the rotary embedding, attention, the residual adds, SiLU)
cost more than the products: the head's step took an eighth of the target's
30-layer step. Here `kernels/layer.cpp`'s `eagle_layer` runs the layer with
EAGLE-3's input (attention over [norm(embedding) ; norm(feature)], the
feature as the residual stream), then the norm and the output layer, in one
parallel region; keys and values go straight into the head's own cache,
which rolls back as before.

It applies where the head's linear layers are the row kernel's (the
target's default CPU mode, float32); elsewhere the head runs its own
modules (`EagleHead.step_logits`). Its norms, SiLU and attention are the
kernel's, not torch's, so its outputs differ from the eager head's in the
last bits; its drafts are the same (tests/test_heads.py).

A step streams the head's weights once, and that is most of its time. A
head saved in float16 (the shipped one) holds only values float16 holds
exactly, so the kernel reads float16 copies of its products' weights,
widened as they load: the same float32 sums, from half the bytes. A head
with any weight float16 cannot hold (one trained and not yet saved, a
float32 or bfloat16 file) keeps float32.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from ...runtime.llama import _Head, _Layer, _LayerCacheView, _Mask, _Segment, _Step, fused_linear
from ...runtime.rowlinear import RowLinear, library
from .model import EagleHead, HeadCache, rotation


class _EagleInput(ctypes.Structure):
    _fields_ = [("emb", ctypes.c_void_p), ("hidden_norm", ctypes.c_void_p)]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def kernel_step(head: EagleHead) -> HeadKernel | None:
    """The head's step through the layer kernel, made once per head; None where it does not apply."""
    kernel = head.__dict__.get("_speclens_kernel")
    if kernel is None and HeadKernel.fits(head):
        kernel = head._speclens_kernel = HeadKernel(head)
    return kernel


def exactly_half(weights: list[torch.Tensor]) -> bool:
    """Whether float16 holds every value of these float32 weights exactly."""
    return all(torch.equal(w.half().float(), w) for w in weights)


class HeadKernel:
    """`EagleHead.step_logits` through the layer kernel (float32 sums, CPU)."""

    @staticmethod
    def fits(head: EagleHead) -> bool:
        """True where every linear layer of the head is the row kernel's and the layer kernel is built."""
        linears = [m for m in head.modules() if isinstance(m, torch.nn.Linear | RowLinear)]
        return (
            library() is not None
            and all(isinstance(m, RowLinear) for m in linears)
            and head.fc.weight.dtype == torch.float32
            and head.c.head_dim % 2 == 0
            # The kernel keeps the feature itself as the residual stream.
            and not head.c.norm_before_residual
        )

    def __init__(self, head: EagleHead, half: bool = True) -> None:
        """`half`: read float16 copies of the weights where float16 holds them exactly (False: never)."""
        c, layer = head.c, head.midlayer
        attn, mlp = layer.self_attn, layer.mlp
        # Fused as the target's layers are: the parts' weights become views, so the eager modules still work.
        self.qkv = fused_linear(attn.q_proj, attn.k_proj, attn.v_proj)
        self.gate_up = fused_linear(mlp.gate_proj, mlp.up_proj)
        self.c, self.head = c, head
        products = [self.qkv, attn.o_proj, self.gate_up, mlp.down_proj, head.lm_head]
        weights = [m.weight.detach() for m in products]
        self.half = half and exactly_half(weights)
        # Kept here: the structs below hold only their addresses.
        self.weights = [w.half() for w in weights] if self.half else weights
        qkv, o, gate_up, down, self.lm_head = self.weights
        *panels, self.lm_panels = [None] * 5 if self.half else [m.panels() for m in products]
        self.layer = _Layer(
            _ptr(layer.input_layernorm.weight), _ptr(qkv), _ptr(self.qkv.bias), _ptr(o), _ptr(attn.o_proj.bias),
            _ptr(layer.post_attention_layernorm.weight), _ptr(gate_up), _ptr(self.gate_up.bias), _ptr(down),
            _ptr(mlp.down_proj.bias), *map(_ptr, panels), c.hidden_size, c.num_attention_heads,
            c.num_key_value_heads, c.head_dim, c.intermediate_size, c.rms_norm_eps, c.head_dim**-0.5, self.half,
        )  # fmt: skip
        self.hidden_norm = layer.hidden_norm.weight
        self.cos = self.sin = torch.empty(0, c.head_dim)

    def _rotation(
        self, start: int, n: int, positions: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # A table of every position so far, grown by doubling: computing cos and sin
        # each step was a tenth of the step. Row for row the same bits as the eager head's.
        end = start + n if positions is None else int(positions.max()) + 1
        if end > self.cos.shape[0]:
            table = torch.arange(max(2 * end, 256))
            self.cos, self.sin = rotation(table, self.c)
        if positions is None:
            return self.cos[start : start + n], self.sin[start : start + n]
        return self.cos[positions], self.sin[positions]

    def step_logits(
        self,
        emb: torch.Tensor,
        feature: torch.Tensor,
        cache: HeadCache,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        keep: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As `EagleHead.step_logits`: the outputs [n, h] of rows after the cached ones, and the
        logits of the last `keep`; a tree's level gives positions and a bool mask [n, cached + n]."""
        c = self.c
        n, past = emb.shape[0], len(cache)
        emb, feature = emb.contiguous(), feature.contiguous()
        out = torch.empty_like(feature)
        logits = feature.new_empty(keep, c.draft_vocab_size)
        keys, values = cache.reserve(past + n, feature.new_empty(c.num_key_value_heads, 0, c.head_dim))
        cos, sin = self._rotation(past, n, positions)
        rows = None if mask is None else mask.contiguous()
        step = _Step(
            feature.data_ptr(), out.data_ptr(), n, past, cos.data_ptr(), sin.data_ptr(),
            _Mask(0, None, 0) if rows is None else _Mask(1, rows.data_ptr(), past + n),
            ctypes.pointer(self._head_spec(keep, logits)),
        )  # fmt: skip
        view = _LayerCacheView(keys.data_ptr(), values.data_ptr(), keys.shape[1])
        self._call(view, emb, step)
        cache.length = past + n
        return out, logits

    def step_together(
        self, emb: torch.Tensor, feature: torch.Tensor, caches: Sequence[HeadCache], counts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step over several sequences' chains: `counts[i]` rows of sequence i, in order, each
        after its own `caches[i]`. The outputs [n, h], and the logits of each sequence's last row
        [len(caches), draft vocabulary]. The weights stream once for every sequence; each row's
        sums are those `step_logits` gives it alone."""
        c = self.c
        emb, feature = emb.contiguous(), feature.contiguous()
        out = torch.empty_like(feature)
        logits = feature.new_empty(len(caches), c.draft_vocab_size)
        like = feature.new_empty(c.num_key_value_heads, 0, c.head_dim)
        pasts = [len(cache) for cache in caches]
        cos, sin = self._rotation(0, 0, torch.cat([torch.arange(p, p + n) for p, n in zip(pasts, counts)]))
        views = (_LayerCacheView * len(caches))()
        segments = (_Segment * len(caches))()
        first = 0
        for j, (cache, past, n) in enumerate(zip(caches, pasts, counts, strict=True)):
            keys, values = cache.reserve(past + n, like)
            views[j] = _LayerCacheView(keys.data_ptr(), values.data_ptr(), keys.shape[1])
            view = ctypes.addressof(views) + j * ctypes.sizeof(_LayerCacheView)
            segments[j] = _Segment(
                first, n, past, ctypes.cast(view, ctypes.POINTER(_LayerCacheView)), _Mask(0, None, 0)
            )
            first += n
        spec = self._head_spec(len(caches), logits)
        spec.last_of_each = 1
        step = _Step(
            feature.data_ptr(), out.data_ptr(), first, 0, cos.data_ptr(), sin.data_ptr(), _Mask(0, None, 0),
            ctypes.pointer(spec), len(caches), segments,
        )  # fmt: skip
        self._call(None, emb, step)
        for cache, past, n in zip(caches, pasts, counts):
            cache.length = past + n
        return out, logits

    def _head_spec(self, keep: int, logits: torch.Tensor) -> _Head:
        c, head = self.c, self.head
        return _Head(
            _ptr(head.norm.weight), c.rms_norm_eps, _ptr(self.lm_head), _ptr(self.lm_panels),
            _ptr(head.lm_head.bias), c.hidden_size, c.draft_vocab_size, keep, logits.data_ptr(), self.half,
        )  # fmt: skip

    def _call(self, view: _LayerCacheView | None, emb: torch.Tensor, step: _Step) -> None:
        eagle = _EagleInput(emb.data_ptr(), self.hidden_norm.data_ptr())
        library().eagle_layer(
            ctypes.byref(self.layer), None if view is None else ctypes.byref(view), ctypes.byref(eagle),
            ctypes.byref(step),
        )  # fmt: skip
