"""Sweeps: one prompt, a range of k (or of tree sizes), a table.

Every setting is measured `repeats` times, each time right after a plain run of its own, the
settings taking turns (k=1, k=2, …, then again), so that a machine that speeds up or slows down
falls on all of them alike. A setting's speedup is the median of its repeats (of an even number,
the mean of the middle two), with the lowest and highest beside it; the best is named only where it
beats the runner-up beyond that spread (`best_of` says which, or why none, for the app and the CLI
alike).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
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

SPREAD = ["speedup_low", "speedup_high", "repeats"]
MAX_REPEATS = 9
SWEEP_COLUMNS = [
    "k",
    "acceptance_rate",
    "alpha",
    "tokens_per_round",
    "tokens_per_s",
    "baseline_tokens_per_s",
    "speedup",
    *SPREAD,
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
    *SPREAD,
    "verify_ms",
    "verify_ratio",
    "identical_to_baseline",
]


def sweep(
    config: RunConfig,
    ks: Sequence[int],
    progress: Callable[[int, int], None] | None = None,
    should_stop: StopCheck | None = None,
    repeats: int = 3,
) -> tuple[list[Trace], pd.DataFrame]:
    """Run `config` for each k (the cap, under an adaptive policy), each against plain runs of its own.

    Stopped half-way, it returns the k values whose every repeat finished;
    stopped before any did, it raises RunStopped. The traces are each k's
    median run.
    """
    ks = check_ks(ks)
    runs = [dataclasses.replace(config, k=k, baseline=False) for k in ks]
    measured = interleaved(runs, repeats, progress, should_stop)
    return [median_run(ts) for ts in measured], with_best(sweep_table(measured), "k")


def check_ks(ks: Sequence[int]) -> list[int]:
    """The k values sorted, once each; one clear line when one lies outside what a policy takes."""
    ks = sorted(set(ks))
    if not ks or ks[0] < K_MIN or ks[-1] > K_MAX:
        raise SpecLensError(f"sweep k values must lie in {K_MIN}..{K_MAX}, got {list(ks)}")
    return ks


def tree_sweep(
    config: RunConfig,
    sizes: Sequence[int],
    progress: Callable[[int, int], None] | None = None,
    should_stop: StopCheck | None = None,
    repeats: int = 3,
) -> tuple[list[Trace], pd.DataFrame]:
    """Run `config` for each tree size N (0: the chain) at its k, each against plain runs of its own."""
    sizes = sorted(set(sizes))
    if not sizes or sizes[0] < 0 or sizes[-1] > MAX_TREE_NODES:
        raise SpecLensError(f"tree sizes must lie in 0..{MAX_TREE_NODES} (0: a chain), got {list(sizes)}")
    runs = [dataclasses.replace(config, tree_nodes=n, policy="fixed", baseline=False) for n in sizes]
    measured = interleaved(runs, repeats, progress, should_stop)
    return [median_run(ts) for ts in measured], with_best(tree_table(measured), "nodes")


def parse_sizes(text: str) -> list[int]:
    """Tree sizes as typed ("0, 4, 8, 16"), sorted; one clear line for anything else."""
    try:
        sizes = sorted({int(x) for x in (text or "").replace(",", " ").split()})
    except ValueError:
        raise SpecLensError(f"tree sizes are whole numbers separated by commas, got '{text}'") from None
    if not sizes:
        raise SpecLensError("give the tree sizes to sweep, e.g. 0, 4, 8, 16 (0: the chain)")
    return sizes


def interleaved(
    runs: list[RunConfig],
    repeats: int,
    progress: Callable[[int, int], None] | None,
    should_stop: StopCheck | None,
) -> list[list[Trace]]:
    """Each run's traces, one a repeat, each with the plain run made just before it attached; the
    runs take turns. A stop keeps the settings whose every repeat finished."""
    if not 1 <= repeats <= MAX_REPEATS:
        raise SpecLensError(f"repeats must be from 1 to {MAX_REPEATS}, got {repeats}")
    measured: list[list[Trace]] = [[] for _ in runs]
    total = len(runs) * repeats
    for step in range(total):
        i = step % len(runs)
        if progress:
            progress(step, total)
        try:
            baseline = plain_baseline(runs[i], should_stop)
            trace = generate(runs[i], should_stop)
            if trace.meta.stopped:  # a part of the text compares with nothing
                raise RunStopped(trace.meta.stopped)
        except RunStopped as stop:
            done = [ts for ts in measured if len(ts) == repeats]
            if not done:
                raise RunStopped(f"{stop} before a setting finished all its repeats") from None
            return done
        trace.attach_baseline(baseline)
        measured[i].append(trace)
    if progress:
        progress(total, total)
    return measured


def median_run(traces: Sequence[Trace]) -> Trace:
    """The repeat a setting is shown by: the one whose speedup is the median (of an even count, the
    lower middle one; the table's speedup is still the median, from `spread`)."""
    ranked = sorted(traces, key=lambda t: t.totals.speedup)
    return ranked[(len(ranked) - 1) // 2]


def spread(traces: Sequence[Trace]) -> dict:
    """The median speedup of a setting's repeats, the lowest and the highest."""
    return speedup_spread([t.totals.speedup for t in traces])


def speedup_spread(speedups: Sequence[float]) -> dict:
    return {
        "speedup": statistics.median(speedups),
        "speedup_low": min(speedups),
        "speedup_high": max(speedups),
        "repeats": len(speedups),
    }


def progress_reporter(labels: Sequence[str], say: Callable[[float, str], None]) -> Callable[[int, int], None]:
    """The callback `interleaved` reports to, saying which run is next (`labels`: one a setting, in
    the order the settings take turns) and then "done", as a share done and a line."""

    def report(done: int, total: int) -> None:
        say(
            done / total,
            f"{labels[done % len(labels)]} (run {done + 1} of {total})" if done < total else "done",
        )

    return report


@dataclasses.dataclass(frozen=True)
class BestSetting:
    """What a sweep's table says: its clear best setting, or, where none is clear, the top one and
    why it is not named best. The app and the CLI only word it."""

    value: int | str  # the setting (k, N or a draft source)
    clear: bool
    speedup: float  # the median over the repeats
    speedup_low: float
    speedup_high: float
    repeats: int
    tokens_per_round: float

    @property
    def why_not(self) -> str:
        """Why the top setting is not named best; empty when it is."""
        if self.clear:
            return ""
        if self.repeats == 1:
            return "measured once: one repeat has no spread to tell a best from noise"
        return f"within another setting's spread over {self.repeats} repeats"


def best_of(table: pd.DataFrame, column: str) -> BestSetting:
    """The row `with_best` starred, else the one with the highest median speedup."""
    starred = table[table["best"]]
    clear = not starred.empty
    row = starred.iloc[0] if clear else table.loc[table["speedup"].idxmax()]
    value = row[column]
    return BestSetting(
        value=value if isinstance(value, str) else int(value),
        clear=clear,
        speedup=float(row["speedup"]),
        speedup_low=float(row["speedup_low"]),
        speedup_high=float(row["speedup_high"]),
        repeats=int(table["repeats"].min()),
        tokens_per_round=float(row["tokens_per_round"]),
    )


def with_best(table: pd.DataFrame, column: str) -> pd.DataFrame:
    """The table with a `best` column: true on the clear best setting's row alone, if there is one."""
    best = best_setting(table, column)
    return table.assign(best=table[column] == best if best is not None else False)


def best_setting(table: pd.DataFrame, column: str) -> int | None:
    """The setting with the highest median speedup, where its lowest repeat beats every other
    setting's highest; None when two settings' spreads overlap at the top (no clear best), and
    when each setting ran once (no spread to tell a best from noise)."""
    if table.empty or ("repeats" in table and len(table) > 1 and table["repeats"].max() < 2):
        return None
    ranked = table.sort_values("speedup", ascending=False)
    best = ranked.iloc[0]
    if len(ranked) > 1 and best["speedup_low"] <= ranked.iloc[1:]["speedup_high"].max():
        return None
    return int(best[column])


def tree_table(measured: Sequence[Sequence[Trace]]) -> pd.DataFrame:
    """Measured figures per tree size (its median run, and the spread of its repeats); the verify
    cost as a multiple of a plain target step."""
    rows = []
    for runs in measured:
        trace = median_run(runs)
        t_target = costmodel.target_ms_per_token(trace.baseline.token_times_s) or math.nan
        t, rounds = trace.totals, trace.rounds
        verify = t.verify_s * 1e3 / len(rounds) if rounds else math.nan
        rows.append(
            {
                "nodes": trace.meta.tree_nodes,
                "tokens_per_round": t.tokens_per_round,
                "tokens_per_s": t.tokens_per_s,
                "baseline_tokens_per_s": t.baseline_tokens_per_s,
                **spread(runs),
                "verify_ms": verify,
                "verify_ratio": verify / t_target,
                "identical_to_baseline": t.identical_to_baseline,
            }
        )
    return pd.DataFrame(rows, columns=TREE_COLUMNS)


def sweep_table(measured: Sequence[Sequence[Trace]]) -> pd.DataFrame:
    """Measured figures per k (its median run, and the spread of its repeats) beside the two
    cost-model predictions.

    One alpha for the pair (pooled over every run, as the model assumes it
    does not depend on k), c from measured draft and target step times, and
    V(k+1) from the measured verify times of rounds that checked k+1 tokens.
    """
    traces = [median_run(runs) for runs in measured]
    alpha = costmodel.estimate_alpha(*traces)
    verify = costmodel.verify_cost_ms(traces)
    rows = []
    for trace, runs in zip(traces, measured, strict=True):
        # Each k's own plain run; with fewer than two plain tokens the predictions are NaN.
        t_target = costmodel.target_ms_per_token(trace.baseline.token_times_s) or math.nan
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
                **spread(runs),
                "predicted_leviathan": costmodel.expected_speedup(alpha, k, t_draft / t_target),
                "predicted_measured": costmodel.expected_speedup_measured(alpha, k, t_target, t_draft, v),
                "draft_ms_per_token": t_draft,
                "verify_ms": v,
                "identical_to_baseline": t.identical_to_baseline,
            }
        )
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)
