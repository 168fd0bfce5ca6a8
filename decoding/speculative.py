"""The speculative loop and the plain autoregressive baseline.

Both keep the same invariant: the target's KV cache holds every token of
`seq` but the last, which is fed at the start of the next forward pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import NamedTuple

import torch

from .drafts import TOP_N, Draft, Proposal, empty_proposal
from .forward import crop, forward, new_cache
from .policies import Policy
from .trace import DraftToken, Emitted, Step, TopToken, Trace, Verdict, totals_from_counts, verdict_kind
from .verify import Sampling, Verification, verify_greedy, verify_sampling, warp

StepCallback = Callable[[Step, Trace], None]
# Asked before every round (and every plain token): a reason to stop now, or None.
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


def _prefill(target: torch.nn.Module, prompt_ids: torch.Tensor):
    cache = new_cache(target)
    if prompt_ids.shape[1] > 1:
        forward(target, prompt_ids[:, :-1], cache, keep=1)
    return cache


def speculative_generate(
    target: torch.nn.Module,
    prompt_ids: torch.Tensor,
    draft: Draft,
    policy: Policy,
    sampling: Sampling = Sampling(),
    max_new_tokens: int = 128,
    eos_ids: Collection[int] = (),
    token_text: Callable[[int], str] = str,
    on_step: StepCallback | None = None,
    meta: dict | None = None,
    record: bool = True,
    should_stop: StopCheck | None = None,
) -> Trace:
    """Draft, verify, repeat; returns the full Trace of the run.

    `prompt_ids` is [1, n] on the target's device. `on_step` is called after
    every round with the new Step and the trace so far (for live UIs).
    `should_stop` is asked before every round; a reason it gives ends the run
    there, recorded as `meta["stopped"]`, with the rounds so far intact.
    With `record=False` nothing per round is kept or timed, only the totals:
    the benchmark uses it to measure what tracing costs.
    """
    device = prompt_ids.device
    clock = Clock(device)
    generator = torch.Generator(device=device).manual_seed(sampling.seed)
    eos = set(eos_ids)
    trace = Trace(meta=dict(meta or {}))
    output: list[int] = []

    start = clock()
    draft.reset()  # before the prefill: a head draft reads the target's prefill features
    try:
        cache = _prefill(target, prompt_ids)
        seq = prompt_ids
        finished = False
        rounds = proposed = accepted = 0
        while not finished and len(output) < max_new_tokens:
            if should_stop is not None and (reason := should_stop()):
                trace.meta["stopped"] = reason
                break
            t0 = clock() if record else 0.0
            # Leave room for the token the target adds, so a round never overshoots.
            k = min(policy.next_k(), max_new_tokens - len(output) - 1)
            proposal = draft.propose(seq, k, sampling, generator, policy.min_confidence) if k > 0 else None
            proposal = _cut_after_eos(proposal or empty_proposal(device), eos)
            t1 = clock() if record else 0.0
            candidates = torch.cat([seq[:, -1:], proposal.tokens.view(1, -1)], dim=1)
            logits = forward(target, candidates, cache)
            verdict = _verify(logits, proposal, sampling, generator)
            t2 = clock() if record else 0.0

            n = verdict.n_accepted
            kept = proposal.tokens[:n].tolist()
            emitted = int(verdict.emitted)
            ended_in_draft = bool(eos & set(kept))  # an accepted EOS: no bonus after it
            new = kept if ended_in_draft else [*kept, emitted]
            finished = ended_in_draft or emitted in eos
            crop(cache, seq.shape[1] + n)
            draft.rollback(seq.shape[1] + n)
            seq = torch.cat([seq, torch.tensor([new], device=device)], dim=1)
            output.extend(new)
            policy.update(n, len(proposal))
            if not record:
                rounds, proposed, accepted = rounds + 1, proposed + len(proposal), accepted + n
                continue

            step = _record(proposal, verdict, None if ended_in_draft else emitted, token_text)
            step.draft_ms, step.verify_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3
            step.step_ms = (clock() - t0) * 1e3
            trace.steps.append(step)
            if on_step is not None:
                on_step(step, trace)
    finally:
        draft.finish()

    wall = clock() - start
    trace.output.token_ids = output
    if not record:
        trace.totals = totals_from_counts(rounds, len(output), proposed, accepted, wall)
        return trace
    trace.compute_totals(wall)
    trace.totals["prefill_ms"] = (trace.totals["wall_s"] - sum(s.step_ms for s in trace.steps) / 1e3) * 1e3
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


def _record(
    proposal: Proposal, v: Verification, emitted: int | None, token_text: Callable[[int], str]
) -> Step:
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
    return Step(
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
        step_ms=0.0,
        target_top=_top_of(v.dist, token_text),
        # The draft's favourites at the refused position; a bonus position has none.
        draft_top=None
        if n >= len(ids) or proposal.top is None
        else _top(proposal.top[0][n], proposal.top[1][n], token_text),
        residual_top=None if v.residual is None else _top_of(v.residual, token_text),
        match=proposal.match,
    )


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
