"""Trained draft heads in the EAGLE-3 layout: the head, its files, and the draft source.

A head is one decoder layer that reads three of the target's own hidden
states (a low, a middle and a high layer, tapped while the target verifies)
together with the embedding of the next token, and predicts the token after
it from a reduced draft vocabulary. Its output feature feeds its next step,
so one target pass gives it what it needs to draft k tokens. The parameter
names, config keys and shapes are EAGLE-3's as vLLM and SGLang load them
(`fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`), so a published head
for a supported target loads too. Training lives in decoding/train_head.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .drafts import TOP_N, Draft, Proposal, empty_proposal
from .errors import SpecLensError
from .sampling import Sampling
from .tree import TokenTree, grow_tree, level_mask
from .verify import warp

HEADS_DIR = Path(__file__).resolve().parent.parent / "assets" / "heads"
MAX_HEAD_FILE_BYTES = 10_000_000  # a Space repository takes no larger file without LFS


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


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama's rotary embedding of x ([..., n, head_dim]) at `positions` ([n])."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float) / dim))
    freqs = positions.float()[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
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
        return rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta), v

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

    def attention_input(self, emb: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        return torch.cat((self.input_layernorm(emb), self.hidden_norm(feature)), dim=-1)

    def finish(self, feature: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residual stream after attention's output, then the MLP."""
        h = feature + self.self_attn.output(attended)
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
        if self.k is None or end > self.k.shape[1]:
            self.k, self.v = (self._grown(old, new, end) for old, new in ((self.k, k), (self.v, v)))
        self.k[:, self.length : end] = k
        self.v[:, self.length : end] = v
        self.length = end
        return self.k[:, :end], self.v[:, :end]

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
            rows = getattr(self.local, "rows", None)
            if rows is not None:
                hidden = args[0] if args else kwargs["hidden_states"]
                rows.setdefault(layer, []).append(hidden[0])

        return hook

    @contextlib.contextmanager
    def recording(self, rows: dict[int, list[torch.Tensor]]) -> Iterator[None]:
        """Target passes run in this block, on this thread, add their rows to `rows`."""
        self.local.rows = rows
        try:
            yield
        finally:
            self.local.rows = None

    def take(self, rows: dict[int, list[torch.Tensor]]) -> torch.Tensor:
        """Every row in `rows`, as [n, 3 × hidden], and `rows` emptied."""
        if not rows:
            return torch.empty(0)
        feats = torch.cat([torch.cat(rows[i], dim=0) for i in self.layers], dim=-1)
        rows.clear()
        return feats


