"""Theory: the cost model's best γ, trees and concurrency, on this machine's measured V(n) where
the probe measured it, and a simulated run stepped round by round."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import gradio as gr

from app.common import (
    gpu,
    user_errors,
)
from decoding import costmodel
from decoding.models.loading import load_model
from decoding.models.paths import check_allowed
from decoding.tools.batch_bench import load_measured
from decoding.tools.probe import kept, measure, provenance, verify_ratios
from visualize.charts import (
    add_measured_batches,
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
# Where the tab's V(n) comes from once the probe measured it: moving b chooses b's line, which the
# views are given as an empty V(n) ({}: measured, not used), never measured being None.
MEASURED, SLIDER = "V(n) measured here", "the b slider: 1 + b·(n − 1)"
B_CHOSEN = "This follows b, as chosen above; *V(n) from* goes back to this machine's measured V(n)."


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
    """What serving several requests at once does to speculation, from this machine's V(n) when
    measured: the chart and its sentence read one table (costmodel.concurrency_speedups)."""
    batches = costmodel.CONCURRENCY
    table = costmodel.concurrency_speedups(
        alpha, c, verify_ratio(verify_growth, measured), range(1, 7), batches
    )
    rows = max(measured) if measured else None
    source = (
        "the step costs measured on this machine"
        if measured
        else f"the slider's verify cost b = {verify_growth:.2f}"
    )
    text = (
        f"**Predicted** from {source} (not measured runs): B requests decoded together check B rows a step; "
        f"speculating, B·(k+1). {concurrency_verdicts(table, batches, rows)}"
        + (_beyond(rows) if rows and any(b * (k + 1) > rows for k in table for b in batches) else "")
        + (f" {NOT_MEASURED}" if measured is None else "" if measured else f" {B_CHOSEN}")
    )
    return concurrency_figure(table, batches, rows), text


def with_measured_batches(
    target: str, alpha: float, c: float, verify_growth: float, measured: dict | None = None
):
    """`run_concurrency`, with what the Traffic tab measured here for `target` where it did: its
    speedups as markers on the chart, and a sentence saying which figures are measured."""
    figure, text = run_concurrency(alpha, c, verify_growth, measured)
    found = load_measured((target or "").strip())
    if found is None:
        return figure, text + " The Traffic tab measures it on this machine."
    add_measured_batches(figure, found["rows"])
    return figure, text + " " + measured_batches_text(found)


def measured_batches_text(found: dict) -> str:
    """Which figures the Traffic tab measured: when, with which draft, and its speedups by k and B."""
    by_k: dict[int, list[str]] = {}
    for r in found["rows"]:
        by_k.setdefault(int(r["k"]), []).append(f"×{r['speedup']:.2f} at B = {int(r['batch'])}")
    said = "; ".join(f"k = {k}: {', '.join(v)}" for k, v in sorted(by_k.items()))
    return (
        f"**Measured** here on {found['date'][:10]} (Traffic tab, draft {found['draft']}, the markers): {said}. "
        "The lines stay the prediction from α, c and V(n)."
    )


def concurrency_verdicts(table: dict[int, list[float]], batches: Sequence[int], rows: int | None) -> str:
    """Where each k's line lies below 1, read off the chart's own table: "stops paying at B" only
    where it stays below from there on, else every B where it is below and where above again."""

    def at(k: int, bs: list[int]) -> str:
        guessed = [b for b in bs if rows and b * (k + 1) > rows]
        return ", ".join(f"{b}{' (a guess)' if b in guessed else ''}" for b in bs)

    never, stops, dips = [], [], []
    for k, speedups in table.items():
        below = [b for b, s in zip(batches, speedups, strict=True) if s < 1.0]
        if not below:
            continue
        if below == list(batches):
            never.append(str(k))
        elif below == list(batches[batches.index(below[0]) :]):
            stops.append(f"k = {k} at B = {at(k, below[:1])}")
        else:
            above = [b for b in batches if b > below[0] and b not in below]
            dips.append(f"k = {k} is below 1 at B = {at(k, below)} and above it again at B = {at(k, above)}")
    verdicts = [
        *([f"At k = {', '.join(never)} it does not pay even alone."] if never else []),
        *([f"Speculation stops paying at {', '.join(stops)}."] if stops else []),
        *([f"{'; '.join(dips)}."] if dips else []),
    ]
    return " ".join(verdicts) or f"Up to B = {batches[-1]} it pays at every k."


def _beyond(rows: int) -> str:
    return (
        f" V(n) was measured for 1–{rows} rows; where B·(k+1) is more, it goes on along its last measured "
        "slope, a straight-line guess: the chart draws that part dashed."
    )


def cached_verify(target: str):
    """What the probe measured for the sidebar's target on this machine, if it ever did: the
    Theory tab opens on it. Nothing is measured here on opening: a probe takes every core for
    minutes on a 2-core machine, and timed beside a visitor's run it would be wrong."""
    name = (target or "").strip()
    found, why_not = kept(name)
    if found is None:
        said = "Nothing measured yet" if why_not == "never measured here" else f"For this target, {why_not}"
        return None, f"{said} for **{name}** on this machine. {NOT_MEASURED}"
    return verify_ratios(found), measured_text(found)


def open_verify(target: str):
    """`cached_verify` for the page: the V(n) found, the one the views use (the same), the choice
    between it and the b slider (shown once there is a V(n) to choose), the sentence."""
    ratios, text = cached_verify(target)
    return ratios, ratios, _source_choice(ratios), text


def _source_choice(ratios: dict | None):
    return gr.update(value=MEASURED, visible=bool(ratios))


def pick_source(choice: str, found: dict | None) -> dict | None:
    """The V(n) every view uses: the one measured here, or {} (the b slider's line chosen over it)."""
    return found if choice == MEASURED or not found else {}


def slider_moved(found: dict | None):
    """Moving b asks for b's line: every view it feeds follows it, not only one curve; the choice
    says so, and switches back."""
    return ({}, gr.update(value=SLIDER)) if found else (None, gr.update())


def check_measure(target: str) -> None:
    with user_errors():
        check_allowed(target)
        load_model((target or "").strip())


@gpu
def measure_verify(target: str):
    """Time the target's pass over 1 to 64 tokens here (decoding/tools/probe.py); as `open_verify`."""
    with user_errors():
        check_allowed(target)
        found = measure(load_model((target or "").strip()))
        ratios = verify_ratios(found)
        return ratios, ratios, _source_choice(ratios), measured_text(found)


def measured_text(found: dict) -> str:
    ratios = verify_ratios(found)
    table = ", ".join(f"V({n})/V(1) = {r:.2f}" for n, r in ratios.items())
    under = [f"V({n})" for n, r in ratios.items() if r < 1]
    held = (
        f" {', '.join(under)} under V(1) lie{'s' * (len(under) == 1)} within the passes' noise: the "
        "predictions count V(1) there, since checking more tokens cannot cost less."
        if under
        else ""
    )
    return (
        f"Measured here for **{found['target']}** ({found['dtype']}, {found['device']}) on "
        f"{found.get('measured_at', '?')[:10]}: {table}; one token takes {found['1']['step_ms']:.1f} ms "
        f"({provenance(found, day=False)}).{held} The best γ, the curve *speedup (V measured here)*, the "
        "concurrency chart and the trees use them in place of the b slider; moving b puts its line back "
        "in all of them."
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
