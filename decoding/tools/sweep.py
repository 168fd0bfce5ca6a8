"""Sweeps: one prompt, a range of k (or of tree sizes), one plain baseline, a table."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import pandas as pd

from .. import costmodel
from ..api import RunConfig, generate, plain_baseline
from ..core.budget import RunStopped
from ..core.plain import StopCheck
from ..core.tree import MAX_TREE_NODES
from ..errors import SpecLensError
from ..settings.policies import K_MAX, K_MIN
from ..trace import Trace

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
TREE_COLUMNS = [
    "nodes",
    "tokens_per_round",
    "tokens_per_s",
    "baseline_tokens_per_s",
    "speedup",
    "verify_ms",
    "verify_ratio",
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
    runs = [dataclasses.replace(config, k=k, policy="fixed", baseline=False) for k in ks]
    traces = _against_plain(config, runs, progress, should_stop)
    return traces, sweep_table(traces)


def tree_sweep(
    config: RunConfig,
    sizes: Sequence[int],
    progress: Callable[[int, int], None] | None = None,
    should_stop: StopCheck | None = None,
) -> tuple[list[Trace], pd.DataFrame]:
    """Run `config` once per tree size N (0: the chain) at its k, against one plain baseline."""
    sizes = sorted(set(sizes))
    if not sizes or sizes[0] < 0 or sizes[-1] > MAX_TREE_NODES:
        raise SpecLensError(f"tree sizes must lie in 0..{MAX_TREE_NODES} (0: a chain), got {list(sizes)}")
    runs = [dataclasses.replace(config, tree_nodes=n, policy="fixed", baseline=False) for n in sizes]
    traces = _against_plain(config, runs, progress, should_stop)
    return traces, tree_table(traces)


def parse_sizes(text: str) -> list[int]:
    """Tree sizes as typed ("0, 4, 8, 16"), sorted; one clear line for anything else."""
    try:
        sizes = sorted({int(x) for x in (text or "").replace(",", " ").split()})
    except ValueError:
        raise SpecLensError(f"tree sizes are whole numbers separated by commas, got '{text}'") from None
    if not sizes:
        raise SpecLensError("give the tree sizes to sweep, e.g. 0, 4, 8, 16 (0: the chain)")
    return sizes


def _against_plain(
    config: RunConfig,
    runs: list[RunConfig],
    progress: Callable[[int, int], None] | None,
    should_stop: StopCheck | None,
) -> list[Trace]:
    baseline = plain_baseline(config, should_stop)
    traces = []
    for i, run in enumerate(runs):
        if progress:
            progress(i, len(runs))
        trace = generate(run, should_stop)
        if trace.meta.stopped:  # a setting measured on part of the text compares with nothing
            if not traces:
                raise RunStopped(f"{trace.meta.stopped} before the first setting finished")
            break
        trace.attach_baseline(baseline)
        traces.append(trace)
    if progress:
        progress(len(runs), len(runs))
    return traces


def tree_table(traces: Sequence[Trace]) -> pd.DataFrame:
    """Measured figures per tree size; the verify cost as a multiple of a plain target step."""
    t_target = costmodel.target_ms_per_token(traces[0].baseline.token_times_s) or math.nan
    rows = []
    for trace in traces:
        t, rounds = trace.totals, trace.rounds
        verify = t.verify_s * 1e3 / len(rounds) if rounds else math.nan
        rows.append(
            {
                "nodes": trace.meta.tree_nodes,
                "tokens_per_round": t.tokens_per_round,
                "tokens_per_s": t.tokens_per_s,
                "baseline_tokens_per_s": t.baseline_tokens_per_s,
                "speedup": t.speedup,
                "verify_ms": verify,
                "verify_ratio": verify / t_target,
                "identical_to_baseline": t.identical_to_baseline,
            }
        )
    return pd.DataFrame(rows, columns=TREE_COLUMNS)


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
