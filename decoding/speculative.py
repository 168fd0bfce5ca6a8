"""The speculative loop and the plain autoregressive baseline.

Read top to bottom: `speculative_round` is one round (draft, check in one
target pass, keep the agreed prefix), `iter_rounds` runs rounds until the
text ends, `iter_trace` records each round into a Trace as it comes, and
`speculative_generate` runs one to the end. Both loops keep the same
invariant: the target's KV cache holds every token of `seq` but the last,
which is fed at the start of the next forward pass.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from .drafts import TOP_N, Draft, Proposal, empty_proposal
from .forward import crop, forward, new_cache
from .policies import Policy
from .sampling import Sampling
from .trace import (
    DraftToken,
    Emitted,
    Round,
    RunMeta,
    TopToken,
    Totals,
    Trace,
    TreeNode,
    Verdict,
    verdict_kind,
)
from .tree import TokenTree, TreeShape, TreeVerdict, keep_path, tree_inputs, verify_tree
from .verify import Verification, verify_greedy, verify_sampling, warp

# Asked after every round (and before every plain token): a reason to stop now, or None.
StopCheck = Callable[[], str | None]


class PlainRun(NamedTuple):
    token_ids: list[int]
    wall_s: float
    token_times_s: list[float]  # when each token was ready, from the start
    stopped: str | None = None  # why it ended early, if it did


class Clock:
    """Wall clock in seconds; waits for the GPU first so timings are real."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


@dataclass
class Decoder:
    """What every round of one run shares."""

    target: torch.nn.Module
    draft: Draft
    sampling: Sampling
    generator: torch.Generator
    eos: set[int]
    clock: Clock
    tree: TreeShape | None = None  # None: chains


class RoundResult(NamedTuple):
    """One round as the loop saw it; the verdict's tensors are still on the device."""

    proposal: Proposal
    verdict: Verification
    new_tokens: list[int]  # what the round added to the output
    emitted: int | None  # the target's own token; None when an accepted EOS ended the text
    finished: bool  # the text ended (EOS) in this round
    draft_s: float
    verify_s: float
    round_s: float
    elapsed_s: float = 0.0  # decoding time since the start, prefill included; the consumer's is not
    # A tree round: the tree and its verdict. `proposal` and `verdict` are then its main
    # line: the accepted path and the best child refused after it.
    tree: tuple[TokenTree, TreeVerdict] | None = None


def _prefill(target: torch.nn.Module, prompt_ids: torch.Tensor, draft: Draft | None = None):
    cache = new_cache(target)
    if prompt_ids.shape[1] > 1:
        with draft.watching_target() if draft else contextlib.nullcontext():
            forward(target, prompt_ids[:, :-1], cache, keep=1)
    return cache


def speculative_round(
    dec: Decoder, cache, seq: torch.Tensor, k: int, min_confidence: float | None = None
) -> RoundResult:
    """Draft up to k tokens after `seq`, check them all in one target pass, keep the agreed prefix
    and the target's own next token. Afterwards the target's cache and the draft's hold exactly
    `seq` plus the accepted drafts."""
    t0 = dec.clock()
    proposal = dec.draft.propose(seq, k, dec.sampling, dec.generator, min_confidence) if k > 0 else None
    proposal = _cut_after_eos(proposal or empty_proposal(seq.device), dec.eos)
    t1 = dec.clock()
    candidates = torch.cat([seq[:, -1:], proposal.tokens.view(1, -1)], dim=1)
    with dec.draft.watching_target():
        logits = forward(dec.target, candidates, cache)
    verdict = _verify(logits, proposal, dec.sampling, dec.generator)
    t2 = dec.clock()

    n = verdict.n_accepted
    kept = proposal.tokens[:n].tolist()
    emitted = int(verdict.emitted)
    ended_in_draft = bool(dec.eos & set(kept))  # an accepted EOS: no token after it
    crop(cache, seq.shape[1] + n)
    dec.draft.rollback(seq.shape[1] + n)
    return RoundResult(
        proposal,
        verdict,
        kept if ended_in_draft else [*kept, emitted],
        None if ended_in_draft else emitted,
        ended_in_draft or emitted in dec.eos,
        t1 - t0,
        t2 - t1,
        dec.clock() - t0,
    )


