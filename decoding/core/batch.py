"""Many sequences at once: plain and speculative decoding of a batch, one target pass a step.

Up to `size` sequences decode together; one that finishes leaves and the next waiting prompt
joins (continuous batching), its prefill run on its own between two passes, never inside one.
Each sequence keeps its own cache, draft (a fork of the run's), policy and random generator,
and drafts, accepts, corrects and rolls back on its own through the single-sequence loop's
own functions (`speculative.py`), so each output is the one its own run gives. What batching
changes is the target pass: the rows of every sequence in one (`forward_batch`).

A pass's time is shared among its sequences by their rows: each round's `verify_s` is its
sequence's share, and the pass itself is kept whole in `BatchRun.passes`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

import torch

from ..runtime.forward import forward_batch
from ..settings.policies import Policy
from ..settings.sampling import Sampling
from ..trace import RunMeta, Trace
from .budget import RunStopped
from .plain import Clock, StopCheck, prefill
from .proposal import Draft, Proposal
from .record import RoundResult, record_round
from .speculative import (
    Decoder,
    chain_inputs,
    check_chain,
    check_tree,
    draft_chain,
    draft_chains,
    draft_tree,
    keep_agreed,
    keep_tree_path,
    tree_check_inputs,
)
from .tree import TokenTree, TreeShape
from .verify import warp


@dataclass
class Pass:
    """One target pass of a batched run: the rows it checked, for how many sequences, and its time."""

    rows: int
    sequences: int
    ms: float


@dataclass
class Request:
    """One sequence in flight: its tokens so far (prompt and output), its cache and its decoder."""

    index: int  # its prompt's place in the run's prompts
    seq: torch.Tensor  # [1, n]; plain decoding keeps only the last token, all its next pass reads
    cache: object
    dec: Decoder | None  # None: plain decoding
    policy: Policy | None
    generator: torch.Generator
    joined_s: float  # when its prefill started, from the run's start
    output: list[int] = field(default_factory=list)
    rounds: list[RoundResult] = field(default_factory=list)
    round_passes: list[int] = field(default_factory=list)  # each round's pass, in `BatchRun.passes`
    token_times_s: list[float] = field(default_factory=list)
    finished: bool = False


@dataclass
class BatchRun:
    """What a batched run made: per prompt, in the prompts' order, its output, its rounds (none
    for plain decoding) and when each token was ready (from the run's start); every pass."""

    outputs: list[list[int]]
    rounds: list[list[RoundResult]]
    round_passes: list[list[int]]  # each round's pass, in `passes`
    token_times_s: list[list[float]]
    joined_s: list[float]  # when each prompt's prefill started
    passes: list[Pass]
    wall_s: float  # the whole run: every prefill and every pass
    prefill_s: float
    size: int  # sequences decoded together at most


@dataclass
class BatchSettings:
    size: int  # sequences decoded together at most
    sampling: Sampling = field(default_factory=Sampling)
    max_new_tokens: int = 128
    eos_ids: Collection[int] = ()
    tree: TreeShape | None = None  # token trees of this shape, k deep; None: chains


def batch_generate(
    target: torch.nn.Module,
    prompts: Sequence[torch.Tensor],
    settings: BatchSettings,
    draft: Draft | None = None,
    policy: Callable[[], Policy] | None = None,
    should_stop: StopCheck | None = None,
) -> BatchRun:
    """Decode every prompt ([1, n] each) with at most `settings.size` at once: plainly where `draft` is
    None, else speculatively, each sequence drafting with its own fork of `draft` and its own `policy()`
    (chains, or trees of `settings.tree`'s shape; a round's k is the policy's, capped so no round
    passes `max_new_tokens`).

    `should_stop` is asked before every pass; a reason it gives raises RunStopped: a batch cut
    short measures nothing whole."""
    clock = Clock(prompts[0].device)
    waiting = list(range(len(prompts)))
    active: list[Request] = []
    done: dict[int, Request] = {}
    passes: list[Pass] = []
    start, prefill_s = clock(), 0.0
    while waiting or active:
        while waiting and len(active) < settings.size:
            t = clock()
            active.append(_join(target, prompts, waiting.pop(0), settings, draft, policy, t - start))
            prefill_s += clock() - t
        if should_stop is not None and (reason := should_stop()):
            raise RunStopped(reason)
        step = _speculative_step if draft is not None else _plain_step
        passes.append(step(target, active, settings, clock, start))
        for s in active:
            s.round_passes += [len(passes) - 1] * (len(s.rounds) - len(s.round_passes))
        for s in [s for s in active if s.finished]:
            active.remove(s)
            s.cache = None  # a static buffer's slot is free for the next sequence once its cache is gone
            done[s.index] = s
    ordered = [done[i] for i in range(len(prompts))]
    return BatchRun(
        [s.output for s in ordered],
        [s.rounds for s in ordered],
        [s.round_passes for s in ordered],
        [s.token_times_s for s in ordered],
        [s.joined_s for s in ordered],
        passes,
        clock() - start,
        prefill_s,
        settings.size,
    )


def batch_traces(run: BatchRun, metas: Sequence[RunMeta], token_text: Callable[[int], str]) -> list[Trace]:
    """Each sequence of a speculative batched run as a Trace (`metas[i]` says its prompt): its rounds
    as a single run's, each charged its share of the pass that checked it and keeping that pass's
    rows and time, its wall clock from its prefill's start to its last token."""
    traces = []
    for i, meta in enumerate(metas):
        trace = Trace(meta=replace(meta, batch_size=run.size, batch_sequence=i))
        for r, p in zip(run.rounds[i], run.round_passes[i], strict=True):
            rnd = record_round(r, token_text)
            rnd.draft_ms, rnd.verify_ms, rnd.round_ms = r.draft_s * 1e3, r.verify_s * 1e3, r.round_s * 1e3
            rnd.pass_rows, rnd.pass_ms = run.passes[p].rows, run.passes[p].ms
            trace.rounds.append(rnd)
        trace.output.token_ids = list(run.outputs[i])
        times = run.token_times_s[i]
        trace.finish(times[-1] - run.joined_s[i] if times else 0.0)
        traces.append(trace)
    return traces


def _join(target, prompts, index: int, settings: BatchSettings, draft, policy, now_s: float) -> Request:
    """A waiting prompt, prefilled on its own (with its draft watching, as a single run's)."""
    prompt = prompts[index]
    generator = torch.Generator(device=prompt.device).manual_seed(settings.sampling.seed + index)
    fork = dec = None
    if draft is not None:
        fork = draft.fork()
        eos = set(settings.eos_ids)
        dec = Decoder(target, fork, settings.sampling, generator, eos, Clock(prompt.device), settings.tree)
    cache = prefill(target, prompt, fork)
    return Request(index, prompt, cache, dec, policy() if policy else None, generator, now_s)


def _plain_step(target, active: list[Request], settings: BatchSettings, clock, start: float) -> Pass:
    """One token for every sequence: one pass over their last tokens."""
    t = clock()
    logits = forward_batch(target, [s.seq[:, -1:] for s in active], [s.cache for s in active])
    ms = (clock() - t) * 1e3
    for s, rows in zip(active, logits, strict=True):
        if settings.sampling.greedy:
            token = rows[-1].argmax()
        else:
            token = torch.multinomial(warp(rows[-1], settings.sampling), 1, generator=s.generator)[0]
        value = int(token)
        _extend(s, [value], value in settings.eos_ids, settings, clock() - start, last=token)
    return Pass(len(active), len(active), ms)


def _speculative_step(target, active: list[Request], settings: BatchSettings, clock, start: float) -> Pass:
    """One round for every sequence: each drafts (a chain or a tree), one pass checks all their
    drafts, and each keeps what its target rows agree with."""
    drafted, draft_s = (
        _draft_trees(active, settings, clock) if settings.tree else _draft_all(active, settings, clock)
    )
    inputs = [_check_inputs(s, d) for s, d in zip(active, drafted, strict=True)]
    rows = [ids.shape[1] for ids, _, _ in inputs]
    drafts = [s.dec.draft for s in active]
    ids, positions, masks = (list(column) for column in zip(*inputs, strict=True))
    t = clock()
    with drafts[0].watching_together(drafts, rows):
        logits = forward_batch(target, ids, [s.cache for s in active], positions, masks)
    pass_s = clock() - t
    for s, d, own, n, d_s in zip(active, drafted, logits, rows, draft_s, strict=True):
        t = clock()
        share = pass_s * n / sum(rows)
        # Timed from its third figure: this sequence's draft, its share of the pass and its
        # own verdict, not the other sequences' drafting.
        r = _settle(s, own, d, (d_s, share, t - d_s - share))
        s.policy.update(r.verdict.n_accepted, len(r.proposal))
        s.rounds.append(r)
        _extend(s, r.new_tokens, r.finished, settings, clock() - start)
    return Pass(sum(rows), len(active), pass_s * 1e3)


def _check_inputs(s: Request, drafted: Proposal | TokenTree) -> tuple:
    """The ids, position ids and mask of a sequence's rows in the check (None, None: a chain's own)."""
    if isinstance(drafted, TokenTree):
        return tree_check_inputs(s.dec, s.seq, drafted)
    return chain_inputs(s.seq, drafted), None, None


def _settle(s: Request, logits: torch.Tensor, drafted: Proposal | TokenTree, times) -> RoundResult:
    """Judge a sequence's draft by its rows of the pass and keep what was agreed."""
    if isinstance(drafted, TokenTree):
        return keep_tree_path(s.dec, s.cache, s.seq, drafted, check_tree(s.dec, logits, drafted), times)
    return keep_agreed(s.dec, s.cache, s.seq, drafted, check_chain(s.dec, logits, drafted), times)


def _draft_trees(
    active: list[Request], settings: BatchSettings, clock
) -> tuple[list[TokenTree], list[float]]:
    trees, seconds = [], []
    for s in active:
        t = clock()
        trees.append(
            draft_tree(s.dec, s.seq, min(s.policy.next_k(), settings.max_new_tokens - len(s.output) - 1))
        )
        seconds.append(clock() - t)
    return trees, seconds


def _draft_all(active: list[Request], settings: BatchSettings, clock) -> tuple[list[Proposal], list[float]]:
    """Every sequence's chain and its drafting seconds. A draft that drafts for all at once
    (`Draft.drafts_together`: a head's steps, a draft model's passes) takes one call, its time shared by the tokens each drafted."""
    ks = [min(s.policy.next_k(), settings.max_new_tokens - len(s.output) - 1) for s in active]
    if not active[0].dec.draft.drafts_together():
        proposals, seconds = [], []
        for s, k in zip(active, ks, strict=True):
            t = clock()
            proposals.append(draft_chain(s.dec, s.seq, k, s.policy.stop))
            seconds.append(clock() - t)
        return proposals, seconds
    t = clock()
    proposals = draft_chains(
        [s.dec for s in active], [s.seq for s in active], ks, [s.policy.stop for s in active]
    )
    spent = clock() - t
    drafted = [len(p) for p in proposals]
    total = sum(drafted)
    return proposals, [spent * n / total if total else spent / len(active) for n in drafted]


def _extend(
    s: Request,
    tokens: list[int],
    ended: bool,
    settings: BatchSettings,
    now_s: float,
    last: torch.Tensor | None = None,
) -> None:
    # Plain decoding's next pass reads only its last token (`last`): kept alone, not copied onto the
    # whole sequence each step, so batch 1 costs what the single loop does.
    if last is not None:
        s.seq = last.view(1, 1)
    else:
        s.seq = torch.cat([s.seq, torch.tensor([tokens], device=s.seq.device)], dim=1)
    s.output += tokens
    s.token_times_s += [now_s] * len(tokens)
    s.finished = ended or len(s.output) >= settings.max_new_tokens
