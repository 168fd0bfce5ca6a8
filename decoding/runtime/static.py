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

Many sequences at once (`core/batch.py`): the buffers have a slot per
sequence (`use_static(..., slots=B)`) and `step_batch` runs every slot's rows
in one pass of [B, n], each sequence's rows padded to the widest. A padded row,
or a slot no sequence holds, writes its key to the buffers' last row and reads
only that row, so it disturbs no sequence: that row is never a real one. One
graph per width serves the whole batch. On a GPU in bfloat16 a row's sums may
run in another order in a batch than alone, so a sequence's output can differ
from its own run's where two tokens nearly tie; on the CPU, in float32 or
float64, the tests hold it to its own run exactly.

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
    """One run's view of its slot of a model's static buffers: `length` rows are real. It has the
    parts of `DynamicCache` the decoder uses: `get_seq_length`, `crop` and `layers[i].keys` / `.values`."""

    def __init__(self, runner: StaticRunner, slot: int = 0) -> None:
        self.runner, self.slot = runner, slot
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
        r, s = self.runner, slice(self.slot, self.slot + 1)
        return [_LayerBuffers(r.keys[i, s], r.values[i, s]) for i in range(r.keys.shape[0])]


class _LayerBuffers:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values


class _Graph:
    """One captured width: its static inputs (a row per slot), the graph, and the outputs it fills."""

    def __init__(self, slots: int, n: int, capacity: int, device: torch.device) -> None:
        self.ids = torch.zeros(slots, n, dtype=torch.long, device=device)
        self.positions = torch.arange(n, device=device).repeat(slots, 1)
        self.writes = self.positions.clone()
        causal = torch.ones(n, capacity, dtype=torch.bool, device=device).tril()
        self.mask = causal.repeat(slots, 1, 1, 1)  # [slots, 1, n, capacity]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple[torch.Tensor, list[torch.Tensor]] | None = None

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.ids, self.positions, self.writes, self.mask


