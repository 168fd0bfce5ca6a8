"""Draft sources side by side: one prompt, several drafts, each measured against plain runs of its
own, the sources taking turns (the sweep's method, tools/sweep.py), in one table."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import pandas as pd

from .. import costmodel
from ..api import RunConfig
from ..core.plain import StopCheck
from ..errors import SpecLensError
from ..trace import Trace
from .sweep import interleaved, median_run, spread, with_best

COMPARE_COLUMNS = [
    "draft",
    "acceptance_rate",
    "tokens_per_round",
    "draft_cost",
    "tokens_per_s",
    "baseline_tokens_per_s",
    "speedup",
    "speedup_low",
    "speedup_high",
    "repeats",
    "identical_to_baseline",
]


def parse_drafts(text: str) -> list[str]:
    """Draft sources as typed ("ngram, head, layers:8"), in order, each once."""
    drafts = list(dict.fromkeys(d.strip() for d in (text or "").split(",") if d.strip()))
    if not drafts:
        raise SpecLensError("name the draft sources to compare, e.g. ngram, suffix, head, layers:20")
    return drafts


def compare(
    config: RunConfig,
    drafts: Sequence[str],
    progress: Callable[[int, int], None] | None = None,
    should_stop: StopCheck | None = None,
    repeats: int = 3,
) -> tuple[list[Trace], pd.DataFrame]:
    """Each draft's median run and the table; the best source starred only beyond the spread."""
    runs = [dataclasses.replace(config, draft=d, baseline=False) for d in drafts]
    measured = interleaved(runs, repeats, progress, should_stop)
    table = compare_table(measured)
    table["rank"] = range(len(table))  # best_setting names a setting by a whole number
    table = with_best(table, "rank").drop(columns="rank")
    return [median_run(ts) for ts in measured], table


def compare_table(measured: Sequence[Sequence[Trace]]) -> pd.DataFrame:
    rows = []
    for runs in measured:
        trace = median_run(runs)
        t = trace.totals
        step = costmodel.target_ms_per_token(trace.baseline.token_times_s) or math.nan
        rows.append(
            {
                "draft": trace.meta.draft,
                "acceptance_rate": t.acceptance_rate,
                "tokens_per_round": t.tokens_per_round,
                "draft_cost": costmodel.draft_ms_per_token(trace) / step,
                "tokens_per_s": t.tokens_per_s,
                "baseline_tokens_per_s": t.baseline_tokens_per_s,
                **spread(runs),
                "identical_to_baseline": all(r.totals.identical_to_baseline for r in runs),
            }
        )
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)
