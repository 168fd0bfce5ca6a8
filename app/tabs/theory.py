"""Theory: the cost model's best γ, trees and concurrency, on this machine's measured V(n) where
the probe measured it, and a simulated run stepped round by round."""

from __future__ import annotations

import time
from collections.abc import Callable

from app.common import (
    gpu,
    user_errors,
)
from decoding import costmodel
from decoding.models.loading import load_model
from decoding.models.paths import check_allowed
from decoding.tools.probe import cached, measure, verify_ratios
from visualize.charts import (
    concurrency_figure,
    theory_figure,
    tree_theory_figure,
)
from visualize.explain import explain_round_markdown
from visualize.simulate import simulate_trace
from visualize.timeline import timeline_html

NOT_MEASURED = (
    "**V(n) is not measured on this machine yet**, so this follows the slider, not this machine "
    "(b = 0 holds on a large GPU; on a CPU checking more tokens costs more). *Measure V(n)* above "
    "times it here once and keeps it: later visits open on it."
)


def verify_ratio(verify_growth: float, measured: dict | None) -> Callable[[int], float]:
    """V(n)/V(1): this machine's where the probe measured it, else the b slider's line. The best
    γ, the concurrency chart and the trees all use this one."""
    if measured:
        return lambda n: costmodel.verify_ratio_at(measured, n)
    return costmodel.linear_verify(verify_growth)


def run_theory(alpha: float, c: float, verify_growth: float, gamma_max: float, measured: dict | None = None):
    """The best γ under the sliders' verify cost, or under this machine's when it was measured."""
    verify = verify_ratio(verify_growth, measured)
    best, speedups = costmodel.best_gamma(alpha, c, verify, int(gamma_max))
    checking = (
        "checking γ+1 tokens costing what the probe measured on this machine"
        if measured
        else f"checking γ+1 tokens costing **1 + {verify_growth:.2f}·γ** target steps"
    )
    text = (
        f"With acceptance **α = {alpha:.2f}**, a draft step costing **c = {c:.2f}** target steps and {checking}, "
        f"the best draft length is **γ = {best}**: {costmodel.expected_tokens(alpha, best):.2f} tokens per "
        f"round, ×{speedups[best - 1]:.2f} faster than plain decoding."
        + (" Below 1 means speculation costs more than it saves." if speedups[best - 1] < 1 else "")
    )
    return theory_figure(alpha, c, verify_growth, int(gamma_max), measured), text


def run_concurrency(alpha: float, c: float, verify_growth: float, measured: dict | None = None):
    """What serving several requests at once does to speculation, from this machine's V(n) when measured."""

    ratio = verify_ratio(verify_growth, measured)
    ks = range(1, 7)
    stops = {k: costmodel.break_even_concurrency(alpha, k, c, ratio) for k in ks}
    first = costmodel.CONCURRENCY[0]
    never = [str(k) for k, b in stops.items() if b == first]
    paying = [f"k = {k} at B = {b}" for k, b in stops.items() if b is not None and b != first]
    verdicts = [
        *([f"At k = {', '.join(never)} it does not pay even alone."] if never else []),
        *([f"Speculation stops paying at {', '.join(paying)}."] if paying else []),
    ]
    source = (
        "the step costs measured on this machine"
        if measured
        else f"the slider's verify cost b = {verify_growth:.2f}"
    )
    text = (
        f"**Predicted** from {source} (not measured runs): B requests decoded together check B rows a step; "
        "speculating, B·(k+1). "
        + (" ".join(verdicts) or f"Up to B = {costmodel.CONCURRENCY[-1]} it pays at every k.")
        + ("" if measured else f" {NOT_MEASURED}")
    )
    return concurrency_figure(alpha, c, ratio, ks, bool(measured)), text


def cached_verify(target: str):
    """What the probe measured for the sidebar's target on this machine, if it ever did: the
    Theory tab opens on it. Nothing is measured here on opening: a probe takes every core for
    minutes on a 2-core machine, and timed beside a visitor's run it would be wrong."""
    found = cached(target or "")
    if found is None:
        return None, f"Nothing measured yet for **{(target or '').strip()}** on this machine. {NOT_MEASURED}"
    return verify_ratios(found), measured_text(found, f"on {found.get('measured_at', '?')[:10]}")