class HeadDraft(Draft):
    """Drafts with a trained head reading the target's features; `kind` "head"."""

    kind = "head"
    drafts_trees = True

    def __init__(self, head: EagleHead, target: nn.Module, name: str) -> None:
        self.head = head
        self.embed = target.get_input_embeddings()
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        self.tap = FeatureTap.on(target, head.c.aux_layers)
        self.name = name
        self.cache = HeadCache()
        self.fed = 0  # target positions the head has read (its cache's real rows)
        self.rows: dict[int, list[torch.Tensor]] = {}  # tapped from the target, not yet read

    def reset(self) -> None:
        self.cache = HeadCache()
        self.fed = 0
        self.rows = {}

    def watching_target(self) -> contextlib.AbstractContextManager:
        return self.tap.recording(self.rows)

    def _read_target(self, seq: torch.Tensor) -> torch.Tensor | None:
        """Feed the head the target's new features: the output row that predicts the
        token after `seq`, or None when the features do not line up with `seq`."""
        feats = self.tap.take(self.rows)
        n = feats.shape[0]
        if n == 0 or self.fed + n != seq.shape[1] - 1:
            return None
        head = self.head
        dtype = head.fc.weight.dtype
        # Feature of position t, embedding of token t+1: the last row predicts the next token.
        emb = self.embed(seq[0, self.fed + 1 :]).to(dtype)
        out = head.step(emb, head.fc(feats.to(dtype)), self.cache)[-1:]
        self.fed += n
        return out

    @torch.inference_mode()
    def propose(self, seq, k, sampling, generator, min_confidence=None):
        out = self._read_target(seq)
        if out is None:
            return empty_proposal(seq.device)  # draft nothing
        head = self.head
        dtype = head.fc.weight.dtype
        draft_ids = head.draft_ids
        tokens, qs, dists, tops = [], [], [], []
        for _ in range(k):
            logits = head.logits(out)[0].float()
            if sampling.greedy:
                # Over the draft vocabulary only: the rest of the target's has probability 0.
                probs = logits.softmax(-1)
                pick = probs.argmax()
            else:
                full = self._full_width(logits, draft_ids, sampling)
                dists.append(full)
                probs = full[draft_ids]
                pick = torch.multinomial(probs, 1, generator=generator)[0]
            tokens.append(draft_ids[pick])
            qs.append(probs[pick])
            top = torch.topk(probs, min(TOP_N, probs.shape[0]))
            tops.append((top.values, draft_ids[top.indices]))
            if len(tokens) == k or (min_confidence is not None and probs.max().item() < min_confidence):
                break
            out = head.step(self.embed(tokens[-1].view(1)).to(dtype), out, self.cache)
        top = (torch.stack([t[0] for t in tops]), torch.stack([t[1] for t in tops]))
        return Proposal(torch.stack(tokens), torch.stack(qs), torch.stack(dists) if dists else None, top)

    def _full_width(
        self, draft_logits: torch.Tensor, draft_ids: torch.Tensor, sampling: Sampling
    ) -> torch.Tensor:
        # Sampling is verified against the target's whole vocabulary, so the draft's
        # distribution is spread over it, with 0 outside the draft vocabulary.
        logits = torch.full((self.vocab_size,), float("-inf"), device=draft_logits.device)
        logits[draft_ids] = draft_logits
        return warp(logits, sampling)

    @torch.inference_mode()
    def propose_tree(self, seq, depth, shape, stop_ids):
        """Each level is one head step over the nodes it expands: a node reads its own
        token's embedding and, as its feature, the output row that proposed it (EAGLE's
        draft-time input), seeing the real rows and its ancestors only."""
        root = self._read_target(seq)
        if root is None:
            return TokenTree()
        head, dtype = self.head, self.head.fc.weight.dtype
        outputs: dict[int, torch.Tensor] = {-1: root[0]}  # node -> the output row after it
        slots: dict[int, int] = {}

        def expand(tree: TokenTree, frontier: list[int]) -> list[list[tuple[int, float]]]:
            if frontier != [-1]:
                past = len(self.cache)
                ids = torch.tensor([tree.tokens[i] for i in frontier], device=seq.device)
                rows = head.step(
                    self.embed(ids).to(dtype),
                    torch.stack([outputs[tree.parents[i]] for i in frontier]),
                    self.cache,
                    positions=torch.tensor(
                        [self.fed - 1 + tree.depth(i) for i in frontier], device=seq.device
                    ),
                    mask=level_mask(tree, frontier, slots, self.fed, past).to(seq.device),
                )
                slots.update({node: past + j for j, node in enumerate(frontier)})
                outputs.update(zip(frontier, rows))
            probs = head.logits(torch.stack([outputs[i] for i in frontier])).float().softmax(-1)
            top = torch.topk(probs, min(shape.branch, probs.shape[-1]))
            ids = head.draft_ids[top.indices]
            return [list(zip(i.tolist(), p.tolist())) for p, i in zip(top.values, ids)]

        try:
            return grow_tree(expand, depth, shape, stop_ids)
        finally:
            self.cache.crop(self.fed)

    def rollback(self, length: int, rows: list[int] | None = None) -> None:
        # Only the rows the target read from its own features are real; the
        # drafted rows go. Of the tapped rows, those past `length` (or, after a
        # tree round, those not in `rows`) were refused.
        self.cache.crop(self.fed)
        keep = length - self.fed
        for i, parts in self.rows.items():
            tapped = torch.cat(parts, dim=0)
            self.rows[i] = [tapped[:keep] if rows is None else tapped[rows]]


# --- files -----------------------------------------------------------------

