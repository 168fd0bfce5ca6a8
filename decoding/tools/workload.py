"""Workload sweeps: every prompt of a file at every k, each run right after a plain run of its own.

A category's speedup at k is how much sooner its whole traffic finishes: the plain runs' time over
the speculative runs' time, summed over its prompts, once per repeat. Its median over the repeats
is reported with the lowest and the highest, and a category's best k is named only where it beats
every other k beyond that spread (sweep.best_setting). "all" pools every prompt of every category,
where there are two categories or more (of one, it would only repeat it).

A sweep stopped half-way (its time budget, Stop) keeps the prompts measured at every k in every
repeat: a category's rows then pool the same prompts at each k.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence

import pandas as pd

from ..api import RunConfig
from ..core.budget import RunStopped
from ..core.plain import StopCheck
from ..trace import Trace
from .sweep import BestSetting, best_of, check_ks, interleaved, speedup_spread, with_best

ALL = "all"
WORKLOAD_COLUMNS = [
    "category",
    "k",
    "prompts",
    "acceptance_rate",
    "tokens_per_round",
    "speedup",
    "speedup_low",
    "speedup_high",
    "repeats",
    "identical_to_baseline",
]


def workload_sweep(
    config: RunConfig,
    prompts: Sequence[dict],
    ks: Sequence[int],
    progress: Callable[[int, int], None] | None = None,
    should_stop: StopCheck | None = None,
    repeats: int = 3,
) -> tuple[pd.DataFrame, list[tuple[int, int]]]:
    """The table (one row per category and k, then "all"; a `best` column) and the order the
    runs were made in, as (prompt index, k): every prompt × k takes its turn once per repeat.
    Under an adaptive policy (`config.policy`) k is each run's cap."""
    ks = check_ks(ks)
    cells = [(p, k) for p in range(len(prompts)) for k in ks]
    runs = [dataclasses.replace(config, prompt=prompts[p]["prompt"], k=k, baseline=False) for p, k in cells]
    measured = whole_prompts(interleaved(runs, repeats, progress, should_stop), len(ks))
    if not measured:
        reason = (should_stop and should_stop()) or "stopped"
        raise RunStopped(f"{reason} before a prompt finished every k in every repeat")
    categories = {row["prompt"]: row.get("category") or ALL for row in prompts}
    order = [cells[step % len(cells)] for step in range(len(cells) * repeats)]
    return workload_table(measured, categories), order


def whole_prompts(measured: Sequence[Sequence[Trace]], ks: int) -> list[Sequence[Trace]]:
    """The measured cells of the prompts measured at all `ks` k values: a stop can leave a prompt
    done at its first k only, and a category's row at that k would pool other prompts than the next."""
    done = Counter(runs[0].meta.prompt for runs in measured)
    return [runs for runs in measured if done[runs[0].meta.prompt] >= ks]


def workload_table(measured: Sequence[Sequence[Trace]], categories: dict[str, str]) -> pd.DataFrame:
    """Rows per (category, k) of the prompts × k measured (each a list of repeats), then per ("all",
    k) where they hold two categories or more."""
    pooled = len({categories[runs[0].meta.prompt] for runs in measured}) > 1
    groups: dict[tuple[str, int], list[Sequence[Trace]]] = {}
    for runs in measured:
        k = runs[0].meta.policy.k
        category = categories[runs[0].meta.prompt]
        groups.setdefault((category, k), []).append(runs)
        if pooled and category != ALL:
            groups.setdefault((ALL, k), []).append(runs)
    rows = [{"category": c, "k": k, **group_figures(cells)} for (c, k), cells in groups.items()]
    table = pd.DataFrame(rows, columns=WORKLOAD_COLUMNS)
    table = table.sort_values(
        ["category", "k"], key=lambda s: s.map(_category_order) if s.name == "category" else s
    )
    parts = [with_best(part.reset_index(drop=True), "k") for _, part in table.groupby("category", sort=False)]
    return pd.concat(parts, ignore_index=True) if parts else table.assign(best=False)


def _category_order(category: str) -> tuple[bool, str]:
    return category == ALL, category  # "all" last


def group_figures(cells: Sequence[Sequence[Trace]]) -> dict:
    """Figures of prompts run at one k: per repeat, plain time over speculative time for them all."""
    repeats = min(len(runs) for runs in cells)
    ratios = [
        sum(_plain_s(runs[r]) for runs in cells) / sum(runs[r].totals.wall_s for runs in cells)
        for r in range(repeats)
    ]
    traces = [t for runs in cells for t in runs[:repeats]]
    proposed = sum(t.totals.proposed for t in traces)
    return {
        "prompts": len(cells),
        "acceptance_rate": sum(t.totals.accepted for t in traces) / proposed if proposed else 0.0,
        "tokens_per_round": sum(t.totals.new_tokens for t in traces)
        / max(sum(t.totals.rounds for t in traces), 1),
        **speedup_spread(ratios),
        "identical_to_baseline": all(t.totals.identical_to_baseline for t in traces),
    }


def _plain_s(trace: Trace) -> float:
    """How long the plain run of this prompt took for the same tokens."""
    return trace.totals.new_tokens / trace.totals.baseline_tokens_per_s


def best_ks(table: pd.DataFrame) -> dict[str, BestSetting]:
    """Each category's best k, or its top k and why none is named best (sweep.best_of)."""
    return {category: best_of(part, "k") for category, part in table.groupby("category", sort=False)}


def run_labels(prompts: int, ks: Sequence[int]) -> list[str]:
    """Each run's name, in the order `workload_sweep` makes them, for its progress reports."""
    return [f"prompt {p + 1} of {prompts}, k = {k}" for p in range(prompts) for k in ks]
