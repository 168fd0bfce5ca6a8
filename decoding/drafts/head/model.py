"""The EAGLE-3 draft head as a torch module, and its KV cache.

A head is one decoder layer that reads three of the target's own hidden
states (a low, a middle and a high layer, tapped while the target verifies)
together with the embedding of the next token, and predicts the token after
it from a reduced draft vocabulary. Its output feature feeds its next step,
so one target pass gives it what it needs to draft k tokens. The parameter
names, config keys and shapes are EAGLE-3's as vLLM and SGLang load them
(`fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`), so a published head
for a supported target loads too. Its files are `files.py`, its
draft source `draft.py`; training lives in decoding/tools/train_head.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int  # the target's
    draft_vocab_size: int
    aux_layers: tuple[int, int, int]  # target layers whose inputs the head reads
    # SpecLens's rope needs no table, but vLLM and SGLang size theirs by it.
    max_position_embeddings: int = 2048
    # The residual after attention is the normed feature (vLLM's `norm_before_residual`, the
    # `speculators` format's), not the feature itself (EAGLE-3's own).
    norm_before_residual: bool = False
    # A rotary scaling in transformers' keys, as (key, value) pairs ("rope_type": "llama3" for
    # Llama 3.1's heads); () for the plain rotary embedding at rope_theta.
    rope_scaling: tuple[tuple[str, object], ...] = ()

    @classmethod
    def for_target(cls, config, draft_vocab_size: int) -> HeadConfig:
        """The head EAGLE-3 puts on `config`'s model: its widths, layers 2, L/2 and L-3."""
        n = config.num_hidden_layers
        heads = config.num_attention_heads
        return cls(
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_attention_heads=heads,
            num_key_value_heads=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=_rope_theta(config),
            vocab_size=config.vocab_size,
            draft_vocab_size=draft_vocab_size,
            aux_layers=(min(2, n - 1), n // 2, max(n - 3, 0)),
            max_position_embeddings=getattr(config, "max_position_embeddings", None) or 2048,
        )


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(config, "rope_theta", 10000.0))


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


@functools.cache
def scaled_frequencies(c: HeadConfig) -> tuple[torch.Tensor, float]:
    """The inverse frequencies and the cos/sin factor of a scaled rotary embedding, as transformers
    computes them for a model with the head's attention and `rope_scaling`."""
    config = LlamaConfig(
        hidden_size=c.hidden_size,
        num_attention_heads=c.num_attention_heads,
        head_dim=c.head_dim,
        rope_theta=c.rope_theta,
        max_position_embeddings=c.max_position_embeddings,
        rope_scaling={k: list(v) if isinstance(v, tuple) else v for k, v in c.rope_scaling},
    )
    inv_freq, factor = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, None)
    return inv_freq.float(), float(factor)


