"""Sweep: measured speedup over k, tree sizes, a workload's prompts or draft sources, with the
best setting said only where it beats the rest beyond the spread of the repeats."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from app.common import (
    ASSETS,
    DRAFT_SOURCES,
    SETTINGS,
    by_name,
    download_folder,
    draft_spec,
    gpu,
    make_config,
    session_budget,
    user_errors,
)
from decoding.api import RunConfig, prepare
from decoding.core.budget import RunBudget, RunStopped
from decoding.errors import SpecLensError
from decoding.tools.compare import compare
from decoding.tools.prompts import read_prompts
from decoding.tools.sweep import (
    SWEEP_COLUMNS,
    BestSetting,
    best_of,
    parse_sizes,
    progress_reporter,
    sweep,
    tree_sweep,
)
from decoding.tools.workload import ALL, best_ks, run_labels, workload_sweep
from decoding.trace import Trace, agreement
from visualize.busy import with_busy_note
from visualize.charts import (
    acceptance_vs_k,
    compare_figure,
    compare_tokens_figure,
    note_figure,
    speedup_curve,
    tree_size_curve,
    tree_verify_cost,
    workload_curve,
    workload_tokens_per_round,
)
from visualize.glossary import header
from visualize.race import race_many_html

SWEEP_INPUTS = (
    *("prompt", *SETTINGS, "sweep_over", "k_from", "k_to", "tree_sizes", "repeats"),
    *("workload", "workload_file", "sources"),
)
SWEEP_OVER = ("draft length k", "tree size N (depth k)", "k over a workload", "draft sources")
DEV_PROMPTS = ASSETS / "prompts" / "specbench_dev.jsonl"
WORKLOAD_PER_CATEGORY = 2  # of the dev file, as the benchmarks take them, for one category
# Every category: the first prompt of each (6), so that the default sweep (k 1-4, 3 repeats: 72 runs,
# each after a plain run of its own) fits the time budget on a 2-core CPU.
EVERY_CATEGORY_PROMPTS = 1
MAX_WORKLOAD_PROMPTS = 24  # of an uploaded file: a sweep runs each of them at every k, repeats times
EVERY_CATEGORY = "Spec-Bench dev: every category"
SUFFIX_IN_EXPLORE = (
    "suffix decoding learns from this session's earlier runs, which a sweep would mix up: "
    "try it in Explore (run a prompt twice), or with `python -m decoding compare --drafts suffix,…`"
)
NO_RACE = gr.update(value="", visible=False)
TABLE_HEADERS = [header(c) for c in (*SWEEP_COLUMNS, "best")]  # before the first sweep


@gpu
@by_name(SWEEP_INPUTS)
def check_sweep(settings: dict) -> None:
    """Refuse bad sweep settings before the sweep starts (see `check_explore`)."""
    with user_errors():
        config, values, mode = sweep_plan(settings)
        if mode == "workload":
            workload_prompts(settings["workload"], settings["workload_file"])
        if mode == "sources":
            for spec in source_specs(settings):
                prepare(replace(config, draft=spec))
        prepare(config)


def sweep_plan(settings: Mapping[str, Any]) -> tuple[RunConfig, list[int], str]:
    """The first run's settings, the values swept, and what over: "k", "trees" or "workload"."""
    lo, hi = sorted((int(settings["k_from"]), int(settings["k_to"])))
    mode = {SWEEP_OVER[1]: "trees", SWEEP_OVER[2]: "workload", SWEEP_OVER[3]: "sources"}.get(
        settings["sweep_over"], "k"
    )
    # Over trees: each size at the sidebar's k, from the chain up; over k: from lo up; sources: the
    # sidebar's k, as the sidebar's models and sampling.
    fixed = {"policy": "fixed", **{"trees": {"tree_nodes": 0}, "sources": {}}.get(mode, {"k": lo})}
    values = parse_sizes(settings["tree_sizes"]) if mode == "trees" else list(range(lo, hi + 1))
    if mode == "workload":  # each run names its own prompt; the box's may be empty
        fixed["prompt"] = "-"
    config = make_config(settings | fixed)
    if config.draft == "suffix" and mode != "sources":
        raise SpecLensError(SUFFIX_IN_EXPLORE)
    return config, values, mode


def workload_choices() -> list[str]:
    categories = dict.fromkeys(row["category"] for row in read_prompts(DEV_PROMPTS, WORKLOAD_PER_CATEGORY))
    return [EVERY_CATEGORY, *(f"Spec-Bench dev: {c}" for c in categories)]


