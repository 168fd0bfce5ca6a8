"""The cost model (Leviathan et al. 2023): every prediction SpecLens makes, and
the one definition of a target step's time they are all measured against.

Pure Python on purpose: `visualize/` uses it on saved traces, without torch.
alpha: per-token acceptance probability; gamma: draft length; c: draft
step time / target step time.

No prediction here can promise more than its inputs allow: a round yields its
tokens for its drafting plus one target pass over them, and that pass costs at
least one plain step (checking more tokens never costs less than checking one),
so every speedup is at most tokens per round ÷ (drafting + checking, in target
steps, checking ≥ 1). A V(n) measured on a busy machine can break that (V(2)
timed at half V(1)); every function below reads V through `check_cost` or
`verify_ratio_at`, which hold it to V(n) ≥ V(m) ≥ V(1) for n ≥ m.
"""

from __future__ import annotations

import functools
import heapq
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .trace import Round, Trace


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per round, the target's own token included."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def tokens_per_round_sd(alpha: float, gamma: int) -> float:
    """The standard deviation of one round's tokens: j drafts accepted with probability
    α^j·(1 − α) for j < γ and α^γ for all γ, and the round yields j + 1."""
    probs = [alpha**j * (1 - alpha) for j in range(gamma)] + [alpha**gamma]
    mean = sum((j + 1) * p for j, p in enumerate(probs))
    return max(0.0, sum((j + 1) ** 2 * p for j, p in enumerate(probs)) - mean**2) ** 0.5


def expected_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan's formula: checking gamma+1 tokens costs one target step."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def expected_speedup_measured(
    alpha: float, gamma: int, t_target: float, t_draft: float, verify_cost: float
) -> float:
    """E[tokens] * T_target / (gamma * T_draft + V(gamma+1)), with V measured (and never taken
    below T_target: checking gamma+1 tokens costs at least what checking one does)."""
    return expected_tokens(alpha, gamma) * t_target / (gamma * t_draft + max(verify_cost, t_target))


def check_cost(verify_ratio: Callable[[int], float], n: int, at_least: float = 1.0) -> float:
    """V(n)/V(1) as a prediction may use it: never below `at_least` (1, what checking one token
    costs, or V(m)/V(1) for a smaller m it is set against)."""
    return max(at_least, verify_ratio(n))


def speedup_ceiling(tokens_per_round: float, draft_steps: float) -> float:
    """The most a round can gain: its tokens over its drafting plus the cheapest check there is,
    one target step."""
    return tokens_per_round / (draft_steps + 1.0)


def rank_acceptance(alpha: float, alpha2: float, branch: int) -> list[float]:
    """P(the draft's r-th choice is the target's token) for r < branch: α for the first, α₂ for the
    second, then falling by α₂/α per rank. Under greedy decoding these are disjoint events, so
    the later ranks are scaled down to leave the sum at most 1."""
    later = [alpha2 * (alpha2 / alpha if alpha else 0.0) ** r for r in range(branch - 1)]
    room = 1.0 - alpha
    if sum(later) > room:
        later = [a * room / sum(later) for a in later]
    return [alpha, *later]


def expected_tokens_tree(rank_acceptance: Sequence[float], depth: int, nodes: int) -> float:
    """Expected tokens per round of the best tree of `nodes` nodes, `depth` deep.

    A node is accepted when every candidate on its path is the target's
    token: the product of their rank acceptances. The best tree keeps the
    nodes most likely accepted (found best first, as EAGLE-2 and Sequoia
    grow theirs), and a round yields the target's own token plus, on
    average, the sum of its nodes' probabilities. One candidate per node
    gives back `expected_tokens(alpha, depth)`.
    """
    frontier = [(-a, 1) for a in rank_acceptance if a > 0]
    heapq.heapify(frontier)
    total = 0.0
    for _ in range(nodes):
        if not frontier:
            break
        p, d = heapq.heappop(frontier)
        total -= p
        if d < depth:
            for a in rank_acceptance:
                heapq.heappush(frontier, (p * a, d + 1))
    return 1.0 + total


