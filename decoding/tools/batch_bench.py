"""`python -m decoding bench --batch 1,2,4,8,16`: plain and speculative decoding of a prompt set at
each batch size, side by side in one run, against the cost model's prediction from this run's
own pass times, acceptance and draft costs.

At each batch size B, per repeat: plain decoding of every prompt, B at a time (continuous
batching), then speculative decoding of the same prompts the same way. Where B = 1 is asked for,
the single-sequence loop (`speculative.py`, what the app runs) is timed beside it too.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from .. import api, costmodel
from ..api import PreparedBatch, RunConfig, library_versions
from ..core.batch import BatchRun
from ..core.budget import RunStopped
from ..core.plain import StopCheck, autoregressive_generate
from ..core.speculative import untraced_generate
from ..drafts.suffix import SuffixCorpus, SuffixDraft
from ..settings.environment import cache_dir
from ..settings.policies import make_policy
from .bench import machine
from .prompts import read_prompts

BATCH_COLUMNS = [
    "batch",
    "k",
    "tokens_per_s_plain",
    "tokens_per_s_speculative",
    "decode_tokens_per_s_plain",
    "decode_tokens_per_s_speculative",
    "full_batch_tokens_per_s_plain",
    "speedup",
    "speedup_low",
    "speedup_high",
    "predicted_speedup",
    "ms_per_token_p50",
    "ms_per_token_p95",
    "ms_per_token_p50_plain",
    "ms_per_token_p95_plain",
    "acceptance_rate",
    "tokens_per_round",
    "rows_per_pass",
    "identical",
    "tokens_per_s_plain_single",
    "tokens_per_s_speculative_single",
]


@dataclass
class BatchBenchConfig:
    prompts: Path
    sizes: list[int]
    run: RunConfig = field(default_factory=RunConfig)
    limit: int = 3  # prompts per category (0: all)
    repeats: int = 1
    out: Path | None = Path("benchmarks/latest-batch")
    command: str = ""
    single: bool = True  # at B = 1, time the single-sequence loops beside the batched step
    trace_dir: Path | None = None  # each batch size's last speculative run, a trace per sequence


@dataclass
class Measured:
    """One batch size's runs: plain and speculative, a pair per repeat; the single loop's at B = 1."""

    size: int
    pairs: list[tuple[BatchRun, BatchRun]]
    single: tuple[float, float] | None = None  # tokens/s, plain and speculative


def run_batch_bench(
    cfg: BatchBenchConfig, say: Callable[[str], None] = print, should_stop: StopCheck | None = None
) -> pd.DataFrame:
    """Measure every batch size; write `batch.csv`, `summary.md` and `meta.json` under `cfg.out`."""
    measured = measure_batches(cfg, say, should_stop)
    if cfg.out is not None:
        write_batch_results(cfg, measured)
    save_measured(cfg.run.target, cfg.run.draft, measured)  # the app's Traffic, Theory and Production show it
    return measured.table


@dataclass
class BatchResults:
    """A batched benchmark's rows (BATCH_COLUMNS) and every pass it timed, (rows, ms) each."""

    table: pd.DataFrame
    passes: list[tuple[int, float]]
    prompts: int

    def pass_ms_by_rows(self) -> dict[int, float]:
        by_rows = pd.DataFrame(self.passes, columns=["rows", "ms"]).groupby("rows")["ms"].median()
        return {int(n): round(float(ms), 3) for n, ms in by_rows.items()}


def measure_batches(
    cfg: BatchBenchConfig, say: Callable[[str], None] = print, should_stop: StopCheck | None = None
) -> BatchResults:
    """Every batch size's runs, and the cost model's prediction from their own pass times. A run
    `should_stop` ends keeps the batch sizes it finished (RunStopped where it finished none)."""
    prompts = [p["prompt"] for p in read_prompts(cfg.prompts, cfg.limit)]
    batch = api.prepare_batch(cfg.run, prompts, cfg.sizes)
    measured = []
    try:
        _warm_up(batch, max(cfg.sizes), should_stop)
        for size in cfg.sizes:
            m = Measured(size, [_pair(batch, size, should_stop) for _ in range(cfg.repeats)])
            if cfg.trace_dir is not None:
                _save_traces(cfg.trace_dir, batch, m)
            if size == 1 and cfg.single:
                m.single = _single(batch)
            measured.append(m)
            say(_progress(m))
    except RunStopped as stop:
        if not measured:
            raise
        say(f"{stop}: the batch sizes measured so far")
    passes = [(p.rows, p.ms) for m in measured for pair in m.pairs for run in pair for p in run.passes]
    verify_ms = costmodel.pass_cost(passes)
    table = pd.DataFrame([_row(m, cfg.run.k, verify_ms) for m in measured], columns=BATCH_COLUMNS)
    return BatchResults(table, passes, len(prompts))