def workload_prompts(choice: str, upload: str | None) -> list[dict]:
    """An uploaded JSONL's prompts, else the dev file's first two of the chosen category, or the
    first of every category."""
    if upload:
        rows = read_prompts(Path(upload), need_category=False)
        if len(rows) > MAX_WORKLOAD_PROMPTS:
            raise SpecLensError(
                f"the file holds {len(rows)} prompts; a sweep here takes at most {MAX_WORKLOAD_PROMPTS} "
                "(run `python -m decoding sweep --prompts FILE` for more)"
            )
        return rows
    if choice in (None, "", EVERY_CATEGORY):
        return read_prompts(DEV_PROMPTS, EVERY_CATEGORY_PROMPTS)
    wanted = choice.removeprefix("Spec-Bench dev: ")
    return [r for r in read_prompts(DEV_PROMPTS, WORKLOAD_PER_CATEGORY) if r["category"] == wanted]


@gpu
@by_name(SWEEP_INPUTS)
def run_sweep(settings: dict, progress: gr.Progress = gr.Progress(), request: gr.Request = None):
    """Measured speedup for each k in [k_from, k_to], beside the cost model's predictions;
    sweeping tree sizes, for each N at the sidebar's k; over a workload, per category."""
    with user_errors(), session_budget(request) as budget:
        config, values, mode = sweep_plan(settings)
        try:
            if mode == "workload":
                return _workload_sweep(settings, config, values, progress, budget)
            if mode == "sources":
                return _compare_sources(settings, config, progress, budget)
            return _sweep_k_or_trees(settings, config, values, mode, progress, budget)
        except RunStopped as stop:
            return stopped_views(str(stop))


def stopped_views(reason: str) -> tuple:
    """A sweep ended (the time budget, Stop) before any setting finished: charts and a summary
    that say so, and why, with nothing in them to be read as measured."""
    said = reason[:1].upper() + reason[1:]
    if "time limit" in reason:
        said += (
            ". A sweep's runs share that one budget: sweep fewer k values, tree sizes, sources or prompts "
            "(one category of a workload), with fewer repeats or tokens"
        )
    figure = note_figure("Nothing measured", said)
    return figure, figure, None, None, f"**Nothing measured**: {said}.", NO_RACE


def _sweep_k_or_trees(
    settings: dict, config: RunConfig, values: list[int], mode: str, progress: gr.Progress, budget: RunBudget
):
    name = "N" if mode == "trees" else "k"
    report = progress_reporter([f"{name} = {v}" for v in values], _say(progress))
    if mode == "trees":
        traces, table = tree_sweep(config, values, report, budget, int(settings["repeats"]))
        figures = tree_size_curve(table), tree_verify_cost(table)
    else:
        traces, table = sweep(config, values, report, budget, int(settings["repeats"]))
        figures = speedup_curve(table), acceptance_vs_k(table)
    summary = sweep_summary(table, traces, "nodes" if mode == "trees" else "k")
    if len(traces) < len(values):
        finished = ", ".join(str(t.meta.tree_nodes if mode == "trees" else t.meta.policy.k) for t in traces)
        summary += f" **{budget() or 'Stopped'}**: only {name} = {finished} finished every repeat."
    return *figures, shown(table), _csv(table), summary, NO_RACE


def _say(progress: gr.Progress) -> Callable[[float, str], None]:
    return lambda share, text: progress(share, desc=text)


def source_specs(settings: Mapping[str, Any]) -> list[str]:
    """The draft sources ticked for a comparison, as `build_draft` names them; two at least."""
    chosen = list(settings["sources"] or [])
    if len(chosen) < 2:
        raise SpecLensError("tick two draft sources or more to compare them")
    if any(DRAFT_SOURCES.get(s) == "suffix" for s in chosen):
        raise SpecLensError(SUFFIX_IN_EXPLORE)
    return [draft_spec(s, settings["n_layers"], settings["draft_model"]) for s in chosen]


def _compare_sources(settings: dict, config: RunConfig, progress: gr.Progress, budget: RunBudget):
    specs = source_specs(settings)
    report = progress_reporter(specs, _say(progress))
    traces, table = compare(config, specs, report, budget, int(settings["repeats"]))
    summary = compare_summary(table, traces)
    if len(traces) < len(specs):
        summary += f" **{budget() or 'Stopped'}**: only {', '.join(t.meta.draft for t in traces)} finished every repeat."
    race = gr.update(value=race_many_html(traces), visible=True)
    return compare_figure(table), compare_tokens_figure(table), shown(table), _csv(table), summary, race