def rotation(positions: torch.Tensor, c: HeadConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's rotary cos and sin ([n, head_dim], float32) at `positions` ([n])."""
    dim, factor = c.head_dim, 1.0
    if c.rope_scaling:
        inv_freq, factor = scaled_frequencies(c)
        inv_freq = inv_freq.to(positions.device)
    else:
        inv_freq = 1.0 / (
            c.rope_theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float) / dim)
        )
    freqs = positions.float()[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    if factor == 1.0:
        return emb.cos(), emb.sin()
    return emb.cos() * factor, emb.sin() * factor


def rope(x: torch.Tensor, positions: torch.Tensor, c: HeadConfig) -> torch.Tensor:
    """The head's rotary embedding of x ([..., n, head_dim]) at `positions` ([n])."""
    dim = x.shape[-1]
    cos, sin = (t.to(x.dtype) for t in rotation(positions, c))
    half = dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class HeadAttention(nn.Module):
    """Grouped-query attention whose input is twice the hidden width (embedding + feature)."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.c = c
        width = 2 * c.hidden_size
        self.q_proj = nn.Linear(width, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(width, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(width, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def project(self, x: torch.Tensor, positions: torch.Tensor):
        """q, k, v for the rows of x ([n, 2h]), rotated to their positions: [heads, n, d]."""
        c, n = self.c, x.shape[0]
        q = self.q_proj(x).view(n, c.num_attention_heads, c.head_dim).transpose(0, 1)
        k = self.k_proj(x).view(n, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        v = self.v_proj(x).view(n, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        return rope(q, positions, c), rope(k, positions, c), v

    def expand(self, kv: torch.Tensor) -> torch.Tensor:
        return kv.repeat_interleave(self.c.num_attention_heads // self.c.num_key_value_heads, dim=0)

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        return self.o_proj(attended.transpose(0, 1).reshape(attended.shape[1], -1))


class HeadMLP(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """EAGLE-3's decoder layer: attention over cat(norm(embedding), norm(feature))."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = HeadAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = HeadMLP(c)
        self.norm_before_residual = c.norm_before_residual

    def attention_input(self, emb: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        return torch.cat((self.input_layernorm(emb), self.hidden_norm(feature)), dim=-1)

    def finish(self, feature: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residual stream after attention's output, then the MLP."""
        residual = self.hidden_norm(feature) if self.norm_before_residual else feature
        h = residual + self.self_attn.output(attended)
        return h + self.mlp(self.post_attention_layernorm(h))


class HeadCache:
    """The head's own keys and values ([kv_heads, n, d]), rolled back like any draft's cache.

    Rows are written into buffers that grow by doubling: appending by
    concatenation copied the whole cache at every drafted token, which at
    1,500 cached rows cost as much as the rest of the head's step."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cache with k and v after its rows (views of its buffers, valid until the next append)."""
        end = self.length + k.shape[1]
        self.reserve(end, k)
        self.k[:, self.length : end] = k
        self.v[:, self.length : end] = v
        self.length = end
        return self.k[:, :end], self.v[:, :end]

    def reserve(self, end: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers ([kv_heads, capacity, d], like `like`), with room for `end` rows."""
        if self.k is None or end > self.k.shape[1]:
            self.k, self.v = (self._grown(old, like, end) for old in (self.k, self.v))
        return self.k, self.v

    def _grown(self, old: torch.Tensor | None, like: torch.Tensor, rows: int) -> torch.Tensor:
        heads, _, dim = like.shape
        buffer = like.new_empty(heads, max(2 * rows, 64), dim)
        if old is not None:
            buffer[:, : self.length] = old[:, : self.length]
        return buffer

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)


class EagleHead(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.c = c
        self.fc = nn.Linear(3 * c.hidden_size, c.hidden_size, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        # EAGLE-3's maps: target id = draft id + d2t[draft id]; t2d marks the target ids in use.
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))

    @property
    def draft_ids(self) -> torch.Tensor:
        """The target id of each draft-vocabulary entry."""
        return torch.arange(self.c.draft_vocab_size, device=self.d2t.device) + self.d2t

    def step(
        self,
        emb: torch.Tensor,
        feature: torch.Tensor,
        cache: HeadCache,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """New rows (embeddings [n, h] and features [n, h]) after the cached ones: their outputs.

        By default the rows follow one another; a tree's level gives each row its
        position and a bool `mask` [n, cached + n] of the rows it may see."""
        start = len(cache)
        if positions is None:
            positions = torch.arange(start, start + emb.shape[0], device=emb.device)
        attn = self.midlayer.self_attn
        q, k, v = attn.project(self.midlayer.attention_input(emb, feature), positions)
        keys, values = cache.append(k, v)
        n, total = q.shape[1], keys.shape[1]
        if mask is None:  # row i sees every cached row and the new rows up to itself
            mask = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(total - n)
        # With a batch dimension and enable_gqa, SDPA's fused CPU kernel reads each key head for
        # its query heads; without, a masked product over copied keys took 4× as long.
        attended = F.scaled_dot_product_attention(
            q[None], keys[None], values[None], attn_mask=mask, enable_gqa=True
        )[0]
        return self.midlayer.finish(feature, attended)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary."""
        return self.lm_head(self.norm(out))

    def step_logits(
        self,
        emb: torch.Tensor,
        feature: torch.Tensor,
        cache: HeadCache,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        keep: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`step`'s outputs [n, h] and the logits of the last `keep` of them: a drafting step."""
        out = self.step(emb, feature, cache, positions, mask)
        return out, self.logits(out[out.shape[0] - keep :])


# --- files -----------------------------------------------------------------