def tree_round(dec: Decoder, cache, seq: torch.Tensor, depth: int) -> RoundResult:
    """Draft a tree up to `depth` deep, check every node in one target pass, keep the
    longest path the target agrees with; the caches afterwards as in `speculative_round`."""
    t0 = dec.clock()
    tree = dec.draft.propose_tree(seq, depth, dec.tree, dec.eos) if depth > 0 else TokenTree()
    t1 = dec.clock()
    start = seq.shape[1]
    ids, positions, mask = tree_inputs(tree, seq[0, -1], start - 1, dec.target.dtype)
    with dec.draft.watching_target():
        logits = forward(dec.target, ids, cache, position_ids=positions, mask=mask)
    greedy = dec.sampling.greedy
    probs = logits.float().softmax(-1) if greedy else warp(logits, dec.sampling)
    verdict = verify_tree(logits, tree, probs, None if greedy else dec.generator)
    t2 = dec.clock()

    kept = [tree.tokens[i] for i in verdict.path]
    ended_in_draft = bool(kept) and kept[-1] in dec.eos  # a stop token's node has no children
    keep_path(cache, start, [start + i for i in verdict.path])
    dec.draft.rollback(start + len(kept), rows=[0] + [1 + i for i in verdict.path])
    proposal, line = _main_line(tree, verdict, ended_in_draft, greedy, seq.device)
    return RoundResult(
        proposal,
        line,
        kept if ended_in_draft else [*kept, verdict.emitted],
        None if ended_in_draft else verdict.emitted,
        ended_in_draft or verdict.emitted in dec.eos,
        t1 - t0,
        t2 - t1,
        dec.clock() - t0,
        tree=(tree, verdict),
    )