def compare_summary(table, traces: list[Trace]) -> str:
    """The fastest source, starred only beyond the spread of the repeats, and what the outputs show."""
    best = best_of(table, "draft")
    if not best.clear:
        head = (
            f"**No clear best source**: the fastest, {best.value} at ×{best.speedup:.2f}, is {best.why_not}"
        )
    else:
        head = f"**Fastest: {best.value}**, {_best_figures(best)}"
    names, runs = list(table["draft"]), [(t.meta.draft, t) for t in traces]
    return with_busy_note(f"{head}; {sweep_agreement(traces)}.", table, names, runs)


def _best_figures(best: BestSetting) -> str:
    return (
        f"×{best.speedup:.2f} over plain decoding (×{best.speedup_low:.2f}–{best.speedup_high:.2f} "
        f"over {best.repeats} repeats, each against its own plain run), {best.tokens_per_round:.2f} tokens per round"
    )


def _workload_sweep(
    settings: dict, config: RunConfig, ks: list[int], progress: gr.Progress, budget: RunBudget
):
    rows = workload_prompts(settings["workload"], settings["workload_file"])
    repeats = int(settings["repeats"])
    report = progress_reporter(run_labels(len(rows), ks), _say(progress))
    table, _ = workload_sweep(config, rows, ks, report, budget, repeats)
    summary = workload_summary(table, repeats, config.sampling.greedy)
    finished = table_prompts(table)
    if finished < len(rows):
        summary += (
            f" **{budget() or 'Stopped'}**: {finished} of the {len(rows)} prompts finished every k in every "
            "repeat; the table and charts hold those."
        )
    return (
        workload_curve(table),
        workload_tokens_per_round(table),
        shown(table),
        _csv(table),
        summary,
        NO_RACE,
    )


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the page shows it: figures to 3 places, each column headed by its glossary term's
    words (the CSV keeps the columns' own names)."""
    return table.round(3).rename(columns=header)


def _csv(table) -> str:
    path = download_folder() / "speclens-sweep.csv"
    table.to_csv(path, index=False)
    return str(path)


def table_prompts(table: pd.DataFrame) -> int:
    """How many prompts a workload table holds: its "all" rows' count, else its one category's."""
    pooled = table[table["category"] == ALL]
    return int((pooled if not pooled.empty else table)["prompts"].max())


def workload_summary(table: pd.DataFrame, repeats: int, greedy: bool) -> str:
    """What the table holds, counted from it; each category's best k, or that none is clear; and
    whether every output matched plain decoding."""
    parts = []
    for category, best in best_ks(table).items():
        figure = f"×{best.speedup:.2f} at k = {best.value}"
        parts.append(
            f"**{category}**: "
            + (f"best k = {best.value} ({figure})" if best.clear else f"no clear best k (top {figure})")
        )
    if not greedy:
        same = "sampled, so outputs match plain decoding in distribution, not token for token"
    elif table["identical_to_baseline"].all():
        same = "all identical to plain decoding ✓"
    else:
        same = "outputs differ from plain decoding ✗"
    once = " (one repeat: no spread to tell a best k from noise)" if repeats == 1 else ""
    count = f"{words(table_prompts(table), 'prompt')} × {table['k'].nunique()} k × {words(repeats, 'repeat')}"
    said = f"{count}{once}. " + "; ".join(parts) + f"; {same}."
    names = [f"{category}, k = {k}" for category, k in zip(table["category"], table["k"], strict=True)]
    return with_busy_note(said, table, names)


def words(n: int, thing: str) -> str:
    return f"{n} {thing}{'s' * (n != 1)}"


def sweep_summary(table, traces: list[Trace], column: str) -> str:
    """The best setting, where one beats the rest beyond the spread of their repeats; else why not."""
    name = "N" if column == "nodes" else "k"
    best = best_of(table, column)
    if not best.clear:
        head = f"**No clear best {name}**: the highest, ×{best.speedup:.2f} at {name} = {best.value}, is {best.why_not}"
    else:
        head = f"**Best {name} = {best.value}**: {_best_figures(best)}"
    names, runs = [f"{name} = {v}" for v in table[column]], [(_setting(t), t) for t in traces]
    return with_busy_note(f"{head}; {sweep_agreement(traces)}.", table, names, runs)


def sweep_agreement(traces: list[Trace]) -> str:
    """One phrase for the whole sweep: what its outputs show against plain decoding."""
    found = [agreement(t) for t in traces]
    if all(a.good for a in found):
        return "all identical to plain decoding ✓"
    differ = [_setting(t) for t, a in zip(traces, found) if a.good is False]
    if differ:
        return f"outputs differ from plain decoding at {', '.join(differ)} ✗"
    return next(a.sentence for a in found if not a.good)  # sampling or 16-bit: what holds instead


def _setting(trace: Trace) -> str:
    return f"N = {trace.meta.tree_nodes}" if trace.meta.tree_nodes else f"k = {trace.meta.policy.k}"