def _warm_up(batch: PreparedBatch, size: int, should_stop: StopCheck | None) -> None:
    """The first calls at each row count pack the kernel's panels and size its buffers: a few tokens
    of every prompt, plain and speculative, at the largest batch, before anything is timed."""
    _fresh_corpus(batch)
    short = replace(batch, config=replace(batch.config, max_new_tokens=4))
    api.decode_batch(short, size, False, should_stop)
    api.decode_batch(short, size, True, should_stop)


def _fresh_corpus(batch: PreparedBatch) -> None:
    # Suffix decoding starts every run from the prompts alone: no earlier run's text, and nothing
    # of these runs left in the process's shared corpus.
    if isinstance(batch.draft, SuffixDraft):
        batch.draft.corpus = SuffixCorpus()


def _pair(batch: PreparedBatch, size: int, should_stop: StopCheck | None) -> tuple[BatchRun, BatchRun]:
    _fresh_corpus(batch)
    plain = api.decode_batch(batch, size, False, should_stop)
    return plain, api.decode_batch(batch, size, True, should_stop)


def _save_traces(folder: Path, batch: PreparedBatch, m: Measured) -> None:
    """The last speculative run at this batch size, one trace a sequence: `b{B}-{i}.json`."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, trace in enumerate(api.batch_run_traces(batch, m.pairs[-1][1])):
        trace.save(folder / f"b{m.size}-{i:03d}.json")


def _single(batch: PreparedBatch) -> tuple[float, float]:
    """Tokens/s of the single-sequence loops over the same prompts: plain, then speculative."""
    c = batch.config
    _fresh_corpus(batch)
    plain_tokens = plain_s = spec_tokens = spec_s = 0.0
    for ids in batch.prompt_ids:
        plain = autoregressive_generate(batch.target.model, ids, c.sampling, c.max_new_tokens, batch.eos)
        plain_tokens, plain_s = plain_tokens + len(plain.token_ids), plain_s + plain.wall_s
        policy = make_policy(c.policy, c.k, c.confidence)
        spec = untraced_generate(
            batch.target.model, ids, batch.draft, policy, c.sampling, c.max_new_tokens, batch.eos
        )
        spec_tokens, spec_s = spec_tokens + spec.totals.new_tokens, spec_s + spec.totals.wall_s
    return plain_tokens / plain_s, spec_tokens / spec_s


def _tps(run: BatchRun) -> float:
    return sum(len(o) for o in run.outputs) / run.wall_s


def _decode_tps(run: BatchRun) -> float:
    """Tokens/s without the prefills: what the passes (and drafting) deliver once prompts are in."""
    return sum(len(o) for o in run.outputs) / (run.wall_s - run.prefill_s)


def full_batch_tps(run: BatchRun) -> float:
    """Plain decoding's tokens/s over its passes with the batch full (every one of `size` sequences
    in it): a step's own throughput at this batch size, as a server with a queue keeps it, without
    the tail of a prompt set that leaves fewer sequences than the batch holds. Pass time only (the
    bookkeeping between passes is a few percent)."""
    full = [p for p in run.passes if p.sequences == run.size]
    ms = sum(p.ms for p in full)
    return sum(p.sequences for p in full) / ms * 1e3 if ms else math.nan


def _ms_per_token(run: BatchRun) -> list[float]:
    """Each sequence's wait per token: from its prefill's start to its last token, by its tokens."""
    return [
        1e3 * (times[-1] - joined) / len(times)
        for times, joined in zip(run.token_times_s, run.joined_s, strict=True)
        if times
    ]


def _percentile(values: list[float], q: float) -> float:
    return float(pd.Series(values).quantile(q))


def _row(m: Measured, k: int, verify_ms: Callable[[float], float]) -> dict:
    speedups = [_tps(spec) / _tps(plain) for plain, spec in m.pairs]
    plain_ms = [x for plain, _ in m.pairs for x in _ms_per_token(plain)]
    spec_ms = [x for _, spec in m.pairs for x in _ms_per_token(spec)]
    rounds = [r for _, spec in m.pairs for rs in spec.rounds for r in rs]
    drafted = sum(len(r.proposal) for r in rounds)
    return {
        "batch": m.size,
        "k": k,
        "tokens_per_s_plain": statistics.median(_tps(plain) for plain, _ in m.pairs),
        "tokens_per_s_speculative": statistics.median(_tps(spec) for _, spec in m.pairs),
        "decode_tokens_per_s_plain": statistics.median(_decode_tps(plain) for plain, _ in m.pairs),
        "decode_tokens_per_s_speculative": statistics.median(_decode_tps(spec) for _, spec in m.pairs),
        "full_batch_tokens_per_s_plain": statistics.median(full_batch_tps(plain) for plain, _ in m.pairs),
        "speedup": statistics.median(speedups),
        "speedup_low": min(speedups),
        "speedup_high": max(speedups),
        "predicted_speedup": statistics.median(
            costmodel.batched_speedup(batch_costs(plain, spec), verify_ms) for plain, spec in m.pairs
        ),
        "ms_per_token_p50": _percentile(spec_ms, 0.5),
        "ms_per_token_p95": _percentile(spec_ms, 0.95),
        "ms_per_token_p50_plain": _percentile(plain_ms, 0.5),
        "ms_per_token_p95_plain": _percentile(plain_ms, 0.95),
        "acceptance_rate": sum(r.verdict.n_accepted for r in rounds) / drafted if drafted else 0.0,
        "tokens_per_round": sum(len(r.new_tokens) for r in rounds) / len(rounds),
        "rows_per_pass": statistics.mean(p.rows for _, spec in m.pairs for p in spec.passes),
        "identical": all(plain.outputs == spec.outputs for plain, spec in m.pairs),
        "tokens_per_s_plain_single": m.single[0] if m.single else None,
        "tokens_per_s_speculative_single": m.single[1] if m.single else None,
    }


def batch_costs(plain: BatchRun, spec: BatchRun) -> costmodel.BatchCosts:
    """The cost model's inputs, measured in this pair of runs: what passes held, what rounds gave
    and cost per sequence, and what was spent outside passes and drafting (verdicts, rollback,
    bookkeeping), per sequence and round or plain step."""
    rounds = [r for rs in spec.rounds for r in rs]
    tokens = sum(len(o) for o in spec.outputs)
    draft_ms = 1e3 * sum(r.draft_s for r in rounds)
    spec_passes = sum(p.ms for p in spec.passes)
    spec_rest = 1e3 * (spec.wall_s - spec.prefill_s) - spec_passes - draft_ms
    plain_rest = 1e3 * (plain.wall_s - plain.prefill_s) - sum(p.ms for p in plain.passes)
    return costmodel.BatchCosts(
        plain_batch=statistics.mean(p.sequences for p in plain.passes),
        batch=statistics.mean(p.sequences for p in spec.passes),
        tokens_per_round=tokens / len(rounds),
        rows_per_round=sum(len(r.proposal) + 1 for r in rounds) / len(rounds),
        draft_ms=draft_ms / len(rounds),
        round_overhead_ms=max(0.0, spec_rest) / len(rounds),
        step_overhead_ms=max(0.0, plain_rest) / sum(len(o) for o in plain.outputs),
        prefill_ms_per_token=1e3 * (plain.prefill_s + spec.prefill_s) / 2 / tokens,
    )


def _progress(m: Measured) -> str:
    plain, spec = m.pairs[-1]
    line = f"batch {m.size}: plain {_tps(plain):.1f} tok/s, speculative {_tps(spec):.1f} tok/s"
    line += f" (×{_tps(spec) / _tps(plain):.2f}), identical {plain.outputs == spec.outputs}"
    if m.single:
        line += f"; single-sequence loops {m.single[0]:.1f} / {m.single[1]:.1f} tok/s"
    return line


def write_batch_results(cfg: BatchBenchConfig, results: BatchResults) -> None:
    df = results.table
    cfg.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(cfg.out / "batch.csv", index=False)
    ranges = costmodel.k_per_batch_size({int(r.batch): {int(r.k): float(r.speedup)} for r in df.itertuples()})
    meta = {
        "command": cfg.command,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "target": cfg.run.target,
        "draft": cfg.run.draft,
        "k": cfg.run.k,
        "prompts": results.prompts,
        "max_new_tokens": cfg.run.max_new_tokens,
        "repeats": cfg.repeats,
        "versions": library_versions(),
        "pass_ms_by_rows": results.pass_ms_by_rows(),
        "k_per_batch_size": ranges,
    }
    (cfg.out / "meta.json").write_text(json.dumps(meta, indent=1))
    (cfg.out / "summary.md").write_text(summary_markdown(df, meta))


def summary_markdown(df: pd.DataFrame, meta: dict) -> str:
    head = (
        f"target `{meta['target']}`, draft `{meta['draft']}`, k={meta['k']}, {meta['prompts']} prompts, "
        f"{meta['max_new_tokens']} new tokens, greedy, {meta['repeats']} repeat(s), {meta['machine']}, "
        f"{meta['date'][:10]}"
    )
    lines = [
        "| batch | plain tok/s (decode) | speculative tok/s (decode) | speedup (range) | predicted | ms/token p50 / p95 "
        "| plain ms/token p50 / p95 | tokens/round | rows/pass | identical |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in df.itertuples():
        lines.append(
            f"| {r.batch} | {r.tokens_per_s_plain:.1f} ({r.decode_tokens_per_s_plain:.1f}) "
            f"| {r.tokens_per_s_speculative:.1f} ({r.decode_tokens_per_s_speculative:.1f}) "
            f"| ×{r.speedup:.2f} ({r.speedup_low:.2f}–{r.speedup_high:.2f}) | ×{r.predicted_speedup:.2f} "
            f"| {r.ms_per_token_p50:.1f} / {r.ms_per_token_p95:.1f} "
            f"| {r.ms_per_token_p50_plain:.1f} / {r.ms_per_token_p95_plain:.1f} | {r.tokens_per_round:.2f} "
            f"| {r.rows_per_pass:.1f} | {'✓' if r.identical else '✗'} |"
        )
    passes = ", ".join(f"V({n}) = {ms:.1f} ms" for n, ms in meta["pass_ms_by_rows"].items())
    notes = [
        "Predicted: the cost model (`costmodel.batched_speedup`) from this run's own pass times, "
        "acceptance, draft and bookkeeping costs, never from the measured speedup.",
        f"Pass times by rows (medians): {passes}.",
        f"k by batch size (vLLM `num_speculative_tokens_per_batch_size`): {json.dumps(meta['k_per_batch_size'])}.",
        _full_batch_note(df),
    ]
    single = df.dropna(subset=["tokens_per_s_plain_single"])
    for r in single.itertuples():
        notes.append(
            f"Batch 1 beside the single-sequence loops: plain {r.tokens_per_s_plain:.1f} against "
            f"{r.tokens_per_s_plain_single:.1f} tok/s, speculative {r.tokens_per_s_speculative:.1f} against "
            f"{r.tokens_per_s_speculative_single:.1f} tok/s."
        )
    return f"{head}\n\n`{meta['command']}`\n\n" + "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n"


def _full_batch_note(df: pd.DataFrame) -> str:
    """Plain decoding's passes with the batch full, by batch size, against batch 1's."""
    one = df.loc[df.batch == 1, "full_batch_tokens_per_s_plain"]
    base = float(one.iloc[0]) if len(one) else math.nan
    figures = ", ".join(
        f"B = {r.batch}: {r.full_batch_tokens_per_s_plain:.1f}"
        + (f" (×{r.full_batch_tokens_per_s_plain / base:.2f})" if r.batch > 1 and base > 0 else "")
        for r in df.itertuples()
    )
    return (
        "Plain decoding's tokens/s over its passes with the batch full (the step's own throughput, "
        f"without the prompt set's tail of fewer sequences; against batch 1): {figures}."
    )


def measured_file(target: str) -> Path:
    """Where the last batched measurement of `target` on this machine is kept (the app's Traffic
    tab writes it; Theory and Production read it)."""
    key = json.dumps([machine(), target.strip()])
    return cache_dir() / "batch" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def save_measured(target: str, draft: str, results: BatchResults) -> None:
    """Keep a batched measurement for `target` here. Rows of the k values measured replace the kept
    ones; the kept rows of other k stay where the draft is the same."""
    rows = results.table.to_dict("records")
    pass_ms = results.pass_ms_by_rows()
    kept = load_measured(target)
    if kept is not None and kept["draft"] == draft:
        ks = {int(r["k"]) for r in rows}
        rows = [r for r in kept["rows"] if int(r["k"]) not in ks] + rows
        pass_ms = kept["pass_ms_by_rows"] | pass_ms
    data = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "target": target,
        "draft": draft,
        "rows": sorted(rows, key=lambda r: (int(r["k"]), int(r["batch"]))),
        "pass_ms_by_rows": {str(n): ms for n, ms in sorted(pass_ms.items())},
    }
    path = measured_file(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def load_measured(target: str) -> dict | None:
    """The last batched measurement of `target` here, or None (none yet, or unreadable)."""
    try:
        data = json.loads(measured_file(target).read_text())
        data["pass_ms_by_rows"] = {int(n): float(ms) for n, ms in data["pass_ms_by_rows"].items()}
        return data
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