PARAM_SHAPES = {
    "fc.weight": lambda c: (c.hidden_size, 3 * c.hidden_size),
    "midlayer.input_layernorm.weight": lambda c: (c.hidden_size,),
    "midlayer.hidden_norm.weight": lambda c: (c.hidden_size,),
    "midlayer.post_attention_layernorm.weight": lambda c: (c.hidden_size,),
    "midlayer.self_attn.q_proj.weight": lambda c: (c.num_attention_heads * c.head_dim, 2 * c.hidden_size),
    "midlayer.self_attn.k_proj.weight": lambda c: (c.num_key_value_heads * c.head_dim, 2 * c.hidden_size),
    "midlayer.self_attn.v_proj.weight": lambda c: (c.num_key_value_heads * c.head_dim, 2 * c.hidden_size),
    "midlayer.self_attn.o_proj.weight": lambda c: (c.hidden_size, c.num_attention_heads * c.head_dim),
    "midlayer.mlp.gate_proj.weight": lambda c: (c.intermediate_size, c.hidden_size),
    "midlayer.mlp.up_proj.weight": lambda c: (c.intermediate_size, c.hidden_size),
    "midlayer.mlp.down_proj.weight": lambda c: (c.hidden_size, c.intermediate_size),
    "norm.weight": lambda c: (c.hidden_size,),
    "lm_head.weight": lambda c: (c.draft_vocab_size, c.hidden_size),
    "d2t": lambda c: (c.draft_vocab_size,),
    "t2d": lambda c: (c.vocab_size,),
}


def fingerprint(target: nn.Module) -> str:
    """A short hash of some of the target's weights, the same in float32 and bfloat16."""
    h = hashlib.sha256()
    parts = [
        target.get_input_embeddings().weight[:256],
        target.model.layers[-1].mlp.down_proj.weight[:16],
        target.model.norm.weight,
    ]
    for t in parts:
        rounded = t.detach().to("cpu", torch.bfloat16).float().contiguous()
        h.update(str(tuple(t.shape)).encode())
        h.update(rounded.numpy().tobytes())
    return h.hexdigest()[:16]


def head_config_json(c: HeadConfig, speclens: dict | None = None) -> dict:
    """config.json in EAGLE-3's keys (what vLLM and SGLang read), plus SpecLens's own block."""
    out = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(c.aux_layers)},
    }
    if speclens:
        out["speclens"] = speclens
    return out