class StaticRunner:
    """A model's static KV buffers, a slot for each sequence, and, on CUDA with `graphs`, its
    captured widths."""

    def __init__(self, model: torch.nn.Module, capacity: int, graphs: bool, slots: int = 1) -> None:
        self.model = model
        self.graphs = graphs and model.lm_head.weight.device.type == "cuda"
        self.slots = slots
        self.captured: dict[tuple, _Graph] = {}
        self.replays = 0
        self.holders: list[weakref.ref | None] = [None] * slots  # the cache using each slot
        self.pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        cfg, weight = self.model.config, self.model.lm_head.weight
        attn = self.model.model.layers[0].self_attn
        shape = (cfg.num_hidden_layers, self.slots, cfg.num_key_value_heads, capacity, attn.head_dim)
        self.keys = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.values = torch.zeros_like(self.keys)
        self.capacity = capacity
        self.captured.clear()  # a graph reads the buffers it was captured over
        self.weights_at = weight.data_ptr()

    def _caches(self) -> list[StaticCache]:
        return [c for c in (h() if h is not None else None for h in self.holders) if c is not None]

    def held(self) -> bool:
        """Whether a cache with rows in it still holds a slot (a run under way, or one whose
        cache was kept): the buffers are then neither reallocated nor written by a capture."""
        return any(c.length > 0 for c in self._caches())

    def fit(self, capacity: int) -> None:
        """Buffers of exactly `capacity` rows: attention reads all of them, masked, every step.
        Weights that moved (ZeroGPU places a model anew for each GPU call) are captured anew too."""
        moved = self.model.lm_head.weight.data_ptr() != self.weights_at
        if (capacity != self.capacity or moved) and not self.held():
            self._allocate(capacity)

    def grow(self, need: int) -> None:
        """Room for `need` rows and the last row that padding writes to, the rows already written kept."""
        if need < self.capacity:
            return
        keys, values = self.keys, self.values
        self._allocate(max(need + 1, 2 * self.capacity))
        self.keys[..., : keys.shape[-2], :] = keys
        self.values[..., : values.shape[-2], :] = values

    def new_cache(self) -> StaticCache | None:
        """A cache over a free slot of the buffers, or None while every slot is held."""
        for slot, holder in enumerate(self.holders):
            if holder is None or holder() is None:
                cache = StaticCache(self, slot)
                self.holders[slot] = weakref.ref(cache)
                return cache
        return None

    def tapped(self) -> tuple[int, ...]:
        """The layers with forward pre-hooks (a draft head's feature tap): their inputs are outputs of the pass."""
        return tuple(i for i, layer in enumerate(self.model.model.layers) if layer._forward_pre_hooks)

    def run(
        self, ids, positions, writes, mask, keep: int, slot: int | None = None, prompt: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The pass over given inputs ([rows, n] each, the mask [rows, 1, n, capacity]): every slot's
        rows, through a replayed graph of this width, captured on first use; or one `slot`'s, or a
        `prompt` (nothing cached yet), run as they are."""
        n, taps = ids.shape[1], self.tapped()
        view = slice(None) if slot is None else slice(slot, slot + 1)
        if not self.graphs or n > MAX_GRAPH_WIDTH or prompt or ids.shape[0] != self.slots:
            return _pass(self, ids, positions, writes, mask, keep, taps, view)
        g = self.captured.get((n, keep, taps))
        if g is None:
            g = self.capture(n, keep, (ids, positions, writes, mask))
        for buffer, value in zip(g.inputs(), (ids, positions, writes, mask), strict=True):
            buffer.copy_(value)
        g.graph.replay()
        self.replays += 1
        logits, tapped = g.out
        return logits.clone(), [t.clone() for t in tapped]

    def capture(self, n: int, keep: int, inputs: tuple | None = None) -> _Graph:
        """Capture width `n` for every slot (logits for the last `keep` rows, all when 0). Run over
        `inputs` when given (the call that needs it: the warm-up runs compute its result), else over
        rows 0..n-1 of buffers nothing is using yet."""
        taps = self.tapped()
        g = _Graph(self.slots, n, self.capacity, self.keys.device)
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


def _pass(r: StaticRunner, ids, positions, writes, mask, keep: int, taps: tuple[int, ...], view=slice(None)):
    """Logits [rows, keep or n, vocab] for the last `keep` rows of each row of `ids` (all when 0)
    and the inputs [rows, n, hidden] of the `taps` layers; the keys and values written at `writes`
    of the slots in `view`. Only ops with fixed shapes: it is what a graph replays."""
    inner = r.model.model
    hidden = inner.embed_tokens(ids)
    position = inner.rotary_emb(hidden, positions)
    tapped = []
    for i, layer in enumerate(inner.layers):
        if i in taps:
            tapped.append(hidden.clone())
        x = layer.input_layernorm(hidden)
        keys, values = r.keys[i, view], r.values[i, view]
        hidden = hidden + _attention(layer.self_attn, x, position, keys, values, writes, mask)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    hidden = inner.norm(hidden[:, -keep:] if keep else hidden)
    return r.model.lm_head(hidden), tapped


def _attention(attn, x, position, keys, values, writes, mask) -> torch.Tensor:
    shape = (*x.shape[:-1], -1, attn.head_dim)
    q, k, v = (proj(x).view(shape).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    q, k = apply_rotary_pos_emb(q, k, *position)
    at = writes[:, None, :, None].expand_as(k)  # each row's cache row, per slot
    keys.scatter_(2, at, k)
    values.scatter_(2, at, v)
    gqa = attn.config.num_attention_heads != attn.config.num_key_value_heads
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=gqa)
    return attn.o_proj(out.transpose(1, 2).reshape(*x.shape[:-1], -1))


def use_static(
    model: torch.nn.Module, capacity: int, graphs: bool = True, slots: int = 1
) -> StaticRunner | None:
    """Give `model` static buffers of `capacity` rows for `slots` sequences (and graphs on CUDA when
    `graphs`); None where the pass does not fit the model (it keeps its own forward)."""
    if not fits(model):
        return None
    runner = model.__dict__.get(_ATTR)
    cuda_graphs = graphs and model.lm_head.weight.device.type == "cuda"
    if runner is None or runner.graphs != cuda_graphs or runner.slots != slots:
        runner = StaticRunner(model, capacity, graphs, slots)
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
    writes = torch.arange(past, past + n, device=device)[None]
    positions = writes if position_ids is None else position_ids
    allowed = torch.zeros(n, r.capacity, dtype=torch.bool, device=device)
    allowed[:, : past + n] = _allowed(past, n, mask, device)
    keep = 0 if keep >= n else keep
    # One slot's pass is the whole pass (and so a replayed graph) where the buffers have one slot.
    slot = None if r.slots == 1 else cache.slot
    logits, tapped = r.run(ids, positions, writes, allowed[None, None], keep, slot, prompt=past == 0)
    cache.length = past + n
    for i, hidden in zip(r.tapped(), tapped, strict=True):
        _run_pre_hooks(r.model.model.layers[i], hidden)
    return logits[0]


def step_batch(
    caches: list[StaticCache],
    ids: list[torch.Tensor],
    position_ids: list[torch.Tensor | None],
    masks: list[torch.Tensor | None],
) -> list[torch.Tensor]:
    """`forward.forward_batch` over caches of one runner's slots: one pass over every slot (a replayed
    graph), each sequence's rows padded to the widest; logits [n_j, vocab] for each sequence."""
    r = caches[0].runner
    ns = [t.shape[1] for t in ids]
    n, device = max(ns), ids[0].device
    r.grow(max(c.length + m for c, m in zip(caches, ns, strict=True)))
    pad = r.capacity - 1  # the row padding writes to and reads: never a real one
    tokens = torch.zeros(r.slots, n, dtype=torch.long)
    positions = torch.zeros(r.slots, n, dtype=torch.long)
    writes = torch.full((r.slots, n), pad, dtype=torch.long)
    allowed = torch.zeros(r.slots, n, r.capacity, dtype=torch.bool)
    allowed[:, :, pad] = True
    for c, t, m, at, tree in zip(caches, ids, ns, position_ids, masks, strict=True):
        past = c.length
        tokens[c.slot, :m] = t[0].cpu()
        writes[c.slot, :m] = torch.arange(past, past + m)
        positions[c.slot, :m] = writes[c.slot, :m] if at is None else at.view(-1).cpu()
        allowed[c.slot, :m, pad] = False
        allowed[c.slot, :m, : past + m] = _allowed(past, m, tree, "cpu")
    inputs = (x.to(device, non_blocking=True) for x in (tokens, positions, writes, allowed[:, None]))
    logits, tapped = r.run(*inputs, keep=0)
    for c, m in zip(caches, ns, strict=True):
        c.length += m
    for i, hidden in zip(r.tapped(), tapped, strict=True):
        rows = torch.cat([hidden[c.slot, :m] for c, m in zip(caches, ns, strict=True)])
        _run_pre_hooks(r.model.model.layers[i], rows[None])
    return [logits[c.slot, :m] for c, m in zip(caches, ns, strict=True)]


def _allowed(past: int, n: int, mask: torch.Tensor | None, device) -> torch.Tensor:
    """[n, past + n]: which cached and new rows each new row reads: causal, or a tree's additive
    mask ([1, 1, n, past + n], 0 where allowed)."""
    if mask is None:
        return torch.ones(n, past + n, dtype=torch.bool, device=device).tril(past)
    return (mask[0, 0] == 0).to(device)