def expected_speedup_tree(
    ranks: Sequence[float], depth: int, nodes: int, c: float, verify_ratio: Callable[[int], float]
) -> float:
    """A round drafts `depth` levels (c target steps each, whatever the size) and checks
    nodes + 1 tokens at verify_ratio(nodes + 1) target steps (`linear_verify(b)`: 1 + b·nodes)."""
    return expected_tokens_tree(ranks, depth, nodes) / (depth * c + check_cost(verify_ratio, nodes + 1))


def best_tree_size(
    ranks: Sequence[float], depth: int, c: float, verify_ratio: Callable[[int], float], max_nodes: int = 32
) -> tuple[int, list[float]]:
    """The tree size N with the best expected speedup, and the speedup for N = 1..max_nodes."""
    speedups = [expected_speedup_tree(ranks, depth, n, c, verify_ratio) for n in range(1, max_nodes + 1)]
    return 1 + max(range(max_nodes), key=speedups.__getitem__), speedups


def monotone_ratios(measured: dict[int, float]) -> dict[int, float]:
    """The measured V(n)/V(1) held to what a step can do: never below 1, and never below a smaller
    n's (a busy machine can time V(2) at half V(1); more rows never cost less work)."""
    held, floor = {}, 1.0
    for n, ratio in sorted(measured.items()):
        floor = max(floor, ratio)
        held[n] = floor
    return held


def verify_ratio_at(measured: dict[int, float], n: int) -> float:
    """V(n)/V(1) from the ratios measured at a few n (the probe's 1, 2, 3, 5, 9, 17, 32, 64): straight
    lines between them, and the last line's slope beyond the largest; held monotone
    (`monotone_ratios`) first."""
    points = sorted(monotone_ratios(measured).items())
    if len(points) == 1:
        return points[0][1]
    for (n0, r0), (n1, r1) in zip(points, points[1:]):
        if n <= n1:
            return r0 + (r1 - r0) * (n - n0) / (n1 - n0)
    return r1 + (r1 - r0) * (n - n1) / (n1 - n0)


CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)  # requests decoded together, for the what-if


def concurrent_speedup(
    alpha: float, k: int, c: float, verify_ratio: Callable[[int], float], batch: int
) -> float:
    """Predicted speedup of speculation when `batch` requests are decoded together.

    Plain decoding checks B rows a step, V(B); a speculative round drafts k steps (each c
    plain steps at that batch, c·V(B)) and checks B·(k+1) rows, V(B·(k+1)), and each request
    gains expected_tokens(α, k). Where one step is bound by reading the weights, more rows are
    nearly free and speculation pays; once B·(k+1) rows make the step compute-bound, it stops.
    `verify_ratio(n)` is V(n)/V(1)."""
    plain = check_cost(verify_ratio, batch)
    verify = check_cost(verify_ratio, batch * (k + 1), plain)
    return expected_tokens(alpha, k) * plain / (k * c * plain + verify)


def concurrency_speedups(
    alpha: float,
    c: float,
    verify_ratio: Callable[[int], float],
    ks: Sequence[int],
    batches: Sequence[int] = CONCURRENCY,
) -> dict[int, list[float]]:
    """`concurrent_speedup` for each k at each of `batches`: the one table the concurrency chart
    draws and its sentence reads."""
    return {k: [concurrent_speedup(alpha, k, c, verify_ratio, b) for b in batches] for k in ks}


def break_even_concurrency(
    alpha: float, k: int, c: float, verify_ratio: Callable[[int], float], batches: Sequence[int] = CONCURRENCY
) -> int | None:
    """The smallest of `batches` at which speculation no longer pays (speedup below 1), or None."""
    speedups = concurrency_speedups(alpha, c, verify_ratio, [k], batches)[k]
    return next((b for b, s in zip(batches, speedups, strict=True) if s < 1.0), None)