def save_head(head: EagleHead, folder: Path, speclens: dict, dtype: torch.dtype = torch.float16) -> None:
    """Safetensors shards (HF's model-0000N-of-0000M naming), none over 10 MB, and config.json."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("model*.safetensors*"):
        old.unlink()
    state = {
        name: t.detach().cpu().contiguous()
        if t.dtype in (torch.long, torch.bool)
        else t.detach().cpu().to(dtype)
        for name, t in head.state_dict().items()
    }
    shards: list[dict[str, torch.Tensor]] = [{}]
    for name, t in state.items():
        size = t.numel() * t.element_size()
        if shards[-1] and sum(x.numel() * x.element_size() for x in shards[-1].values()) + size > 9_000_000:
            shards.append({})
        shards[-1][name] = t
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    (folder / "config.json").write_text(json.dumps(head_config_json(head.c, speclens), indent=2) + "\n")


def _read_state(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if files:
        state = {}
        for f in files:
            state.update(load_file(str(f)))
        return state
    bins = sorted(folder.glob("*.bin"))
    if bins:
        state = {}
        for f in bins:
            state.update(torch.load(f, map_location="cpu", weights_only=True))
        return state
    raise SpecLensError(f"head folder {folder.name}: no .safetensors or .bin weights")


def read_head_config(folder: Path, target_config) -> tuple[HeadConfig, dict]:
    """The head's config from config.json, checked against the target's model config."""
    path = folder / "config.json"
    if not path.is_file():
        raise SpecLensError(f"head folder '{folder}' has no config.json (is it a head folder?)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecLensError(f"head config.json is not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or "draft_vocab_size" not in raw:
        raise SpecLensError("head config.json has no draft_vocab_size: not an EAGLE-3 head")
    if (
        not isinstance(raw["draft_vocab_size"], int)
        or not 0 < raw["draft_vocab_size"] <= target_config.vocab_size
    ):
        raise SpecLensError(
            f"head draft_vocab_size {raw['draft_vocab_size']!r} is not a size within the vocabulary"
        )
    if raw.get("hidden_size") != target_config.hidden_size:
        raise SpecLensError(
            f"this head is for a target with hidden size {raw.get('hidden_size')}, "
            f"the target has {target_config.hidden_size}"
        )
    if raw.get("vocab_size") != target_config.vocab_size:
        raise SpecLensError(
            f"this head is for a vocabulary of {raw.get('vocab_size')} tokens, the target has {target_config.vocab_size}"
        )
    base = HeadConfig.for_target(target_config, int(raw["draft_vocab_size"]))
    eagle = raw.get("eagle_config")
    layers = (
        eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    ) or base.aux_layers
    n_layers = target_config.num_hidden_layers
    if (
        not isinstance(layers, list | tuple)
        or len(layers) != 3
        or not all(isinstance(i, int) and 0 <= i < n_layers for i in layers)
    ):
        raise SpecLensError(f"head reads target layers {layers}, the target has {n_layers}")
    try:
        return _head_config(raw, base, tuple(layers)), raw
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise SpecLensError(f"head config.json has a malformed value: {exc}") from None


def _head_config(raw: dict, base: HeadConfig, layers: tuple[int, ...]) -> HeadConfig:
    heads = int(raw.get("num_attention_heads", base.num_attention_heads))
    if heads % int(raw.get("num_key_value_heads", base.num_key_value_heads)):
        raise ValueError("num_key_value_heads must divide num_attention_heads")
    return HeadConfig(
        hidden_size=base.hidden_size,
        intermediate_size=int(raw.get("intermediate_size", base.intermediate_size)),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads", base.num_key_value_heads)),
        head_dim=int(raw.get("head_dim") or base.hidden_size // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", base.rms_norm_eps)),
        rope_theta=float(raw.get("rope_theta", base.rope_theta)),
        vocab_size=base.vocab_size,
        draft_vocab_size=base.draft_vocab_size,
        aux_layers=layers,
    )


def load_head(folder: str | Path, target: nn.Module, device: torch.device, dtype: torch.dtype) -> EagleHead:
    """A head from its folder, refused with one line if it does not fit `target`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecLensError(f"no head folder at '{folder}'")
    c, raw = read_head_config(folder, target.config)
    want = (raw.get("speclens") or {}).get("fingerprint")
    if want and want != (have := fingerprint(target)):
        raise SpecLensError(
            f"this head was trained for other weights (fingerprint {want}, the target's is {have})"
        )
    try:
        state = _read_state(folder)
    except SpecLensError:
        raise
    except Exception as exc:  # a truncated or foreign file
        raise SpecLensError(
            f"head weights in '{folder.name}' cannot be read: {str(exc).splitlines()[0]}"
        ) from None
    state.pop("embed_tokens.weight", None)  # some published heads carry the target's embedding
    for name, shape_of in PARAM_SHAPES.items():
        if name not in state:
            raise SpecLensError(f"head weights lack '{name}': not the EAGLE-3 layout")
        if tuple(state[name].shape) != shape_of(c):
            raise SpecLensError(
                f"head weight '{name}' has shape {tuple(state[name].shape)}, expected {shape_of(c)}"
            )
    extra = sorted(set(state) - set(PARAM_SHAPES))
    if extra:
        raise SpecLensError(f"head weights have '{extra[0]}', which EAGLE-3's layout does not")
    draft_ids = torch.arange(c.draft_vocab_size) + state["d2t"].long()
    if draft_ids.min() < 0 or draft_ids.max() >= c.vocab_size:
        raise SpecLensError("head d2t maps draft tokens outside the target's vocabulary")
    head = EagleHead(c)
    head.load_state_dict(
        {n: t.to(torch.long) if n == "d2t" else t.bool() if n == "t2d" else t for n, t in state.items()}
    )
    return head.to(device=device, dtype=dtype).eval()


def shipped_head(target_name: str) -> Path:
    """assets/heads/<target preset>: the head SpecLens trained for it."""
    folder = HEADS_DIR / target_name
    if not (folder / "config.json").is_file():
        raise SpecLensError(
            f"no trained head ships for '{target_name}' (see assets/heads/; or use head:PATH)"
        )
    return folder
