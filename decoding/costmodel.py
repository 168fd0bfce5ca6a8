"""The cost model the charts compare measurements with (Leviathan et al. 2023).

Pure Python on purpose: `visualize/` uses it on saved traces, without torch.
alpha: per-token acceptance probability; gamma: draft length; c: draft
step time / target step time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from .trace import Trace


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per round, the target's own token included."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def expected_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan's formula: checking gamma+1 tokens costs one target step."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def expected_speedup_measured(
    alpha: float, gamma: int, t_target: float, t_draft: float, verify_cost: float
) -> float:
    """E[tokens] * T_target / (gamma * T_draft + V(gamma+1)), with V measured."""
    return expected_tokens(alpha, gamma) * t_target / (gamma * t_draft + verify_cost)


def estimate_alpha(*traces: Trace) -> float:
    """Per-position acceptance probability under the i.i.d. model, pooled over `traces`.

    Each round is a run of acceptances ended by one rejection, or by the
    end of the draft; the maximum-likelihood alpha is accepted / (accepted
    + rejections). (`totals.acceptance_rate`, accepted / proposed, is lower
    by construction: positions after a rejection count as proposed.)
    """
    steps = [s for t in traces for s in t.rounds]
    accepted = sum(s.n_accepted for s in steps)
    rejections = sum(1 for s in steps if s.n_accepted < s.k)
    return accepted / (accepted + rejections) if accepted + rejections else 0.0


def verify_cost_ms(traces: Sequence[Trace]) -> dict[int, float]:
    """Mean verify time by the number of tokens checked (k + 1), over rounds of all traces."""
    times: dict[int, list[float]] = defaultdict(list)
    for trace in traces:
        for s in trace.rounds:
            times[s.k + 1].append(s.verify_ms)
    return {n: sum(v) / len(v) for n, v in sorted(times.items())}


def draft_ms_per_token(trace: Trace) -> float:
    proposed = sum(s.k for s in trace.rounds)
    return sum(s.draft_ms for s in trace.rounds) / proposed if proposed else 0.0


def steady_ms_per_token(token_times_s: Sequence[float]) -> float | None:
    """Time per token after the first (so without the prefill), from when each token was ready."""
    t = token_times_s
    return (t[-1] - t[0]) / (len(t) - 1) * 1e3 if len(t) >= 2 else None


def target_ms_per_token(trace: Trace) -> float | None:
    """One plain target step, from the baseline's steady state."""
    return steady_ms_per_token(trace.baseline.token_times_s) if trace.baseline else None


def acceptance_by_position(trace: Trace) -> list[tuple[int, int, int]]:
    """(position, reached, accepted) for each draft position: the position is
    reached when every earlier draft token of the round was accepted."""
    reached: dict[int, int] = defaultdict(int)
    accepted: dict[int, int] = defaultdict(int)
    for s in trace.rounds:
        for j in range(min(s.k, s.n_accepted + 1)):
            reached[j] += 1
            accepted[j] += j < s.n_accepted
    return [(j, reached[j], accepted[j]) for j in sorted(reached)]


# -- a measured acceptance profile (a deployment's per-position acceptance) -------


def expected_tokens_profile(per_position: Sequence[float], k: int) -> float:
    """Expected tokens per round at draft length k from per-position acceptance.

    per_position[i] is P(the draft token at position i is accepted), as vLLM
    reports it (accepted at i / drafts). Past the measured positions each
    further one keeps the last measured position-to-position ratio.
    """
    probs = [min(max(p, 0.0), 1.0) for p in per_position]
    if not probs:
        return 1.0
    ratio = probs[-1] / probs[-2] if len(probs) >= 2 and probs[-2] > 0 else probs[-1]
    while len(probs) < k:
        probs.append(probs[-1] * min(ratio, 1.0))
    return 1.0 + sum(probs[:k])


def best_k_profile(
    per_position: Sequence[float], draft_cost: float, verify_growth: float, k_max: int = 16
) -> tuple[int, list[float]]:
    """The k with the best expected speedup, and the speedup for k = 1..k_max.

    A round costs k · c target steps of drafting plus 1 + b · k of verifying
    (b = 0: checking k+1 tokens costs one step, as on a large GPU).
    """
    speedups = [
        expected_tokens_profile(per_position, k) / (1 + draft_cost * k + verify_growth * k)
        for k in range(1, k_max + 1)
    ]
    return 1 + max(range(k_max), key=speedups.__getitem__), speedups
