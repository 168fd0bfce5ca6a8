"""`python -m decoding bench`: SpecLens against plain decoding and Hugging Face
assisted generation, interleaved prompt by prompt so machine drift falls on
all methods alike.

Per prompt, in this order:
  A  SpecLens speculative decoding, fully traced
  B  plain autoregressive decoding, same target, same cache and timing
  C  Hugging Face `generate()` with the same drafting (greedy only)
  D  SpecLens again with tracing off, to measure what tracing costs
  E  with --tree-nodes: the chain of the same depth and draft, beside the tree (A)
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import torch

from .. import api, costmodel
from ..api import PreparedRun, RunConfig, library_versions
from ..core.plain import Clock
from ..core.proposal import Draft
from ..drafts import CrossTokenizerDraft, LayerDraft, ModelDraft, NGramDraft
from ..drafts.suffix import SuffixCorpus, SuffixDraft
from ..models.loading import LoadedModel
from ..runtime.static import graphed
from ..settings.environment import cpu_name
from .prompts import read_prompts

CSV_COLUMNS = [
    "category",
    "question_id",
    "prompt_tokens",
    "new_tokens",
    "acceptance_rate",
    "alpha",
    "draft_cost",
    "tokens_per_round",
    "tps_speclens",
    "tps_plain",
    "tps_hf",
    "tps_untraced",
    "speedup_vs_plain",
    "ratio_vs_hf",
    "tracing_overhead",
    "predicted_speedup",
    "identical_plain",
    "identical_hf",
    "tokens_per_round_chain",
    "tps_chain",
    "tree_vs_chain",
    "graphs",
]


@dataclass
class BenchConfig:
    prompts: Path
    run: RunConfig = field(default_factory=RunConfig)  # everything but the prompt
    limit: int = 2  # prompts per category
    out: Path = Path("benchmarks/latest")
    warmup: bool = True
    command: str = ""  # the command line that ran it, for the results


def hf_generate(run: PreparedRun) -> tuple[list[int], float]:
    """Hugging Face assisted generation with the drafting that matches the run's draft, greedy, constant k."""
    target, draft, k, ids = run.target, run.draft, run.config.k, run.prompt_ids
    kwargs: dict = {
        "do_sample": False,
        "max_new_tokens": run.config.max_new_tokens,
        "pad_token_id": target.tokenizer.eos_token_id,
    }
    if isinstance(draft, NGramDraft):
        kwargs |= {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": draft.max_ngram}
    elif isinstance(draft, LayerDraft):
        kwargs |= {"assistant_early_exit": draft.model.config.num_hidden_layers}
    elif isinstance(draft, ModelDraft):
        kwargs |= {"assistant_model": draft.model}
    elif isinstance(draft, CrossTokenizerDraft):  # Universal Assisted Generation
        kwargs |= {
            "assistant_model": draft.model,
            "tokenizer": target.tokenizer,
            "assistant_tokenizer": draft.tok,
        }
    if not isinstance(draft, NGramDraft):
        kwargs |= {
            "num_assistant_tokens": k,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        }
    clock = Clock(target.device)
    start = clock()
    with torch.inference_mode():
        out = target.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    wall = clock() - start
    return out[0, ids.shape[1] :].tolist(), wall


def _tps(n: int, wall: float) -> float:
    return n / wall if wall > 0 else 0.0


HF_DRAFTS = (NGramDraft, LayerDraft, ModelDraft, CrossTokenizerDraft)  # the ones hf_generate can run


@contextlib.contextmanager
def drafting_as_first(run: PreparedRun, before: OrderedDict | None) -> Iterator[None]:
    """A rerun of the prompt whose draft sees what the first run's saw: suffix decoding would
    otherwise draft the first run's own output back. Afterwards the corpus holds the first run."""
    if not isinstance(run.draft, SuffixDraft):
        yield
        return
    after = run.draft.corpus.snapshot()
    run.draft.corpus.restore(before)
    try:
        yield
    finally:
        run.draft.corpus.restore(after)


def run_prompt(run: PreparedRun) -> dict:
    before = run.draft.corpus.snapshot() if isinstance(run.draft, SuffixDraft) else None
    a = api.speculative(run)
    b = api.plain_baseline(run.config)
    # Hugging Face has no head, suffix or hybrid drafting and no trees, and its assisted generation
    # is greedy here.
    hf_can = run.config.sampling.greedy and isinstance(run.draft, HF_DRAFTS) and run.tree is None
    c_ids, c_wall = hf_generate(run) if hf_can else (None, 0.0)
    with drafting_as_first(run, before):
        d = api.untraced(run)
    with drafting_as_first(run, before):
        e = api.speculative(replace(run, tree=None)) if run.tree is not None else None

    n = len(a.output.token_ids)
    tps_a, tps_b, tps_d = a.totals.tokens_per_s, b.tokens_per_s, d.totals.tokens_per_s
    tps_c = _tps(len(c_ids), c_wall) if c_ids is not None else math.nan
    # With a single plain token there is no step to time, and nothing to predict with.
    t_target_ms = costmodel.target_ms_per_token(b.token_times_s) or math.nan
    return {
        "prompt_tokens": run.prompt_ids.shape[1],
        "new_tokens": n,
        "acceptance_rate": a.totals.acceptance_rate,
        "alpha": costmodel.estimate_alpha(a),
        "draft_cost": costmodel.draft_ms_per_token(a) / t_target_ms,
        "tokens_per_round": a.totals.tokens_per_round,
        "tps_speclens": tps_a,
        "tps_plain": tps_b,
        "tps_hf": tps_c,
        "tps_untraced": tps_d,
        "speedup_vs_plain": tps_a / tps_b,
        "ratio_vs_hf": tps_a / tps_c if c_ids else math.nan,
        "tracing_overhead": tps_d / tps_a - 1,
        "predicted_speedup": costmodel.predicted_speedup(a, t_target_ms),
        "identical_plain": a.output.token_ids == b.token_ids,
        "identical_hf": a.output.token_ids == c_ids if c_ids is not None else None,
        "tokens_per_round_chain": e.totals.tokens_per_round if e else math.nan,
        "tps_chain": e.totals.tokens_per_s if e else math.nan,
        "tree_vs_chain": tps_a / e.totals.tokens_per_s if e else math.nan,
        "graphs": graphed(run.target.model),  # steps replayed from CUDA graphs (docs/gpu.md)
        "verify_ms": costmodel.verify_cost_ms([a, e] if e else [a]),
        "by_position": costmodel.acceptance_by_position(a),
        "t_target_ms": t_target_ms,
    }


def run_bench(cfg: BenchConfig, say: Callable[[str], None] = print) -> pd.DataFrame:
    # A model with a short context (Gemma-3's 512-token window here) takes the prompts that fit.
    prompts = read_prompts(cfg.prompts, cfg.limit, lambda p: api.fits(replace(cfg.run, prompt=p)))

    def prepared(prompt: str, draft: Draft | None = None) -> PreparedRun:
        return api.prepare(replace(cfg.run, prompt=prompt), draft)

    first = prepared(prompts[0]["prompt"])  # every prompt then reuses its draft
    if cfg.warmup:  # first calls allocate, and with --compile they compile: keep them out of the figures
        t = time.perf_counter()
        run_prompt(first)
        say(f"warm-up: {time.perf_counter() - t:.1f} s")
    if isinstance(first.draft, SuffixDraft):  # measured from an empty corpus: the warm-up's text is not in it
        first.draft.corpus = SuffixCorpus()
    rows, verify, positions = [], [], []
    for i, p in enumerate(prompts, 1):
        row = run_prompt(prepared(p["prompt"], first.draft))
        verify.append(row.pop("verify_ms"))
        positions += row.pop("by_position")
        rows.append({"category": p["category"], "question_id": p["question_id"], **row})
        say(
            f"[{i}/{len(prompts)}] {p['category']} #{p['question_id']}: ×{row['speedup_vs_plain']:.2f} vs plain, "
            f"{_ratio(row['ratio_vs_hf'])} vs HF, acceptance {row['acceptance_rate']:.0%}, "
            f"identical {row['identical_plain']}/{row['identical_hf']}"
        )
    df = pd.DataFrame(rows)
    write_results(cfg, df, verify, positions, first.target, first.draft.kind)
    return df


def _geomean(x: pd.Series) -> float:
    x = x.dropna()
    return float(math.exp(x.map(math.log).mean())) if len(x) else math.nan


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per category: mean acceptance and tokens per round, geometric means of the ratios."""
    agg = {
        "prompts": ("question_id", "count"),
        "acceptance_rate": ("acceptance_rate", "mean"),
        "alpha": ("alpha", "mean"),
        "draft_cost": ("draft_cost", "mean"),
        "tokens_per_round": ("tokens_per_round", "mean"),
        "tps_speclens": ("tps_speclens", "mean"),
        "tps_plain": ("tps_plain", "mean"),
        "tps_hf": ("tps_hf", "mean"),
        "speedup_vs_plain": ("speedup_vs_plain", _geomean),
        "predicted_speedup": ("predicted_speedup", _geomean),
        "ratio_vs_hf": ("ratio_vs_hf", _geomean),
        "tracing_overhead": ("tracing_overhead", "mean"),
        "identical": ("identical_plain", "all"),
        "tokens_per_round_chain": ("tokens_per_round_chain", "mean"),
        "tree_vs_chain": ("tree_vs_chain", _geomean),
    }
    per = df.groupby("category", sort=True).agg(**agg)
    overall = df.assign(category="all").groupby("category").agg(**agg)
    return pd.concat([per, overall]).reset_index()


def markdown(table: pd.DataFrame) -> str:
    """The summary as a Markdown table; a tree run adds its chain's tokens per round and the ratio."""
    trees = not table["tree_vs_chain"].isna().all()
    head = "| category | prompts | acceptance | α | c | tokens/round | tok/s SpecLens | tok/s plain | tok/s HF | speedup vs plain | predicted | vs HF | tracing overhead | identical |"
    head += " chain tokens/round | tree vs chain |" if trees else ""
    rule = "|" + "---|" * (16 if trees else 14)
    lines = [head, rule]
    for r in table.itertuples():
        hf = "—" if math.isnan(r.tps_hf) else f"{r.tps_hf:.1f}"
        line = (
            f"| {r.category} | {r.prompts} | {r.acceptance_rate:.0%} | {r.alpha:.2f} | {r.draft_cost:.3f} "
            f"| {r.tokens_per_round:.2f} | {r.tps_speclens:.1f} | {r.tps_plain:.1f} | {hf} | ×{r.speedup_vs_plain:.2f} "
            f"| ×{r.predicted_speedup:.2f} | {_ratio(r.ratio_vs_hf)} | {r.tracing_overhead:+.1%} "
            f"| {'✓' if r.identical else '✗'} |"
        )
        if trees:
            line += f" {r.tokens_per_round_chain:.2f} | {_ratio(r.tree_vs_chain)} |"
        lines.append(line)
    return "\n".join(lines)


def _ratio(x: float) -> str:
    return "—" if math.isnan(x) else f"×{x:.2f}"


def position_acceptance(positions: list[tuple[int, int, int]]) -> list[float]:
    """Acceptance at each draft position (reached rounds only), pooled over prompts."""
    reached: dict[int, int] = {}
    accepted: dict[int, int] = {}
    for j, r, a in positions:
        reached[j] = reached.get(j, 0) + r
        accepted[j] = accepted.get(j, 0) + a
    return [round(accepted[j] / reached[j], 4) for j in sorted(reached)]


def pooled_verify_ms(verify: list[dict[int, float]]) -> dict[int, float]:
    """Mean verify time by tokens checked, pooled over prompts."""
    pooled: dict[int, list[float]] = {}
    for v in verify:
        for n, ms in v.items():
            pooled.setdefault(n, []).append(ms)
    return {n: sum(x) / len(x) for n, x in sorted(pooled.items())}


def verify_ratios(verify: list[dict[int, float]]) -> dict[int, float]:
    """V(n)/V(1): how much more checking n tokens costs than one."""
    mean = pooled_verify_ms(verify)
    return {n: ms / mean[1] for n, ms in mean.items()} if 1 in mean else {}


def verify_vs_step(verify: list[dict[int, float]], step_ms: float) -> dict[int, float]:
    """V(n) in plain target steps (steady state)."""
    return {n: round(ms / step_ms, 3) for n, ms in pooled_verify_ms(verify).items()}


def write_results(
    cfg: BenchConfig,
    df: pd.DataFrame,
    verify: list[dict[int, float]],
    positions: list[tuple[int, int, int]],
    target: LoadedModel,
    draft_kind: str,
) -> None:
    cfg.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(cfg.out / "results.csv", index=False, columns=CSV_COLUMNS)
    table = summary_table(df)
    meta = {
        "command": cfg.command,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "device": str(target.device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "compiled": cfg.run.compile,
        "graphs": graphed(target.model),
        "row_kernel": target.row_kernel,
        "packed_output_layer": target.packed,
        "versions": library_versions(),
        "plain_ms_per_token": float(df["tps_plain"].rdiv(1000).mean()),
        "verify_cost_ratio": verify_ratios(verify),
        # A head or a tree rarely checks a single token: the same costs against a plain step.
        "verify_cost_vs_plain_step": verify_vs_step(verify, float(df["t_target_ms"].mean())),
        "acceptance_by_position": position_acceptance(positions),
    }
    (cfg.out / "meta.json").write_text(json.dumps(meta, indent=1))
    settings = (
        f"target `{cfg.run.target}` ({meta['dtype']}{', compiled' if cfg.run.compile else ''}"
        f"{', CUDA graphs' if meta['graphs'] else ''}"
        f"{_linears(target)}), draft `{cfg.run.draft}`, "
        f"k={cfg.run.k} ({cfg.run.policy}){_tree(cfg.run)}, temperature {cfg.run.sampling.temperature}, {cfg.run.max_new_tokens} new tokens, "
        f"{meta['machine']}, {meta['date'][:10]}"
    )
    ratio = ", ".join(f"V({n})/V(1) = {r:.2f}" for n, r in meta["verify_cost_ratio"].items())
    steps = ", ".join(f"V({n}) = {r:.2f}" for n, r in meta["verify_cost_vs_plain_step"].items())
    by_pos = ", ".join(f"{a:.2f}" for a in meta["acceptance_by_position"])
    notes = f"Verify cost: {ratio or '(no round checked a single token)'}; in plain target steps, {steps}. "
    notes += f"Acceptance by draft position: {by_pos}. "
    notes += "α: accepted ÷ judged draft tokens; c: draft time per token ÷ a plain target step."
    if cfg.run.tree_nodes:
        notes += " Hugging Face has no token trees: its column is empty."
    elif not cfg.run.sampling.greedy:
        notes += " Hugging Face's assisted generation is timed greedy only: its column is empty."
    elif df["tps_hf"].isna().all():
        notes += f" Hugging Face has no {draft_kind} drafting: its column is empty."
    text = f"{settings}\n\n`{meta['command']}`\n\n{markdown(table)}\n\n{notes}\n"
    (cfg.out / "summary.md").write_text(text)


def _linears(target: LoadedModel) -> str:
    if target.row_kernel:
        return ", SpecLens's linear kernel"
    return ", packed output layer" if target.packed else ""


def _tree(run: RunConfig) -> str:
    return (
        f", trees of {run.tree_nodes} nodes (branch {run.branch}) beside the chain" if run.tree_nodes else ""
    )


def machine() -> str:
    """What a result was measured on: the GPU where there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return cpu_name()
