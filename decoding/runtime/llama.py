"""A Llama forward pass for decoding, without Hugging Face's per-call machinery.

On a CPU, a small model's step spends as long around its matrix products as
in them: building masks and output objects, the decoder layers' keyword
plumbing, a KV cache that concatenates every layer's keys on every step, and
some twenty small torch ops per layer. This pass runs over a cache written
in place (`StepCache`), in one of two ways:

- the default CPU mode (float32, SpecLens's kernel built): the decoder layers,
  the final norm and the output layer are one call of `kernels/layer.cpp`
  (split only where a layer has hooks, which see its input). `use_layer_kernel`
  swaps the model's norms, SiLU and attention for the same C++ functions, so
  the model's own forward (Hugging Face's `generate`, the tests' reference)
  computes the same bits. A prompt with nothing cached takes the loop below,
  and the model's forward SDPA, alike;
- otherwise: the model's own modules and functions (its norms, rotary
  embedding, MLP and SDPA attention) in a plain loop, op for op what its
  forward computes.

It serves Llama-architecture models (SmolLM2, the tiny test models); other
models, GPUs and compiled models take the model's own forward
(`forward.forward` chooses).
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from .rowlinear import RowLinear, library

KERNEL_ATTENTION = "speclens"  # the attention implementation `use_layer_kernel` gives a model


def fits(model: torch.nn.Module) -> bool:
    """True for a Llama on the CPU that attends through SDPA or the kernel: the models this pass reproduces."""
    return (
        isinstance(model, LlamaForCausalLM)
        and model.config._attn_implementation in ("sdpa", KERNEL_ATTENTION)
        and model.get_output_embeddings().weight.device.type == "cpu"
    )


def use_layer_kernel(model: torch.nn.Module) -> bool:
    """Run each decoder layer of a Llama whose linear layers are `RowLinear`s as one kernel call.

    Fuses q/k/v and gate/up (`fuse_projections`), then swaps the model's norms,
    SiLU and attention for the kernel's own (see the module's docstring).
    False, with only the fusion done, where the layer kernel does not apply.
    """
    fuse_projections(model)
    config = model.config
    if config.hidden_act != "silu" or not all(_kernel_ready(layer) for layer in model.model.layers):
        return False
    AttentionInterface.register(KERNEL_ATTENTION, kernel_attention)
    AttentionMaskInterface.register(KERNEL_ATTENTION, sdpa_mask)  # a boolean mask, or none where causal
    config._attn_implementation = KERNEL_ATTENTION
    model.model.norm = KernelRMSNorm(model.model.norm)
    for layer in model.model.layers:
        layer.input_layernorm = KernelRMSNorm(layer.input_layernorm)
        layer.post_attention_layernorm = KernelRMSNorm(layer.post_attention_layernorm)
        layer.mlp.act_fn = KernelSiLU()
        layer.kernel_weights = _layer_weights(layer, config)
    return True


def _kernel_ready(layer: torch.nn.Module) -> bool:
    attn, mlp = layer.self_attn, layer.mlp
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    return all(isinstance(m, RowLinear) for m in linears) and attn.head_dim % 2 == 0


def fuse_projections(model: torch.nn.Module) -> None:
    """Give each layer one product for q, k and v and one for gate and up (`qkv_proj`, `gate_up_proj`).

    Only for linear layers run by SpecLens's kernel: its sums do not depend on
    which weight rows a call covers, so the fused products give the very bits
    the separate ones do. The separate modules stay, their weights now views
    into the fused ones (no memory added), for the model's own forward.
    """
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = fused_linear(attn.q_proj, attn.k_proj, attn.v_proj)
        attn.qkv_sizes = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
        mlp.gate_up_proj = fused_linear(mlp.gate_proj, mlp.up_proj)


def fused_linear(*parts: RowLinear) -> RowLinear:
    """One kernel product for `parts` (their outputs side by side); each part's weight becomes a view of it."""
    fused = torch.nn.Linear(
        parts[0].in_features, sum(p.out_features for p in parts), bias=parts[0].bias is not None
    )
    fused.weight = torch.nn.Parameter(torch.cat([p.weight for p in parts]), requires_grad=False)
    if fused.bias is not None:
        fused.bias = torch.nn.Parameter(torch.cat([p.bias for p in parts]), requires_grad=False)
    start = 0
    for p in parts:  # each part's rows, now a view of the fused weight
        end = start + p.out_features
        p.weight = torch.nn.Parameter(fused.weight[start:end], requires_grad=False)
        if fused.bias is not None:
            p.bias = torch.nn.Parameter(fused.bias[start:end], requires_grad=False)
        start = end
    return RowLinear(fused, parts[0].uses_panels)


