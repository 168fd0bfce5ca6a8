"""Draft-length sweep: one prompt, a range of k, one plain baseline, a table."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import pandas as pd

from . import costmodel
from .budget import RunStopped
from .errors import SpecLensError
from .policies import K_MAX, K_MIN
from .runner import RunConfig, generate, plain_baseline
from .speculative import StopCheck
from .trace import Trace

SWEEP_COLUMNS = [
    "k",
    "acceptance_rate",
    "alpha",
    "tokens_per_round",
    "tokens_per_s",
    "baseline_tokens_per_s",
    "speedup",
    "predicted_leviathan",
    "predicted_measured",
    "draft_ms_per_token",
    "verify_ms",
    "identical_to_baseline",
]


def sweep(
    config: RunConfig,
    ks: Sequence[int],
    progress: Callable[[int, int], None] | None = None,
    should_stop: StopCheck | None = None,
) -> tuple[list[Trace], pd.DataFrame]:
    """Run `config` once per k (fixed policy) against one plain baseline.

    Stopped half-way, it returns the k values that finished; stopped before
    any did, it raises RunStopped.
    """
    ks = sorted(set(ks))
    if not ks or ks[0] < K_MIN or ks[-1] > K_MAX:
        raise SpecLensError(f"sweep k values must lie in {K_MIN}..{K_MAX}, got {list(ks)}")
    baseline = plain_baseline(config, should_stop)
    traces = []
    for i, k in enumerate(ks):
        if progress:
            progress(i, len(ks))
        trace = generate(dataclasses.replace(config, k=k, policy="fixed", baseline=False), should_stop)
        if trace.meta.stopped:  # a k measured on part of the text compares with nothing
            if not traces:
                raise RunStopped(f"{trace.meta.stopped} before the first k finished")
            break
        trace.attach_baseline(baseline)
        traces.append(trace)
    if progress:
        progress(len(ks), len(ks))
    return traces, sweep_table(traces)


def sweep_table(traces: Sequence[Trace]) -> pd.DataFrame:
    """Measured figures per k beside the two cost-model predictions.

    One alpha for the pair (pooled over every run, as the model assumes it
    does not depend on k), c from measured draft and target step times, and
    V(k+1) from the measured verify times of rounds that checked k+1 tokens.
    """
    alpha = costmodel.estimate_alpha(*traces)
    verify = costmodel.verify_cost_ms(traces)
    # One plain run for every k; with fewer than two plain tokens the predictions are NaN.
    t_target = costmodel.target_ms_per_token(traces[0].baseline.token_times_s) or math.nan
    rows = []
    for trace in traces:
        k = trace.meta.policy.k
        t_draft = costmodel.draft_ms_per_token(trace)
        v = verify.get(k + 1, t_target)
        t = trace.totals
        rows.append(
            {
                "k": k,
                "acceptance_rate": t.acceptance_rate,
                "alpha": costmodel.estimate_alpha(trace),
                "tokens_per_round": t.tokens_per_round,
                "tokens_per_s": t.tokens_per_s,
                "baseline_tokens_per_s": t.baseline_tokens_per_s,
                "speedup": t.speedup,
                "predicted_leviathan": costmodel.expected_speedup(alpha, k, t_draft / t_target),
                "predicted_measured": costmodel.expected_speedup_measured(alpha, k, t_target, t_draft, v),
                "draft_ms_per_token": t_draft,
                "verify_ms": v,
                "identical_to_baseline": t.identical_to_baseline,
            }
        )
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)