def estimate_alpha(*traces: Trace) -> float:
    """Per-position acceptance probability under the i.i.d. model, pooled over `traces`.

    Each round is a run of acceptances ended by one rejection, or by the
    end of the draft; the maximum-likelihood alpha is accepted / (accepted
    + rejections). (`totals.acceptance_rate`, accepted / proposed, is lower
    by construction: positions after a rejection count as proposed.)
    """
    rounds = [r for t in traces for r in t.rounds]
    accepted = sum(r.n_accepted for r in rounds)
    rejections = sum(1 for r in rounds if r.n_accepted < r.drafted)
    return accepted / (accepted + rejections) if accepted + rejections else 0.0


def verify_cost_ms(traces: Sequence[Trace]) -> dict[int, float]:
    """Mean verify time by the number of tokens checked (k + 1, or a tree's nodes + 1), over rounds of all traces."""
    times: dict[int, list[float]] = defaultdict(list)
    for trace in traces:
        for s in trace.rounds:
            times[s.checked].append(s.verify_ms)
    return {n: sum(v) / len(v) for n, v in sorted(times.items())}


def draft_ms_per_token(trace: Trace) -> float:
    proposed = sum(s.drafted for s in trace.rounds)
    return sum(s.draft_ms for s in trace.rounds) / proposed if proposed else 0.0


def target_ms_per_token(plain_token_times_s: Sequence[float]) -> float | None:
    """The one definition of T_target, a plain target step, for the bench, the sweep and the charts:
    the steady state of plain decoding, from its first token to its last (so the prefill is left out).
    None when plain decoding made fewer than two tokens: then there is nothing to predict with."""
    t = plain_token_times_s
    return (t[-1] - t[0]) / (len(t) - 1) * 1e3 if len(t) >= 2 else None


def predicted_speedup(trace: Trace, t_target_ms: float) -> float:
    """The cost model applied to the rounds as they were drafted.

    Each round with k_i proposals is expected to yield E[tokens](alpha, k_i)
    and to cost k_i * T_draft + V(k_i + 1), with alpha, T_draft and V measured
    on this run.
    """
    alpha = estimate_alpha(trace)
    t_draft = draft_ms_per_token(trace)
    verify = verify_cost_ms([trace])
    tokens = sum(expected_tokens(alpha, r.drafted) for r in trace.rounds)
    # A check no cheaper than a plain step, whatever a busy machine timed.
    cost = sum(r.drafted * t_draft + max(verify[r.checked], t_target_ms) for r in trace.rounds)
    return tokens * t_target_ms / cost if cost else 0.0


def acceptance_by_position(trace: Trace) -> list[tuple[int, int, int]]:
    """(position, reached, accepted) for each draft position: the position is
    reached when every earlier draft token of the round was accepted."""
    reached: dict[int, int] = defaultdict(int)
    accepted: dict[int, int] = defaultdict(int)
    for s in trace.rounds:
        for j in range(min(s.drafted, s.n_accepted + 1)):
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


def linear_verify(verify_growth: float) -> Callable[[int], float]:
    """V(n)/V(1) when each token checked beyond the first costs b target steps more (b = 0:
    checking n tokens costs one step, as on a large GPU; never below 0)."""
    growth = max(0.0, verify_growth)
    return lambda n: 1.0 + growth * (n - 1)


def best_k_profile(
    per_position: Sequence[float], draft_cost: float, verify_ratio: Callable[[int], float], k_max: int = 16
) -> tuple[int, list[float]]:
    """The k with the best expected speedup, and the speedup for k = 1..k_max.

    A round costs k · c target steps of drafting plus V(k+1)/V(1) of verifying
    (`verify_ratio`: measured by the probe, or `linear_verify`).
    """
    speedups = [
        expected_tokens_profile(per_position, k) / (draft_cost * k + check_cost(verify_ratio, k + 1))
        for k in range(1, k_max + 1)
    ]
    return 1 + max(range(k_max), key=speedups.__getitem__), speedups


