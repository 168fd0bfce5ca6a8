"""A static KV cache and decode steps replayed as CUDA graphs: the GPU path.

At batch 1 a small model's GPU step is bound by launching kernels from
Python (SmolLM2-135M's shape: 28 ms a step against a 0.07 ms memory limit on
an H200). gpt-fast's answer, taken here: the keys and values live in buffers
allocated once for the run's length, and each forward width the decoder uses
(1 token, k+1 for a chain, each tree size) is captured once as a
`torch.cuda.CUDAGraph` over static input buffers, then replayed. The inputs a
width needs are the token ids, their positions, the cache slots they are
written to and a boolean mask over the whole buffer, so a token tree's
ancestry is an input like any other, and rolling back moves a length and
copies nothing: rows past it are masked out and overwritten later.

`use_static(model, capacity, graphs)` gives a model this path; from then on
`forward.new_cache` hands out a `StaticCache` over its buffers and
`forward.forward` runs `step`. Without graphs (the CPU tests, `--no-graphs`
is the other way round: it leaves the model's own forward) the same pass
runs eagerly, op for op what the replay does. A prompt (more than
`MAX_GRAPH_WIDTH` tokens) is written through the same pass eagerly: the
prefill stays a single ordinary forward. The buffers are the model's: while
one cache holds them (a draft's, when the draft is the target's own model;
another session's run), `forward.new_cache` gives the next one the model's
own cache instead.

The pass serves Llama-architecture models (SmolLM2, Qwen2-style ones);
others keep their own forward.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM, Qwen2ForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from .llama import _run_pre_hooks

MAX_GRAPH_WIDTH = 65  # the widest pass captured: a 64-node tree and its root
_ATTR = "_speclens_static"


def fits(model: torch.nn.Module) -> bool:
    """A Llama-style model with full attention in every layer and its own forward (not compiled)."""
    types = getattr(model.config, "layer_types", None) or ["full_attention"]
    return (
        isinstance(model, LlamaForCausalLM | Qwen2ForCausalLM)
        and all(t == "full_attention" for t in types)
        and "forward" not in vars(model)
    )


class StaticCache:
    """One run's view of a model's static buffers: `length` rows are real. It has the parts of
    `DynamicCache` the decoder uses: `get_seq_length`, `crop` and `layers[i].keys` / `.values`."""

    def __init__(self, runner: StaticRunner) -> None:
        self.runner = runner
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """Keep the first `max_length` tokens; a negative value drops that many from the end."""
        if max_length < 0:
            max_length = self.length + max_length
        self.length = min(self.length, max_length)

    @property
    def layers(self) -> list[_LayerBuffers]:
        r = self.runner
        return [_LayerBuffers(r.keys[i], r.values[i]) for i in range(r.keys.shape[0])]


class _LayerBuffers:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values


class _Graph:
    """One captured width: its static inputs, the graph, and the outputs it fills."""

    def __init__(self, n: int, capacity: int, device: torch.device) -> None:
        self.ids = torch.zeros(1, n, dtype=torch.long, device=device)
        self.positions = torch.arange(n, device=device)[None]
        self.slots = torch.arange(n, device=device)
        self.mask = torch.ones(n, capacity, dtype=torch.bool, device=device).tril()[None, None]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple[torch.Tensor, list[torch.Tensor]] | None = None

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.ids, self.positions, self.slots, self.mask


class StaticRunner:
    """A model's static KV buffers and, on CUDA with `graphs`, its captured widths."""

    def __init__(self, model: torch.nn.Module, capacity: int, graphs: bool) -> None:
        self.model = model
        self.graphs = graphs and model.lm_head.weight.device.type == "cuda"
        self.captured: dict[tuple, _Graph] = {}
        self.replays = 0
        self.holder: weakref.ref | None = None  # the cache using the buffers
        self.pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        cfg, weight = self.model.config, self.model.lm_head.weight
        attn = self.model.model.layers[0].self_attn
        shape = (cfg.num_hidden_layers, 1, cfg.num_key_value_heads, capacity, attn.head_dim)
        self.keys = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.values = torch.zeros_like(self.keys)
        self.capacity = capacity
        self.captured.clear()  # a graph reads the buffers it was captured over
        self.weights_at = weight.data_ptr()

    def held(self) -> bool:
        """Whether a cache with rows in it still holds the buffers (a run under way, or one whose
        cache was kept): they are then neither reallocated nor written by a capture."""
        cache = self.holder() if self.holder is not None else None
        return cache is not None and cache.length > 0

    def fit(self, capacity: int) -> None:
        """Buffers of exactly `capacity` rows: attention reads all of them, masked, every step.
        Weights that moved (ZeroGPU places a model anew for each GPU call) are captured anew too."""
        moved = self.model.lm_head.weight.data_ptr() != self.weights_at
        if (capacity != self.capacity or moved) and not self.held():
            self._allocate(capacity)

    def grow(self, need: int) -> None:
        """Room for `need` rows, the rows already written kept."""
        if need <= self.capacity:
            return
        keys, values = self.keys, self.values
        self._allocate(max(need, 2 * self.capacity))
        self.keys[..., : keys.shape[-2], :] = keys
        self.values[..., : values.shape[-2], :] = values

    def new_cache(self) -> StaticCache | None:
        """A cache over the buffers, or None while another cache still holds them."""
        if self.holder is not None and self.holder() is not None:
            return None
        cache = StaticCache(self)
        self.holder = weakref.ref(cache)
        return cache

    def tapped(self) -> tuple[int, ...]:
        """The layers with forward pre-hooks (a draft head's feature tap): their inputs are outputs of the pass."""
        return tuple(i for i, layer in enumerate(self.model.model.layers) if layer._forward_pre_hooks)

    def run(
        self, ids, positions, slots, mask, keep: int, prompt: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The pass over given inputs: through a replayed graph of this width, captured on first
        use, except for a `prompt` (nothing cached yet), which runs as it is."""
        n, taps = ids.shape[1], self.tapped()
        if not self.graphs or n > MAX_GRAPH_WIDTH or prompt:
            return _pass(self, ids, positions, slots, mask, keep, taps)
        g = self.captured.get((n, keep, taps))
        if g is None:
            g = self.capture(n, keep, (ids, positions, slots, mask))
        for buffer, value in zip(g.inputs(), (ids, positions, slots, mask), strict=True):
            buffer.copy_(value)
        g.graph.replay()
        self.replays += 1
        logits, tapped = g.out
        return logits.clone(), [t.clone() for t in tapped]

    def capture(self, n: int, keep: int, inputs: tuple | None = None) -> _Graph:
        """Capture width `n` (logits for the last `keep` rows, all when 0). Run over `inputs` when
        given (the call that needs it: the warm-up runs compute its result), else over rows 0..n-1 of
        a cache nothing is using yet."""
        taps = self.tapped()
        g = _Graph(n, self.capacity, self.keys.device)
        if inputs is not None:
            for buffer, value in zip(g.inputs(), inputs, strict=True):
                buffer.copy_(value)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the first calls pick kernels and allocate workspaces
            for _ in range(2):
                _pass(self, *g.inputs(), keep, taps)
        torch.cuda.current_stream().wait_stream(side)
        g.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g.graph, pool=self.pool):
            g.out = _pass(self, *g.inputs(), keep, taps)
        self.captured[(n, keep, taps)] = g
        return g


def _pass(r: StaticRunner, ids, positions, slots, mask, keep: int, taps: tuple[int, ...]):
    """Logits for the last `keep` rows of `ids` (all when 0) and the inputs of the `taps` layers;
    the keys and values written to `slots`. Only ops with fixed shapes: it is what a graph replays."""
    inner = r.model.model
    hidden = inner.embed_tokens(ids)
    position = inner.rotary_emb(hidden, positions)
    tapped = []
    for i, layer in enumerate(inner.layers):
        if i in taps:
            tapped.append(hidden.clone())
        x = layer.input_layernorm(hidden)
        hidden = hidden + _attention(layer.self_attn, x, position, r.keys[i], r.values[i], slots, mask)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    hidden = inner.norm(hidden[:, -keep:] if keep else hidden)
    return r.model.lm_head(hidden)[0], tapped


def _attention(attn, x, position, keys, values, slots, mask) -> torch.Tensor:
    shape = (*x.shape[:-1], -1, attn.head_dim)
    q, k, v = (proj(x).view(shape).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    q, k = apply_rotary_pos_emb(q, k, *position)
    keys.index_copy_(2, slots, k)
    values.index_copy_(2, slots, v)
    gqa = attn.config.num_attention_heads != attn.config.num_key_value_heads
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=gqa)
    return attn.o_proj(out.transpose(1, 2).reshape(*x.shape[:-1], -1))


def use_static(model: torch.nn.Module, capacity: int, graphs: bool = True) -> StaticRunner | None:
    """Give `model` static buffers of `capacity` rows (and graphs on CUDA when `graphs`); None where
    the pass does not fit the model (it keeps its own forward)."""
    if not fits(model):
        return None
    runner = model.__dict__.get(_ATTR)
    if runner is None or runner.graphs != (graphs and model.lm_head.weight.device.type == "cuda"):
        runner = StaticRunner(model, capacity, graphs)
        model.__dict__[_ATTR] = runner
    runner.fit(capacity)
    return runner


def drop_static(model: torch.nn.Module) -> None:
    """Back to the model's own forward (and its buffers and graphs freed)."""
    model.__dict__.pop(_ATTR, None)


def runner_of(model: torch.nn.Module) -> StaticRunner | None:
    return model.__dict__.get(_ATTR)


def graphed(model: torch.nn.Module) -> bool:
    """Whether the model's steps are replayed from CUDA graphs."""
    runner = runner_of(model)
    return runner is not None and runner.graphs


def warm_up(model: torch.nn.Module, widths: Iterable[tuple[int, int]]) -> None:
    """Capture each width (n tokens, logits for the last `keep` rows or all when 0) now,
    before anything is timed."""
    runner = runner_of(model)
    if runner is None or not runner.graphs or runner.held():
        return
    with torch.inference_mode():
        for n, keep in widths:
            keep = 0 if keep >= n else keep  # as `step` asks for it
            if (n, keep, runner.tapped()) not in runner.captured:
                runner.capture(n, keep)
    torch.cuda.synchronize()


def step(
    cache: StaticCache,
    ids: torch.Tensor,
    keep: int = 0,
    position_ids: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """`forward.forward` over a static cache: logits [keep or n, vocab] for `ids` ([1, n])."""
    r, past, n = cache.runner, cache.length, ids.shape[1]
    r.grow(past + n)
    device = ids.device
    slots = torch.arange(past, past + n, device=device)
    positions = slots[None] if position_ids is None else position_ids
    allowed = torch.zeros(n, r.capacity, dtype=torch.bool, device=device)
    if mask is None:
        allowed[:, : past + n] = torch.ones(n, past + n, dtype=torch.bool, device=device).tril(past)
    else:  # a tree's additive mask over the cached rows and its own
        allowed[:, : past + n] = mask[0, 0] == 0
    keep = 0 if keep >= n else keep
    logits, tapped = r.run(ids, positions, slots, allowed[None, None], keep, prompt=past == 0)
    cache.length = past + n
    for i, hidden in zip(r.tapped(), tapped, strict=True):
        _run_pre_hooks(r.model.model.layers[i], hidden)
    return logits
