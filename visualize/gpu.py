"""Explore's "On a GPU": a finished run's acceptance priced on each GPU whose figures are recorded
(costmodel.price_on_gpu), k by k beside what the run measured where it ran. A prediction, said so
in its heading and its sentence, with the card, how its figures were measured and where they are."""

from __future__ import annotations

from collections.abc import Sequence

from decoding.costmodel import GpuFigures, GpuPricing, price_on_gpu
from decoding.trace import Trace

from .explain import md_escape

NOTHING_YET = "Run a prompt first: its acceptance by position is what is priced here."
NO_FIGURES = "No GPU figures are recorded (`benchmarks/gpu-*/`): there is nothing to price this run on."


def on_gpu_markdown(trace: Trace | None, sets: Sequence[GpuFigures]) -> str:
    """For each recorded figure set: a table of k, this run's measured speedup at its own k, and the
    predicted speedup and tokens/s on the card; or one line saying why nothing is predicted there."""
    if trace is None or not trace.rounds:
        return NOTHING_YET
    if not sets:
        return NO_FIGURES
    return "\n\n".join(_priced(trace, price_on_gpu(trace, figures)) for figures in sets)


def _heading(figures: GpuFigures) -> str:
    return f"**Predicted on the {md_escape(figures.card)}**, {md_escape(figures.conditions())}"


def _measured(trace: Trace) -> str:
    t = trace.totals
    return (
        f"×{t.speedup:.2f} ({t.tokens_per_s:.1f} tok/s)" if t.speedup else "not compared with plain decoding"
    )


def _priced(trace: Trace, pricing: GpuPricing) -> str:
    heading = _heading(pricing.figures)
    if pricing.unpriced:
        return f"{heading}: {md_escape(pricing.unpriced)}."
    k, measured = trace.meta.policy.k, _measured(trace)
    device = trace.meta.device or ""
    where = (
        "CPU" if device == "cpu" else "GPU" if device.startswith("cuda") else md_escape(device) or "machine"
    )
    rows = [
        f"| k | this run, measured on its {where} | predicted speedup | predicted tok/s |",
        "|---|---|---|---|",
        *(
            f"| {p.k} | {measured if p.k == k else '–'} | ×{p.speedup:.2f} | {p.tokens_per_s:.1f} |"
            for p in pricing.prices
        ),
    ]
    last = pricing.prices[-1].k
    notes = [
        "A prediction, not a measurement: the cost model with this run's acceptance by position and the "
        "card's measured V(n), each round drafting what it drafted, k at most; tok/s at the card's "
        f"one-token step of {pricing.step_ms:.2f} ms (plain decoding {1e3 / pricing.step_ms:.1f} tok/s "
        f"there, the forward pass alone); {md_escape(pricing.draft_cost)}."
    ]
    if not pricing.figures.graphs:
        notes.append("With CUDA graphs off, each step there pays for launching its kernels from Python.")
    if k > last:
        notes.append(
            f"This run (k = {k}) measured {measured}; no draft position past {last} was reached, so no "
            "larger k is priced."
        )
    if trace.meta.policy.name != "fixed":
        notes.append(f"The run's k varied under the {trace.meta.policy.name} policy, {k} at most.")
    return "\n".join([heading, "", *rows, "", " ".join(notes)])
