"""A Llama forward pass for decoding, without Hugging Face's per-call machinery.

On a CPU, a small model's step spends as long around its matrix products as
in them: building masks and output objects, the decoder layers' keyword
plumbing, and a KV cache that concatenates every layer's keys on every step.
This pass runs the model's own modules and functions (its norms, rotary
embedding, MLP and Hugging Face's SDPA attention) in a plain loop, over a
cache written in place (`StepCache`), so it computes what the model's own
forward computes, op for op, with less around it.

It serves the default CPU mode of Llama-architecture models (SmolLM2, the
tiny test models); other models, GPUs and compiled models take the model's
own forward (`forward.forward` chooses).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from .rowlinear import RowLinear


def fits(model: torch.nn.Module) -> bool:
    """True for a Llama on the CPU that attends through SDPA: the models this pass reproduces."""
    return (
        isinstance(model, LlamaForCausalLM)
        and model.config._attn_implementation == "sdpa"
        and model.get_output_embeddings().weight.device.type == "cpu"
    )


def fuse_projections(model: torch.nn.Module) -> None:
    """Give each layer one product for q, k and v and one for gate and up (`qkv_proj`, `gate_up_proj`).

    Only for linear layers run by SpecLens's kernel: its sums do not depend on
    which weight rows a call covers, so the fused products give the very bits
    the separate ones do. The separate modules stay, their weights now views
    into the fused ones (no memory added), for the model's own forward.
    """
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = _fused(attn.q_proj, attn.k_proj, attn.v_proj)
        attn.qkv_sizes = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
        mlp.gate_up_proj = _fused(mlp.gate_proj, mlp.up_proj)


def _fused(*parts: RowLinear) -> RowLinear:
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
    return RowLinear(fused)


class _LayerCache:
    """One layer's keys and values, [1, kv_heads, capacity, head_dim], valid up to `length`."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0

    @property
    def keys(self) -> torch.Tensor:
        return self.k[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        return self.v[:, :, : self.length]

    def write(self, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new keys and values at `start`; every valid key and value so far."""
        end = start + k.shape[2]
        if self.k is None or end > self.k.shape[2]:
            self._grow(k, v, max(256, 2 * end))
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


class StepCache:
    """A KV cache written in place, with the parts of `DynamicCache` the decoder uses:
    `get_seq_length`, `crop` and `layers[i].keys` / `.values` (views a token tree compacts)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.layers = [_LayerCache() for _ in model.model.layers]

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
    # dtype the module computes in (other dtypes take the module).
    if hidden.dtype != torch.float32:
        return norm(hidden)
    return torch.rms_norm(hidden, norm.weight.shape, norm.weight, norm.variance_epsilon)


def _attention(layer: torch.nn.Module, x, position, cache: _LayerCache, start: int, mask) -> torch.Tensor:
    attn = layer.self_attn
    shape = (*x.shape[:-1], -1, attn.head_dim)
    if hasattr(attn, "qkv_proj"):
        q, k, v = attn.qkv_proj(x).split(attn.qkv_sizes, dim=-1)
    else:
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
    q, k = apply_rotary_pos_emb(q, k, *position)
    k, v = cache.write(k, v, start)
    if mask is None:
        out, _ = sdpa_attention_forward(attn, q, k, v, None, scaling=attn.scaling)
    else:
        # With a mask (a check of k tokens, a tree) Hugging Face's SDPA copies the keys
        # and values once per query head, copies that grow with the context;
        # grouped-query SDPA reads them as they are and gives the same bits.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=True)
        out = out.transpose(1, 2)
    return attn.o_proj(out.reshape(*x.shape[:-1], -1).contiguous())


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
    inner = model.model
    past, n = cache.get_seq_length(), ids.shape[1]
    hidden = inner.embed_tokens(ids)
    if position_ids is None:
        position_ids = torch.arange(past, past + n, device=ids.device)[None]
    if mask is None:
        mask = _causal_mask(n, past, ids.device)
    position = inner.rotary_emb(hidden, position_ids)
    for layer, layer_cache in zip(inner.layers, cache.layers, strict=True):
        if layer._forward_pre_hooks:
            _run_pre_hooks(layer, hidden)
        hidden = hidden + _attention(
            layer, _norm(layer.input_layernorm, hidden), position, layer_cache, past, mask
        )
        hidden = hidden + _mlp(layer.mlp, _norm(layer.post_attention_layernorm, hidden))
    hidden = _norm(inner.norm, hidden[:, -keep:] if keep else hidden)
    return model.lm_head(hidden)[0]