def best_gamma(
    alpha: float, draft_cost: float, verify_ratio: Callable[[int], float], gamma_max: int
) -> tuple[int, list[float]]:
    """The draft length with the best expected speedup when every drafted token is accepted with
    probability α (position i with α^i), and the speedup for γ = 1..gamma_max."""
    chain = [alpha**i for i in range(1, gamma_max + 1)]
    return best_k_profile(chain, draft_cost, verify_ratio, gamma_max)


@dataclass(frozen=True)
class BatchCosts:
    """A batched run's measured costs, the inputs of `batched_speedup`: the sequences a pass held
    (plain and speculative), what a speculative round gave and checked per sequence, each
    sequence's drafting and bookkeeping per round (or per plain step), and the prefills."""

    plain_batch: float  # sequences a plain pass held, on average
    batch: float  # sequences a speculative pass held, on average
    tokens_per_round: float  # acceptance: the tokens a round added to a sequence
    rows_per_round: float  # the rows a round's check read for a sequence: 1 + its draft
    draft_ms: float  # one sequence's drafting in a round
    round_overhead_ms: float  # one sequence's verdict, rollback and bookkeeping in a round
    step_overhead_ms: float  # one sequence's pick and bookkeeping in a plain step
    prefill_ms_per_token: float  # every prefill's time by the tokens written


def batched_speedup(costs: BatchCosts, verify_ms: Callable[[float], float]) -> float:
    """Predicted speedup of speculative over plain decoding of the same prompts in batches.

    Plain decoding makes one token per sequence a pass of B rows, V(B); a speculative round
    drafts each sequence's tokens (one sequence after another on a CPU) and checks B·r rows,
    V(B·r), for τ tokens per sequence. `verify_ms(n)` is the measured time of a pass of n rows.
    Once B·r rows make the pass compute-bound, the rows speculation adds cost as much as the
    tokens they bring, and it stops paying."""
    c = costs
    plain = (verify_ms(c.plain_batch) + c.plain_batch * c.step_overhead_ms) / c.plain_batch
    round_ms = verify_ms(c.batch * c.rows_per_round) + c.batch * (c.draft_ms + c.round_overhead_ms)
    speculative = round_ms / (c.batch * c.tokens_per_round)
    return (c.prefill_ms_per_token + plain) / (c.prefill_ms_per_token + speculative)


def pass_cost(passes: Sequence[tuple[int, float]]) -> Callable[[float], float]:
    """V(n) from measured passes, (rows, ms) each: the median at each row count (never below a
    smaller count's: more rows cannot cost less), straight lines between them, the last line's
    slope beyond the largest count and the smallest count's time below it."""
    by_rows: dict[int, list[float]] = defaultdict(list)
    for rows, ms in passes:
        by_rows[rows].append(ms)
    xs = sorted(by_rows)
    ys: list[float] = []
    for n in xs:
        ys.append(max([statistics.median(by_rows[n]), *ys[-1:]]))

    def v(n: float) -> float:
        if n <= xs[0] or len(xs) == 1:
            return ys[0]
        j = next((j for j in range(1, len(xs)) if n <= xs[j]), len(xs) - 1)
        return ys[j - 1] + (ys[j] - ys[j - 1]) * (n - xs[j - 1]) / (xs[j] - xs[j - 1])

    return v


