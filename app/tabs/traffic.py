"""Traffic: does speculation still pay when many requests decode together? Plain and speculative
decoding of Spec-Bench prompts in batches on this machine, measured side by side at each batch
size and k, against the cost model's prediction, and the draft length by batch size for vLLM and
SGLang."""

from __future__ import annotations

from dataclasses import replace

import gradio as gr
import pandas as pd

from app.common import (
    ASSETS,
    SETTINGS,
    by_name,
    download_folder,
    gpu,
    make_config,
    session_budget,
    user_errors,
)
from decoding.api import RunConfig, prepare_batch
from decoding.core.budget import RunStopped
from decoding.errors import SpecLensError
from decoding.tools.batch_bench import (
    BatchBenchConfig,
    BatchResults,
    load_measured,
    measure_batches,
    save_measured,
)
from decoding.tools.prompts import read_prompts
from visualize.batch import busy_note, draft_kind, engine_configs, spread_note, why_sentence
from visualize.charts import batch_figure, note_figure
from visualize.glossary import header

PROMPTS = ASSETS / "prompts" / "specbench_dev.jsonl"
BATCH_SIZES = (1, 2, 4, 8, 16)
TRAFFIC_INPUTS = (*SETTINGS, "batch_sizes", "ks", "per_category", "traffic_tokens", "traffic_repeats")
SHOWN = ["batch", "k", "speedup", "speedup_low", "speedup_high", "predicted_speedup", "tokens_per_s_plain",
         "tokens_per_s_speculative", "ms_per_token_p50", "ms_per_token_p95", "tokens_per_round",
         "rows_per_pass", "identical"]  # fmt: skip


def plan(settings: dict) -> tuple[RunConfig, list[int], list[int], int]:
    """The run's settings (chains, fixed k, greedy as the sidebar sets its sampling), the batch
    sizes and k values, and the prompts per category."""
    sizes = sorted(int(b) for b in settings["batch_sizes"] or [])
    ks = sorted(int(k) for k in settings["ks"] or [])
    if not sizes:
        raise SpecLensError("tick at least one batch size")
    if not ks:
        raise SpecLensError("tick at least one k")
    per_category = int(settings["per_category"])
    tokens = int(settings["traffic_tokens"])
    fixed = {"prompt": "-", "tree_nodes": 0, "policy": "fixed", "max_new_tokens": tokens, "temperature": 0}
    return make_config(settings | fixed), sizes, ks, per_category


@gpu
@by_name(TRAFFIC_INPUTS)
def check_traffic(settings: dict) -> None:
    """Refuse what cannot run (no batch size, a batch larger than the prompts, a model that does not
    fit, caches too large for the memory) before anything is measured."""
    with user_errors():
        config, sizes, _, per_category = plan(settings)
        prompts = [p["prompt"] for p in read_prompts(PROMPTS, per_category)]
        prepare_batch(config, prompts, sizes)


@gpu
@by_name(TRAFFIC_INPUTS)
def run_traffic(settings: dict, progress: gr.Progress = gr.Progress(), request: gr.Request = None):
    """Every k at every batch size: the chart, why, the engines' settings, the table and its CSV."""
    with user_errors(), session_budget(request) as budget:
        config, sizes, ks, per_category = plan(settings)
        tables, passes, stopped = [], [], None
        steps = iter(range(1, len(ks) * len(sizes) + 1))
        for k in ks:
            progress(0 if not tables else len(tables) / len(ks), desc=f"k = {k}, batch {sizes[0]}")

            def say(line: str, k: int = k) -> None:  # after each batch size: "batch B: ..."
                done = next(steps, 0)
                progress(done / (len(ks) * len(sizes)), desc=f"k = {k}: {line.split(':')[0]} measured")

            cfg = BatchBenchConfig(
                PROMPTS,
                sizes,
                replace(config, k=k),
                per_category,
                int(settings["traffic_repeats"]),
                None,
                single=False,
            )
            try:
                results = measure_batches(cfg, say=say, should_stop=budget)
            except RunStopped as stop:
                stopped = str(stop)
                break
            tables.append(results.table)
            passes += results.passes
            if len(results.table) < len(sizes):
                stopped = budget() or "stopped"
                break
        if not tables:
            return _nothing(stopped or "stopped")
        measured = BatchResults(pd.concat(tables, ignore_index=True), passes, results.prompts)
        save_measured(config.target, config.draft, measured)
        return _views(measured.table, measured.pass_ms_by_rows(), config.draft, stopped)


def open_measured(target: str) -> tuple:
    """What was measured here for the sidebar's target, where it was: the tab opens on it."""
    found = load_measured((target or "").strip())
    if found is None:
        return (
            None,
            "*Nothing measured yet for this target on this machine: press Measure.*",
            "",
            "",
            None,
            None,
        )
    intro = f"**Kept from {found['date'][:10]}** (draft {found['draft']}): "
    figure, said, *rest = _views(pd.DataFrame(found["rows"]), found["pass_ms_by_rows"], found["draft"], None)
    return figure, intro + said, *rest


def _views(table: pd.DataFrame, pass_ms: dict[int, float], draft: str, stopped: str | None) -> tuple:
    vllm, sglang = engine_configs(table, draft_kind(draft))
    said = " ".join(x for x in (why_sentence(table, pass_ms), spread_note(table)) if x)
    if busy := busy_note(table, pass_ms):
        said = f"**The machine was busy; these timings are not trustworthy** ({busy}). " + said
    if stopped:
        said = f"**{stopped[:1].upper()}{stopped[1:]}**: the sizes and k values measured before it. " + said
    csv = download_folder() / "traffic.csv"
    table.to_csv(csv, index=False)
    shown = table[[c for c in SHOWN if c in table]].round(3).rename(columns=header)  # older files hold fewer
    return batch_figure(table), said, vllm, sglang, shown, str(csv)


def _nothing(reason: str) -> tuple:
    said = f"{reason[:1].upper()}{reason[1:]}. Ask for fewer batch sizes, k values, prompts or tokens."
    return note_figure("Nothing measured", said), f"**Nothing measured**: {said}", "", "", None, None