def _main_line(
    tree: TokenTree, v: TreeVerdict, ended: bool, greedy: bool, device: torch.device
) -> tuple[Proposal, Verification]:
    """The tree round seen as a chain: the accepted path, then the best child refused after it."""
    turn = tree.children(v.path[-1] if v.path else -1)
    line = v.path + ([turn[0]] if turn and not ended else [])
    judged = [v.judged[i] for i in line]

    def tensor(values: list, dtype=torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    proposal = Proposal(
        tensor([tree.tokens[i] for i in line], torch.long), tensor([tree.q[i] for i in line]), None
    )
    return proposal, Verification(
        len(v.path),
        tensor([j.p for j in judged]),
        tensor([j.accept_prob for j in judged]),
        None if greedy else tensor([j.u for j in judged]),
        tensor(v.emitted, torch.long),
        tensor(v.p_emitted),
        v.dist,
        v.residual,
    )


def iter_rounds(
    target: torch.nn.Module,
    prompt_ids: torch.Tensor,
    draft: Draft,
    policy: Policy,
    sampling: Sampling = Sampling(),
    max_new_tokens: int = 128,
    eos_ids: Collection[int] = (),
    tree: TreeShape | None = None,
) -> Iterator[RoundResult]:
    """Prefill, then round after round until EOS or `max_new_tokens`; token trees of
    `tree`'s shape, k deep, when it is given.

    `prompt_ids` is [1, n] on the target's device. Time the consumer spends
    between rounds is left out of `elapsed_s`: a UI that draws each round
    does not slow the figures down. Closing the generator ends the run.
    """
    device = prompt_ids.device
    clock = Clock(device)
    generator = torch.Generator(device=device).manual_seed(sampling.seed)
    dec = Decoder(target, draft, sampling, generator, set(eos_ids), clock, tree)
    start, away = clock(), 0.0
    draft.reset()  # before the prefill: a head draft reads the target's prefill features
    cache = _prefill(target, prompt_ids, draft)
    seq, produced = prompt_ids, 0
    while produced < max_new_tokens:
        # Leave room for the token the target adds, so a round never overshoots.
        k = min(policy.next_k(), max_new_tokens - produced - 1)
        if tree is None:
            r = speculative_round(dec, cache, seq, k, policy.min_confidence)
        else:
            r = tree_round(dec, cache, seq, k)
        policy.update(r.verdict.n_accepted, len(r.proposal))
        seq = torch.cat([seq, torch.tensor([r.new_tokens], device=device)], dim=1)
        produced += len(r.new_tokens)
        left = clock()
        yield r._replace(elapsed_s=left - start - away)
        away += clock() - left
        if r.finished:
            return


def iter_trace(
    target: torch.nn.Module,
    prompt_ids: torch.Tensor,
    draft: Draft,
    policy: Policy,
    sampling: Sampling = Sampling(),
    max_new_tokens: int = 128,
    eos_ids: Collection[int] = (),
    token_text: Callable[[int], str] = str,
    meta: RunMeta | None = None,
    should_stop: StopCheck | None = None,
    tree: TreeShape | None = None,
) -> Iterator[Trace]:
    """The run as a Trace that grows by one Round per round: yielded after each
    round, and once more when finished (totals set), so the last one is whole.

    `should_stop` is asked after every round but the last (so a budget's
    clock starts once decoding has begun); a reason it gives ends the run
    there, recorded as `meta.stopped`, with the rounds so far intact.
    """
    trace = Trace(meta=replace(meta) if meta else RunMeta())
    wall = recording = 0.0
    reason = None
    for r in iter_rounds(target, prompt_ids, draft, policy, sampling, max_new_tokens, eos_ids, tree):
        t = time.perf_counter()
        rnd = record_round(r, token_text)
        spent = time.perf_counter() - t  # what tracing costs counts in the figures
        rnd.draft_ms, rnd.verify_ms, rnd.round_ms = (
            r.draft_s * 1e3,
            r.verify_s * 1e3,
            (r.round_s + spent) * 1e3,
        )
        recording += spent
        wall = r.elapsed_s + recording
        trace.rounds.append(rnd)
        trace.output.token_ids.extend(r.new_tokens)
        yield trace
        ended = r.finished or len(trace.output.token_ids) >= max_new_tokens
        if not ended and should_stop is not None and (reason := should_stop()):
            break
    if reason:
        trace.meta.stopped = reason
    trace.finish(wall)
    yield trace


def speculative_generate(
    target: torch.nn.Module,
    prompt_ids: torch.Tensor,
    draft: Draft,
    policy: Policy,
    sampling: Sampling = Sampling(),
    max_new_tokens: int = 128,
    eos_ids: Collection[int] = (),
    token_text: Callable[[int], str] = str,
    meta: RunMeta | None = None,
    should_stop: StopCheck | None = None,
    tree: TreeShape | None = None,
) -> Trace:
    """Draft, verify, repeat to the end; returns the full Trace of the run (see `iter_trace`)."""
    for trace in iter_trace(  # noqa: B007 - the last one yielded is the finished trace
        target,
        prompt_ids,
        draft,
        policy,
        sampling,
        max_new_tokens,
        eos_ids,
        token_text,
        meta,
        should_stop,
        tree,
    ):
        pass
    return trace


def untraced_generate(
    target: torch.nn.Module,
    prompt_ids: torch.Tensor,
    draft: Draft,
    policy: Policy,
    sampling: Sampling = Sampling(),
    max_new_tokens: int = 128,
    eos_ids: Collection[int] = (),
    tree: TreeShape | None = None,
) -> Trace:
    """The same rounds with nothing recorded but the totals: the benchmark's measure of what
    tracing costs."""
    output: list[int] = []
    wall, rounds, proposed, accepted = 0.0, 0, 0, 0
    for r in iter_rounds(target, prompt_ids, draft, policy, sampling, max_new_tokens, eos_ids, tree):
        output += r.new_tokens
        wall, rounds = r.elapsed_s, rounds + 1
        proposed, accepted = proposed + len(r.proposal), accepted + r.verdict.n_accepted
    trace = Trace(totals=Totals.of_counts(rounds, len(output), proposed, accepted, wall))
    trace.output.token_ids = output
    return trace


def _cut_after_eos(proposal: Proposal, eos: set[int]) -> Proposal:
    # Nothing follows an end-of-sequence token, so drafting past it is moot.
    if not eos or not len(proposal):
        return proposal
    ids = proposal.tokens.tolist()
    for i, t in enumerate(ids):
        if t in eos:
            return proposal.truncate(i + 1)
    return proposal


def _verify(
    logits: torch.Tensor, proposal: Proposal, sampling: Sampling, generator: torch.Generator
) -> Verification:
    if sampling.greedy:
        return verify_greedy(logits, proposal.tokens)
    return verify_sampling(warp(logits, sampling), proposal.tokens, proposal.dists, generator)


def record_round(r: RoundResult, token_text: Callable[[int], str]) -> Round:
    """The Trace's view of a round: every draft token, its verdict, and where the round turned."""
    proposal, v, emitted = r.proposal, r.verdict, r.emitted
    ids = proposal.tokens.tolist()
    n = v.n_accepted
    # Past the first refused token nothing was judged: the target scored those
    # after a prefix it had refused, so their numbers are not recorded.
    p = v.p.tolist()[: n + 1]
    accept_prob = v.accept_prob.tolist()[: n + 1]
    u = v.u.tolist()[: n + 1] if v.u is not None else []
    judged = range(min(n + 1, len(ids)))
    verdicts = [Verdict(p[j], accept_prob[j], u[j] if u else None, j < n, verdict_kind(j, n)) for j in judged]
    verdicts += [Verdict(None, None, None, False, "discarded") for _ in range(n + 1, len(ids))]
    return Round(
        k=len(ids),
        draft=[DraftToken(t, token_text(t), qi) for t, qi in zip(ids, proposal.q.tolist())],
        verdicts=verdicts,
        n_accepted=n,
        emitted=None
        if emitted is None
        else Emitted(
            emitted, token_text(emitted), "bonus" if n == len(ids) else "correction", float(v.p_emitted)
        ),
        draft_ms=0.0,
        verify_ms=0.0,
        round_ms=0.0,
        target_top=_top_of(v.dist, token_text),
        # The draft's favourites at the refused position; a bonus position has none.
        draft_top=None
        if n >= len(ids) or proposal.top is None
        else _top(proposal.top[0][n], proposal.top[1][n], token_text),
        residual_top=None if v.residual is None else _top_of(v.residual, token_text),
        match=proposal.match,
        tree=None if r.tree is None else _tree_nodes(*r.tree, token_text),
        translation=proposal.translation,
    )


def _tree_nodes(tree: TokenTree, v: TreeVerdict, token_text: Callable[[int], str]) -> list[TreeNode]:
    path = set(v.path)
    return [
        TreeNode(
            id=t,
            text=token_text(t),
            q=tree.q[i],
            parent=tree.parents[i],
            depth=tree.depth(i),
            p=v.judged[i].p if i in v.judged else None,
            accepted=i in path,
        )
        for i, t in enumerate(tree.tokens)
    ]


def _top(probs: torch.Tensor, ids: torch.Tensor, token_text: Callable[[int], str]) -> list[TopToken]:
    return [TopToken(i, token_text(i), p) for i, p in zip(ids.tolist(), probs.tolist())]


def _top_of(dist: torch.Tensor, token_text: Callable[[int], str]) -> list[TopToken]:
    """The TOP_N most likely tokens of a distribution."""
    return _top(*torch.topk(dist.float(), min(TOP_N, dist.shape[-1])), token_text)


def autoregressive_generate(
    target: torch.nn.Module,
    prompt_ids: torch.Tensor,
    sampling: Sampling = Sampling(),
    max_new_tokens: int = 128,
    eos_ids: Collection[int] = (),
    should_stop: StopCheck | None = None,
) -> PlainRun:
    """Plain decoding with the same model, cache and timing as the speculative loop.

    A reason from `should_stop` ends it early; the run then says why.
    """
    device = prompt_ids.device
    clock = Clock(device)
    generator = torch.Generator(device=device).manual_seed(sampling.seed)
    eos = set(eos_ids)
    output: list[int] = []
    times: list[float] = []
    start = clock()
    cache = _prefill(target, prompt_ids)
    last = prompt_ids[:, -1:]
    while len(output) < max_new_tokens:
        if should_stop is not None and (reason := should_stop()):
            return PlainRun(output, clock() - start, times, reason)
        logits = forward(target, last, cache)
        if sampling.greedy:
            token = logits[-1].argmax()
        else:
            token = torch.multinomial(warp(logits[-1], sampling), 1, generator=generator)[0]
        output.append(int(token))
        times.append(time.perf_counter() - start)
        if output[-1] in eos:
            break
        last = token.view(1, 1)
    return PlainRun(output, clock() - start, times)