def k_per_batch_size(speedups: dict[int, dict[int, float]]) -> list[tuple[int, int, int]]:
    """Draft length by batch size from speedups measured at a few batch sizes (`speedups[B][k]`):
    inclusive (first, last, k) ranges, each measured B deciding up to the next one, k 0 (no
    speculation) where no k was faster than plain decoding. Past the largest B measured only
    "off" is carried on (to 1024): a k that paid there may not pay further on."""
    sizes = sorted(speedups)
    ranges: list[tuple[int, int, int]] = []
    for i, b in enumerate(sizes):
        best = max(speedups[b], key=speedups[b].get)
        k = best if speedups[b][best] > 1.0 else 0
        last = sizes[i + 1] - 1 if i + 1 < len(sizes) else (1024 if k == 0 else b)
        if ranges and ranges[-1][2] == k and ranges[-1][1] == b - 1:
            ranges[-1] = (ranges[-1][0], last, k)
        else:
            ranges.append((b, last, k))
    return ranges


def vllm_speculative_config(method: str, ranges: list[tuple[int, int, int]]) -> dict:
    """vLLM's `speculative_config` choosing k by batch size (`num_speculative_tokens_per_batch_size`:
    inclusive (first, last, k) triples, k 0 turning speculation off)."""
    return {
        "method": method,
        "num_speculative_tokens": max(k for _, _, k in ranges) or 1,
        "num_speculative_tokens_per_batch_size": [list(r) for r in ranges],
    }


def sglang_adaptive_config(ranges: list[tuple[int, int, int]]) -> dict:
    """SGLang's `--speculative-adaptive-config` file: per batch size where a range starts, the draft
    steps it may take (0: none)."""
    return {str(first): {"candidate_steps": [k]} for first, _, k in ranges}


# -- a run priced on a GPU it never ran on ---------------------------------------------------------

# Drafts with no model: a lookup in the run's own text, done on the CPU whatever checks it, so a GPU
# leaves their cost as it was measured.
BOOKKEEPING_DRAFTS = {"ngram": "n-gram", "suffix": "suffix"}


@dataclass(frozen=True)
class GpuFigures:
    """One set of figures recorded on a GPU (benchmarks/gpu-*/, read by decoding/tools/gpu_figures.py):
    each model shape's step by the tokens it checks, V(n) in ms, and each draft model's c there (its
    time a drafted token ÷ a plain target step, as bench measured it) by (target shape, draft shape)."""

    card: str
    dtype: str
    graphs: bool  # steps replayed from CUDA graphs
    date: str  # when it was measured, YYYY-MM-DD; "" where nothing recorded it
    source: str  # the folder, from the repository's root
    random_weights: bool  # random-weight models of the real shapes (a machine that cannot fetch weights)
    steps_ms: dict[str, dict[int, float]]  # model_shape -> {n: V(n) ms}
    draft_costs: dict[tuple[str, str], float] = field(default_factory=dict)

    def conditions(self) -> str:
        """How its figures were measured and where they are, in one line: every view of a prediction
        says it after the card's name."""
        models = "random-weight models of the real shapes" if self.random_weights else "the real models"
        graphs = "CUDA graphs on" if self.graphs else "CUDA graphs off"
        when = f"measured {self.date}" if self.date else "date not recorded"
        return f"{self.dtype}, {graphs}, {models} ({self.source}, {when})"


@dataclass(frozen=True)
class GpuPrice:
    k: int
    speedup: float
    tokens_per_s: float


@dataclass(frozen=True)
class GpuPricing:
    """A run priced on one GPU's figures: a prediction for each k, or one line saying why none."""

    figures: GpuFigures
    prices: tuple[GpuPrice, ...] = ()
    step_ms: float = 0.0  # the card's measured step for one token: plain decoding's token
    draft_cost: str = ""  # how the draft's cost there was taken, in words
    unpriced: str = ""  # why nothing is predicted, in one line; "" when priced


def model_shape(name: str) -> str:
    """The architecture a model's name stands for, as the GPU figures key it: the last part of a hub
    id or path, lower case, less what changes the weights but not the shape (-instruct, -it, and
    -random: a random-weight model of a real configuration is named after it), a family's number
    joined to it (gemma-3-270m and the preset gemma3-270m are one shape)."""
    base = name.split(" (")[0].strip().rstrip("/").rsplit("/", 1)[-1].lower()
    while (cut := re.sub(r"-(instruct|it|random)$", "", base)) != base:
        base = cut
    return re.sub(r"(?<=[a-z])-(?=\d)", "", base)


