"""The speculative loop.

Read top to bottom: `speculative_round` is one round (draft, check in one
target pass, keep the agreed prefix), `iter_rounds` runs rounds until the
text ends, `iter_trace` records each round into a Trace as it comes, and
`speculative_generate` runs one to the end. It keeps plain decoding's
invariant (`plain.py`): the target's KV cache holds every token of `seq` but
the last, which is fed at the start of the next forward pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from ..runtime.forward import crop, forward
from ..settings.policies import Policy, StopRule
from ..settings.sampling import Sampling
from ..trace import RunMeta, Totals, Trace
from .plain import Clock, StopCheck, prefill
from .proposal import Draft, Proposal, empty_proposal
from .record import RoundResult, record_round
from .tree import TokenTree, TreeShape, TreeVerdict, keep_path, tree_inputs, verify_tree
from .verify import Verification, verify_greedy, verify_sampling, warp


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


def speculative_round(
    dec: Decoder, cache, seq: torch.Tensor, k: int, stop: StopRule | None = None
) -> RoundResult:
    """Draft up to k tokens after `seq`, check them all in one target pass, keep the agreed prefix
    and the target's own next token. Afterwards the target's cache and the draft's hold exactly
    `seq` plus the accepted drafts."""
    t0 = dec.clock()
    proposal = draft_chain(dec, seq, k, stop)
    t1 = dec.clock()
    with dec.draft.watching_target():
        logits = forward(dec.target, chain_inputs(seq, proposal), cache)
    verdict = check_chain(dec, logits, proposal)
    t2 = dec.clock()
    return keep_agreed(dec, cache, seq, proposal, verdict, (t1 - t0, t2 - t1, t0))


def draft_chain(dec: Decoder, seq: torch.Tensor, k: int, stop: StopRule | None = None) -> Proposal:
    """The draft's up to k tokens after `seq`, none past a stop token."""
    proposal = dec.draft.propose(seq, k, dec.sampling, dec.generator, stop) if k > 0 else None
    return _cut_after_eos(proposal or empty_proposal(seq.device), dec.eos)


def draft_chains(
    decs: Sequence[Decoder], seqs: Sequence[torch.Tensor], ks: Sequence[int], stops: Sequence[StopRule | None]
) -> list[Proposal]:
    """`draft_chain` for several sequences, each decoding with its own fork of one draft, which
    drafts for all of them together (`Draft.propose_together`)."""
    drafts = [d.draft for d in decs]
    generators = [d.generator for d in decs]
    proposals = drafts[0].propose_together(drafts, seqs, ks, decs[0].sampling, generators, stops)
    return [_cut_after_eos(p, d.eos) for p, d in zip(proposals, decs, strict=True)]


def chain_inputs(seq: torch.Tensor, proposal: Proposal) -> torch.Tensor:
    """What the target's check reads: the last token of `seq` (not yet in its cache), then the draft."""
    return torch.cat([seq[:, -1:], proposal.tokens.view(1, -1)], dim=1)


def check_chain(dec: Decoder, logits: torch.Tensor, proposal: Proposal) -> Verification:
    if dec.sampling.greedy:
        return verify_greedy(logits, proposal.tokens)
    return verify_sampling(warp(logits, dec.sampling), proposal.tokens, proposal.dists, dec.generator)


def keep_agreed(
    dec: Decoder,
    cache,
    seq: torch.Tensor,
    proposal: Proposal,
    verdict: Verification,
    times: tuple[float, float, float],
) -> RoundResult:
    """Roll the target's cache and the draft back to `seq` plus the accepted drafts; the round's
    result. `times`: the draft's and the check's seconds, and when the round started."""
    n = verdict.n_accepted
    kept = proposal.tokens[:n].tolist()
    emitted = int(verdict.emitted)
    ended_in_draft = bool(dec.eos & set(kept))  # an accepted EOS: no token after it
    crop(cache, seq.shape[1] + n)
    dec.draft.rollback(seq.shape[1] + n)
    draft_s, verify_s, start = times
    return RoundResult(
        proposal,
        verdict,
        kept if ended_in_draft else [*kept, emitted],
        None if ended_in_draft else emitted,
        ended_in_draft or emitted in dec.eos,
        draft_s,
        verify_s,
        dec.clock() - start,
    )


def tree_round(dec: Decoder, cache, seq: torch.Tensor, depth: int) -> RoundResult:
    """Draft a tree up to `depth` deep, check every node in one target pass, keep the
    longest path the target agrees with; the caches afterwards as in `speculative_round`."""
    t0 = dec.clock()
    tree = draft_tree(dec, seq, depth)
    t1 = dec.clock()
    ids, positions, mask = tree_check_inputs(dec, seq, tree)
    with dec.draft.watching_target():
        logits = forward(dec.target, ids, cache, position_ids=positions, mask=mask)
    verdict = check_tree(dec, logits, tree)
    t2 = dec.clock()
    return keep_tree_path(dec, cache, seq, tree, verdict, (t1 - t0, t2 - t1, t0))


def draft_tree(dec: Decoder, seq: torch.Tensor, depth: int) -> TokenTree:
    """The draft's tree of `dec.tree`'s shape, up to `depth` deep, after `seq`."""
    return dec.draft.propose_tree(seq, depth, dec.tree, dec.eos) if depth > 0 else TokenTree()


def tree_check_inputs(
    dec: Decoder, seq: torch.Tensor, tree: TokenTree
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the target's check of a tree reads: the last token of `seq` and every node, with
    their positions and the mask that lets each see only its ancestors."""
    return tree_inputs(tree, seq[0, -1], seq.shape[1] - 1, dec.target.dtype)


def check_tree(dec: Decoder, logits: torch.Tensor, tree: TokenTree) -> TreeVerdict:
    greedy = dec.sampling.greedy
    probs = logits.float().softmax(-1) if greedy else warp(logits, dec.sampling)
    return verify_tree(logits, tree, probs, None if greedy else dec.generator)


def keep_tree_path(
    dec: Decoder,
    cache,
    seq: torch.Tensor,
    tree: TokenTree,
    verdict: TreeVerdict,
    times: tuple[float, float, float],
) -> RoundResult:
    """Keep the accepted path in the target's cache and the draft's; the round's result
    (`times` as in `keep_agreed`)."""
    start = seq.shape[1]
    kept = [tree.tokens[i] for i in verdict.path]
    ended_in_draft = bool(kept) and kept[-1] in dec.eos  # a stop token's node has no children
    keep_path(cache, start, [start + i for i in verdict.path])
    dec.draft.rollback(start + len(kept), rows=[0] + [1 + i for i in verdict.path])
    proposal, line = _main_line(tree, verdict, ended_in_draft, dec.sampling.greedy, seq.device)
    draft_s, verify_s, began = times
    return RoundResult(
        proposal,
        line,
        kept if ended_in_draft else [*kept, verdict.emitted],
        None if ended_in_draft else verdict.emitted,
        ended_in_draft or verdict.emitted in dec.eos,
        draft_s,
        verify_s,
        dec.clock() - began,
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
        tensor([tree.tokens[i] for i in line], torch.long),
        tensor([tree.q[i] for i in line]),
        None,
        source=tree.source,
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
    cache = prefill(target, prompt_ids, draft)
    seq, produced = prompt_ids, 0
    while produced < max_new_tokens:
        # Leave room for the token the target adds, so a round never overshoots.
        k = min(policy.next_k(), max_new_tokens - produced - 1)
        if tree is None:
            r = speculative_round(dec, cache, seq, k, policy.stop)
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