def check_measure(target: str) -> None:
    with user_errors():
        check_allowed(target)
        load_model((target or "").strip())


@gpu
def measure_verify(target: str):
    """Time the target's pass over 1 to 64 tokens here (decoding/tools/probe.py)."""
    with user_errors():
        check_allowed(target)
        found = measure(load_model((target or "").strip()))
        return verify_ratios(found), measured_text(found, "just now")


def measured_text(found: dict, when: str) -> str:
    table = ", ".join(f"V({n})/V(1) = {r:.2f}" for n, r in verify_ratios(found).items())
    return (
        f"Measured here for **{found['target']}** ({found['dtype']}, {found['device']}) {when}: {table}; "
        f"one token takes {found['1']['step_ms']:.1f} ms. The best γ, the curve *speedup (V measured "
        "here)*, the concurrency chart and the trees use them in place of the b slider."
    )


def run_tree_theory(
    alpha: float,
    alpha2: float,
    branch: float,
    depth: float,
    c: float,
    verify_growth: float,
    measured: dict | None = None,
):
    """The best tree's expected tokens per round against its size, under the rank-acceptance model,
    checked at this machine's measured cost where there is one."""
    ranks = costmodel.rank_acceptance(alpha, alpha2, int(branch))
    depth = int(depth)
    verify = verify_ratio(verify_growth, measured)
    best, speedups = costmodel.best_tree_size(ranks, depth, c, verify)
    tokens = costmodel.expected_tokens_tree(ranks, depth, best)
    chain = costmodel.expected_tokens(alpha, depth)
    checking = (
        "what the probe measured on this machine" if measured else f"1 + {verify_growth:.2f}·N target steps"
    )
    text = (
        f"A tree {depth} deep whose candidates are the target's token with probability "
        f"{', '.join(f'{a:.2f}' for a in ranks)} (best first) is fastest at **N = {best}** nodes: "
        f"{tokens:.2f} tokens per round against {chain:.2f} for the chain of {depth} "
        f"(×{tokens / chain:.2f}), ×{speedups[best - 1]:.2f} over plain decoding when drafting a level costs "
        f"c and checking N+1 tokens {checking}.{_ranks_scaled(alpha, alpha2, ranks)}"
    )
    return tree_theory_figure(ranks, depth, c, verify), text


def _ranks_scaled(alpha: float, alpha2: float, ranks: list[float]) -> str:
    """Why the second choice's figure is not the slider's, where the cost model scaled it down."""
    if len(ranks) < 2 or abs(ranks[1] - alpha2) < 1e-9:
        return ""
    return (
        f" The slider's α₂ = {alpha2:.2f} and the ranks after it would add up to more than the "
        f"{1 - alpha:.2f} (1 − α) the first choice leaves; the target's token is only one of them, so "
        f"they share that {1 - alpha:.2f} in the same proportions."
    )


def run_simulation(alpha: float, gamma: float, rounds: float, seed: float, delay_s: float = 0.5):
    trace = simulate_trace(float(alpha), int(gamma), int(rounds), int(seed))
    for i in range(len(trace.rounds)):
        yield timeline_html(trace, upto=i + 1, selected=i), explain_round_markdown(trace.rounds[i], i)
        time.sleep(delay_s)
    t = trace.totals
    # A few rounds scatter widely around the formula's mean: say how widely, so a short unlucky
    # run reads as chance, not as the formula failing.
    spread = 2 * costmodel.tokens_per_round_sd(float(alpha), int(gamma)) / max(t.rounds, 1) ** 0.5
    yield (
        timeline_html(trace),
        f"{t.rounds} rounds gave {t.new_tokens} tokens: {t.tokens_per_round:.2f} per round "
        f"(the formula expects {costmodel.expected_tokens(float(alpha), int(gamma)):.2f}; over "
        f"{t.rounds} rounds about 19 runs in 20 land within ±{spread:.2f} of it, more rounds closer).",
    )