def position_profile(trace: Trace) -> list[float]:
    """P(the draft token at position i is accepted), for each position the run reached: the product
    of the acceptance (accepted ÷ reached) at it and at every position before it, as
    `expected_tokens_profile` takes it."""
    profile, chance = [], 1.0
    for _, reached, accepted in acceptance_by_position(trace):
        chance *= accepted / reached
        profile.append(chance)
    return profile


def _gpu_draft_steps(
    trace: Trace, figures: GpuFigures, step_ms: float
) -> tuple[Callable[[Round, int], float] | None, str]:
    """A round's drafting of d tokens on the card, in its target steps, and how it was taken; None and
    why where the draft was never measured there."""
    meta, card = trace.meta, figures.card
    if meta.draft_kind in BOOKKEEPING_DRAFTS:
        per_round = sum(r.draft_ms for r in trace.rounds) / max(1, len(trace.rounds))
        said = (
            f"the {BOOKKEEPING_DRAFTS[meta.draft_kind]} draft is bookkeeping on the CPU, so its cost is "
            f"this run's own, {per_round:.2f} ms a round, not scaled"
        )
        return (lambda r, d: r.draft_ms / step_ms), said
    pair = (model_shape(meta.target), model_shape(meta.draft))
    c = figures.draft_costs.get(pair) if meta.draft_kind == "model" else None
    if c is None:
        return (
            None,
            f"the {meta.draft} draft for {meta.target} was never measured on the {card}: no prediction",
        )
    return (lambda r, d: d * c), f"the {meta.draft} draft's cost as measured on the {card}, c = {c:.2f}"


def price_on_gpu(trace: Trace, figures: GpuFigures) -> GpuPricing:
    """The cost model applied to this run's rounds on another machine: the tokens its measured
    acceptance by position gives (`position_profile`), against what drafting and checking them cost
    on the card (its V(n), held as `check_cost` holds it, and the draft's cost there). For each k from
    1 to the last position the run reached, each round drafts what it drafted, k at most:

        speedup(k) = Σ E[tokens](d) ÷ Σ (drafting d + V(d + 1)/V(1)),  d = min(drafted, k)

    in target steps of the card, so never above tokens per round ÷ (drafting + one step)
    (`speedup_ceiling`); tokens/s is that over the card's one-token step. Nothing is predicted for a
    target shape with no V(n) there, a draft never measured there, or a token tree."""
    steps = figures.steps_ms.get(model_shape(trace.meta.target), {})
    if 1 not in steps:
        shapes = ", ".join(sorted(figures.steps_ms)) or "none"
        return GpuPricing(
            figures,
            unpriced=f"{trace.meta.target}'s shape has no V(n) on the {figures.card} (measured: {shapes})",
        )
    if trace.meta.tree_nodes:
        return GpuPricing(figures, unpriced="a token tree's rounds are not priced: the figures price chains")
    draft_steps, said = _gpu_draft_steps(trace, figures, steps[1])
    profile = position_profile(trace)
    if draft_steps is None or not profile:
        return GpuPricing(
            figures, unpriced=said if draft_steps is None else "the run drafted nothing to price"
        )
    verify = functools.partial(verify_ratio_at, {n: ms / steps[1] for n, ms in steps.items()})
    prices = []
    for k in range(1, min(len(profile), max(steps) - 1) + 1):
        tokens = cost = 0.0
        for r in trace.rounds:
            d = min(r.drafted, k)
            tokens += expected_tokens_profile(profile, d)
            cost += draft_steps(r, d) + check_cost(verify, d + 1)
        prices.append(GpuPrice(k, tokens / cost, tokens / cost * 1e3 / steps[1]))
    return GpuPricing(figures, tuple(prices), steps[1], said)