_i64 = ctypes.c_int64


class _Mask(ctypes.Structure):
    # kind 0: each row sees the keys up to its own position; 1: a boolean mask; 2: an additive one.
    _fields_ = [("kind", ctypes.c_int), ("data", ctypes.c_void_p), ("row_stride", _i64)]


class _Attention(ctypes.Structure):
    _fields_ = [
        ("q", ctypes.c_void_p), ("q_row", _i64), ("q_head", _i64),
        ("k", ctypes.c_void_p), ("k_head", _i64), ("k_stride", _i64),
        ("v", ctypes.c_void_p), ("v_head", _i64), ("v_stride", _i64),
        ("out", ctypes.c_void_p),
        *((name, _i64) for name in ("n", "L", "heads", "kv_heads", "d")),
        ("scale", ctypes.c_float), ("mask", _Mask),
    ]  # fmt: skip


class _Layer(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_void_p) for name in (
            "input_norm", "qkv", "qkv_bias", "o", "o_bias", "post_norm", "gate_up", "gate_up_bias", "down",
            "down_bias", "qkv_panels", "o_panels", "gate_up_panels", "down_panels")),
        *((name, _i64) for name in ("hidden", "heads", "kv_heads", "head_dim", "intermediate")),
        ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("half", _i64),
    ]  # fmt: skip


class _LayerCacheView(ctypes.Structure):
    _fields_ = [("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("capacity", _i64)]


class _Head(ctypes.Structure):
    _fields_ = [
        ("norm", ctypes.c_void_p), ("eps", ctypes.c_float), ("w", ctypes.c_void_p), ("panels", ctypes.c_void_p),
        ("bias", ctypes.c_void_p), ("hidden", _i64), ("vocab", _i64), ("keep", _i64), ("logits", ctypes.c_void_p),
        ("half", _i64), ("last_of_each", _i64),
    ]  # fmt: skip


class _Segment(ctypes.Structure):
    _fields_ = [
        ("first", _i64), ("n", _i64), ("past", _i64), ("caches", ctypes.POINTER(_LayerCacheView)), ("mask", _Mask),
    ]  # fmt: skip


_CachesPointer = ctypes.POINTER(_LayerCacheView)


class _Step(ctypes.Structure):
    _fields_ = [
        ("input", ctypes.c_void_p), ("out", ctypes.c_void_p), ("n", _i64), ("past", _i64),
        ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p), ("mask", _Mask), ("head", ctypes.POINTER(_Head)),
        ("segments", _i64), ("segment", ctypes.POINTER(_Segment)),
    ]  # fmt: skip


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _layer_weights(layer: torch.nn.Module, config) -> _Layer:
    attn, mlp = layer.self_attn, layer.mlp
    return _Layer(
        _ptr(layer.input_layernorm.weight), _ptr(attn.qkv_proj.weight), _ptr(attn.qkv_proj.bias),
        _ptr(attn.o_proj.weight), _ptr(attn.o_proj.bias), _ptr(layer.post_attention_layernorm.weight),
        _ptr(mlp.gate_up_proj.weight), _ptr(mlp.gate_up_proj.bias), _ptr(mlp.down_proj.weight),
        _ptr(mlp.down_proj.bias), _ptr(attn.qkv_proj.panels()), _ptr(attn.o_proj.panels()),
        _ptr(mlp.gate_up_proj.panels()), _ptr(mlp.down_proj.panels()), config.hidden_size, config.num_attention_heads,
        config.num_key_value_heads, attn.head_dim, config.intermediate_size, layer.input_layernorm.eps,
        attn.scaling,
    )  # fmt: skip


def _mask(mask: torch.Tensor | None) -> tuple[_Mask, torch.Tensor | None]:
    """The kernel's view of a [1, 1, n, keys] mask (None: causal), and the tensor it points into."""
    if mask is None:
        return _Mask(0, None, 0), None
    rows = mask[0, 0]
    if rows.dtype == torch.bool:
        rows = rows.contiguous()
        return _Mask(1, rows.data_ptr(), rows.shape[-1]), rows
    rows = rows.to(torch.float32).contiguous()
    return _Mask(2, rows.data_ptr(), rows.shape[-1]), rows


class KernelRMSNorm(torch.nn.Module):
    """Llama's RMSNorm through the kernel's own function (float32), so the model's forward and the
    layer kernel normalise alike."""

    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        self.weight, self.eps = norm.weight, float(norm.variance_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:  # the kernel reads float32 only
            return torch.rms_norm(x, self.weight.shape, self.weight.to(x.dtype), self.eps)
        x = x.contiguous()
        y = torch.empty_like(x)
        width = x.shape[-1]
        library().rmsnorm(
            x.data_ptr(), self.weight.data_ptr(), y.data_ptr(), x.numel() // width, width, self.eps
        )
        return y


class KernelSiLU(torch.nn.Module):
    """SiLU through the kernel's own function: the layer kernel's MLP computes these bits."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:  # the kernel reads float32 only
            return F.silu(x)
        x = x.contiguous()
        y = torch.empty_like(x)
        library().silu_rows(x.data_ptr(), y.data_ptr(), x.numel())
        return y


def kernel_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Hugging Face's attention interface over the kernel's attention: [1, n, heads, d] out."""
    n, keys = query.shape[2], key.shape[2]
    if query.dtype != torch.float32 or query.shape[0] != 1 or dropout or _prompt_alone(keys - n, n):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    query, key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
    heads, d = query.shape[1], query.shape[3]
    out = query.new_empty(1, n, heads, d)
    mask, _held = _mask(attention_mask)  # the mask's rows stay alive through the call
    args = _Attention(
        query.data_ptr(), query.stride(2), query.stride(1), key.data_ptr(), key.stride(1), key.stride(2),
        value.data_ptr(), value.stride(1), value.stride(2), out.data_ptr(), n, keys, heads,
        key.shape[1], d, module.scaling if scaling is None else scaling, mask,
    )  # fmt: skip
    library().attention(ctypes.byref(args))
    return out, None


class _LayerCache:
    """One layer's keys and values, [1, kv_heads, capacity, head_dim], valid up to `length`."""

    def __init__(self, growths: list[int]) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0
        self._growths = growths  # its StepCache's count of new buffers, one for all the layers

    @property
    def keys(self) -> torch.Tensor:
        return self.k[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        return self.v[:, :, : self.length]

    def reserve(self, end: int, like: torch.Tensor) -> None:
        """Room for `end` tokens; `like` has the keys' shape and dtype (any length)."""
        if self.k is None or end > self.k.shape[2]:
            self._grow(like, like, max(256, 2 * end))

    def write(self, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new keys and values at `start`; every valid key and value so far."""
        end = start + k.shape[2]
        self.reserve(end, k)
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.keys, self.values

    def _grow(self, k: torch.Tensor, v: torch.Tensor, capacity: int) -> None:
        # Doubling keeps the copies rare: a 1,000-token answer grows the cache three times.
        new_k = k.new_empty(*k.shape[:2], capacity, k.shape[3])
        new_v = v.new_empty(*v.shape[:2], capacity, v.shape[3])
        if self.k is not None:
            new_k[:, :, : self.length] = self.keys
            new_v[:, :, : self.length] = self.values
        self.k, self.v = new_k, new_v
        self._growths[0] += 1


class StepCache:
    """A KV cache written in place, with the parts of `DynamicCache` the decoder uses:
    `get_seq_length`, `crop` and `layers[i].keys` / `.values` (views a token tree compacts)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._growths = [0]
        self.layers = [_LayerCache(self._growths) for _ in model.model.layers]
        self._view: ctypes.Array | None = None
        self._view_room, self._view_growths = 0, -1

    def kernel_view(self, end: int, like: torch.Tensor) -> ctypes.Array:
        """Room for `end` tokens in every layer, and where the layer kernel finds each layer's keys and values."""
        # Rebuilt only when a buffer is new: looking at 30 layers' buffers took 0.1 ms a step.
        if self._view is not None and end <= self._view_room and self._growths[0] == self._view_growths:
            return self._view
        for layer in self.layers:
            layer.reserve(end, like)
        where = [(layer.k.data_ptr(), layer.v.data_ptr(), layer.k.shape[2]) for layer in self.layers]
        self._view = (_LayerCacheView * len(where))(*(_LayerCacheView(*w) for w in where))
        self._view_room, self._view_growths = min(w[2] for w in where), self._growths[0]
        return self._view

    def get_seq_length(self) -> int:
        return self.layers[0].length

    def crop(self, max_length: int) -> None:
        """Keep the first `max_length` tokens; a negative value drops that many from the end."""
        if max_length < 0:
            max_length = self.get_seq_length() + max_length
        for layer in self.layers:
            layer.length = min(layer.length, max_length)


def _run_pre_hooks(layer: torch.nn.Module, hidden: torch.Tensor) -> None:
    # The hooks a caller put on a decoder layer (a draft head's feature tap)
    # see the layer's input here as they would in the model's own forward.
    for key, hook in layer._forward_pre_hooks.items():
        if key in layer._forward_pre_hooks_with_kwargs:
            hook(layer, (hidden,), {})
        else:
            hook(layer, (hidden,))


def _norm(norm: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    # One fused op instead of the module's six; the same bits in float32, the
    # dtype the module computes in (other dtypes, and the kernel's norm, take the module).
    if hidden.dtype != torch.float32 or isinstance(norm, KernelRMSNorm):
        return norm(hidden)
    return torch.rms_norm(hidden, norm.weight.shape, norm.weight, norm.variance_epsilon)


class _Part(NamedTuple):
    """One sequence's rows in a pass: `n` new rows after `past` cached ones in its own cache."""

    cache: StepCache
    past: int
    n: int
    mask: torch.Tensor | None  # [1, 1, n, past + n]; None: causal


def _attention(layer: torch.nn.Module, x, position, parts: list[_Part], index: int) -> torch.Tensor:
    """Layer `index`'s attention over the rows of every part: its products over all the rows at
    once, the rotary embedding, the cache write and attention part by part."""
    attn = layer.self_attn
    if hasattr(attn, "qkv_proj"):
        q, k, v = attn.qkv_proj(x).split(attn.qkv_sizes, dim=-1)
    else:
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    sizes = [p.n for p in parts]
    cos, sin = (t.split(sizes, dim=1) for t in position)
    outs = [
        _attend(attn, *qkv, (c, s), p.cache.layers[index], p.past, p.mask)
        for p, c, s, *qkv in zip(parts, cos, sin, q.split(sizes, 1), k.split(sizes, 1), v.split(sizes, 1))
    ]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    return attn.o_proj(out.reshape(*x.shape[:-1], -1).contiguous())


def _attend(attn, q, k, v, position, cache: _LayerCache, start: int, mask) -> torch.Tensor:
    """One sequence's attention over its cache, [1, n, heads, head_dim]; its keys and values written first."""
    shape = (*q.shape[:-1], -1, attn.head_dim)
    q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
    q, k = apply_rotary_pos_emb(q, k, *position)
    k, v = cache.write(k, v, start)
    if mask is None:
        out, _ = sdpa_attention_forward(attn, q, k, v, None, scaling=attn.scaling)
        return out
    # With a mask (a check of k tokens, a tree) Hugging Face's SDPA copies the keys
    # and values once per query head, copies that grow with the context;
    # grouped-query SDPA reads them as they are and gives the same bits.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=True)
    return out.transpose(1, 2)


def _mlp(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if not hasattr(mlp, "gate_up_proj"):
        return mlp(x)
    gate, up = mlp.gate_up_proj(x).chunk(2, dim=-1)
    return mlp.down_proj(mlp.act_fn(gate) * up)


def _causal_mask(n: int, past: int, device: torch.device) -> torch.Tensor | None:
    """Row i sees every cached token and the new ones up to itself; None where SDPA needs no mask."""
    if n == 1 or past == 0:  # one row sees everything; a prompt alone is SDPA's own causal case
        return None
    return torch.ones(n, past + n, dtype=torch.bool, device=device).tril(past)[None, None]


@torch.inference_mode()
def forward(
    model: torch.nn.Module,
    ids: torch.Tensor,
    cache: StepCache,
    keep: int = 0,
    position_ids: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits [keep or n, vocab] for `ids` ([1, n]) after the cached tokens; as `forward.forward`."""
    past, n = cache.get_seq_length(), ids.shape[1]
    if position_ids is None:
        position_ids = torch.arange(past, past + n, device=ids.device)[None]
    return _pass(model, ids, position_ids, [_Part(cache, past, n, mask)], min(keep, n) if keep else n)


@torch.inference_mode()
def forward_batch(
    model: torch.nn.Module,
    ids: list[torch.Tensor],
    caches: list[StepCache],
    position_ids: list[torch.Tensor | None] | None = None,
    masks: list[torch.Tensor | None] | None = None,
) -> list[torch.Tensor]:
    """Logits [n_j, vocab] for each sequence's new tokens `ids[j]` ([1, n_j]) after its own cached
    ones, in one pass: the linear layers run over the rows of every sequence at once (where batching
    pays: the weights are read once for all of them), attention sequence by sequence. Each row gets
    the bits it gets in a pass of its sequence alone. A sequence checking a tree gives its
    `position_ids[j]` and `masks[j]` as `forward` takes them."""
    masks = masks or [None] * len(ids)
    parts = [
        _Part(cache, cache.get_seq_length(), t.shape[1], m)
        for t, cache, m in zip(ids, caches, masks, strict=True)
    ]
    device = ids[0].device
    given = position_ids or [None] * len(ids)
    positions = torch.cat(
        [
            torch.arange(p.past, p.past + p.n, device=device) if at is None else at.view(-1)
            for p, at in zip(parts, given, strict=True)
        ]
    )[None]
    logits = _pass(model, torch.cat(ids, dim=1), positions, parts, sum(p.n for p in parts))
    return list(logits.split([p.n for p in parts]))


def _pass(model: torch.nn.Module, ids, position_ids, parts: list[_Part], keep: int) -> torch.Tensor:
    """The logits of the last `keep` rows of `ids`, the rows of `parts` one after another."""
    inner = model.model
    hidden = inner.embed_tokens(ids)
    position = inner.rotary_emb(hidden, position_ids)
    alone = len(parts) == 1 and _prompt_alone(parts[0].past, parts[0].n)
    if hasattr(inner.layers[0], "kernel_weights") and not alone:
        head = _kernel_head(model, keep)
        hidden = _kernel_layers(inner, hidden, position, parts, head)
        if head is not None:
            return head[1]
    else:
        hidden = _module_layers(inner, hidden, position, parts)
    hidden = _norm(inner.norm, hidden[:, -keep:])
    return model.lm_head(hidden)[0]


def _prompt_alone(past: int, n: int) -> bool:
    # A prompt with nothing cached takes the modules with SDPA's flash attention,
    # which reads its keys in blocks: the kernel's attention, one query row at
    # a time, made a 1,500-token prompt 2.6 s slower (8.7 s against 6.1).
    # `kernel_attention` decides alike, so the model's own forward matches.
    return past == 0 and n > 1


def _kernel_stack(inner) -> ctypes.Array:
    # The layers' weights side by side for the kernel, built on first use for
    # each model: a self-draft's cut model (`drafts.cut_layers`) shares the
    # target's first layers, and with them their `kernel_weights`, not this.
    stack = inner.__dict__.get("_kernel_stack")
    if stack is None or len(stack) != len(inner.layers):
        stack = (_Layer * len(inner.layers))(*(layer.kernel_weights for layer in inner.layers))
        inner._kernel_stack = stack
        # The dicts that registering a hook adds to, to find hooked layers without going through the modules.
        inner._kernel_hooks = tuple(layer._forward_pre_hooks for layer in inner.layers)
    return stack


def _kernel_head(model: torch.nn.Module, keep: int) -> tuple[_Head, torch.Tensor] | None:
    """The final norm and output layer for the layer kernel to run after the last layer, and the logits
    [keep, vocab] they will fill; None where they are not the kernel's (the model's own modules run them)."""
    norm, head = model.model.norm, model.lm_head
    if not isinstance(norm, KernelRMSNorm) or not isinstance(head, RowLinear):
        return None
    # Allocated before the step: straight after it, with the caches full of weights, this took 85 microseconds.
    logits = head.weight.new_empty(keep, head.out_features)
    spec = _Head(
        _ptr(norm.weight), norm.eps, _ptr(head.weight), _ptr(head.panels()), _ptr(head.bias),
        head.in_features, head.out_features, keep, logits.data_ptr(),
    )  # fmt: skip
    return spec, logits


def _kernel_layers(
    inner, hidden, position, parts: list[_Part], head: tuple[_Head, torch.Tensor] | None = None
) -> torch.Tensor:
    """The layers' output, and `head`'s logits filled after the last layer where given."""
    cos, sin = (t[0].contiguous() for t in position)
    keys_like = hidden.new_empty(1, inner.config.num_key_value_heads, 0, inner.layers[0].self_attn.head_dim)
    views = [p.cache.kernel_view(p.past + p.n, keys_like) for p in parts]
    masks = [_mask(p.mask) for p in parts]  # their tensors stay alive through the calls
    for p in parts:  # before the call: after it, Python starts with its caches emptied
        for layer_cache in p.cache.layers:
            layer_cache.length = p.past + p.n
    firsts = [sum(p.n for p in parts[:j]) for j in range(len(parts))]
    segments = (_Segment * len(parts))()
    # One kernel call for the layers between two that have hooks (a draft head's
    # feature taps), which see their layer's input as in the model's own forward.
    stack = _kernel_stack(inner)
    hooked = [i for i, hooks in enumerate(inner._kernel_hooks) if hooks]
    first = 0
    for stop in (*hooked, len(inner.layers)):
        if stop > first:
            for j, p in enumerate(parts):  # each sequence's caches from this call's first layer on
                caches = ctypes.addressof(views[j]) + first * ctypes.sizeof(_LayerCacheView)
                segments[j] = _Segment(
                    firsts[j], p.n, p.past, ctypes.cast(caches, _CachesPointer), masks[j][0]
                )
            out = torch.empty_like(hidden)  # not in place: a hook may keep the input
            last = head is not None and stop == len(inner.layers)
            step = _Step(
                hidden.data_ptr(), out.data_ptr(), hidden.shape[1], 0, cos.data_ptr(), sin.data_ptr(), _Mask(0, None, 0),
                ctypes.pointer(head[0]) if last else None, len(parts), segments,
            )  # fmt: skip
            layers = ctypes.byref(stack, first * ctypes.sizeof(_Layer))
            library().llama_layers(layers, None, stop - first, ctypes.byref(step))
            hidden = out
        if stop < len(inner.layers):
            _run_pre_hooks(inner.layers[stop], hidden)
        first = stop
    return hidden


def _module_layers(inner, hidden, position, parts: list[_Part]) -> torch.Tensor:
    parts = [
        p if p.mask is not None else p._replace(mask=_causal_mask(p.n, p.past, hidden.device)) for p in parts
    ]
    for i, layer in enumerate(inner.layers):
        if layer._forward_pre_hooks:
            _run_pre_hooks(layer, hidden)
        hidden = hidden + _attention(layer, _norm(layer.input_layernorm, hidden), position, parts, i)
        hidden = hidden + _mlp(layer.mlp, _norm(layer.post_attention_layernorm, hidden))
    return hidden
