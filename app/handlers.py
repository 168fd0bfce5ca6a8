"""Event handlers: UI values in, `decoding` runs, `visualize` renders, UI values out.

Every handler turns a user's mistake into a `gr.Error` with a plain
message; the worker keeps serving.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import queue
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gradio as gr

from decoding import costmodel
from decoding.errors import SpecLensError
from decoding.runner import RunConfig, generate, plain_baseline
from decoding.sweep import sweep
from decoding.trace import Trace
from decoding.verify import Sampling
from visualize.cards import stats_html
from visualize.charts import acceptance_vs_k, speedup_curve, theory_figure, trace_figures
from visualize.explain import explain_step
from visualize.simulate import simulate_trace
from visualize.timeline import empty_timeline_html, timeline_html

log = logging.getLogger("speclens")

ASSETS = Path(__file__).resolve().parents[1] / "assets"
MAX_PROMPT_CHARS = 50_000  # beyond this no model here has the context anyway
TIME_LIMIT_S = float(os.environ.get("SPECLENS_TIME_LIMIT_S", "180"))
DRAFT_SOURCES = {
    "n-gram (prompt lookup)": "ngram",
    "first N layers of the target": "layers",
    "separate draft model": "model",
}

try:  # On ZeroGPU Spaces this asks for a GPU per call; elsewhere it does nothing.
    import spaces

    gpu = spaces.GPU(duration=120)
except ImportError:

    def gpu(fn):
        return fn


class RunTimeout(SpecLensError):
    pass


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Our own errors as they are; anything else as one line, logged in full here."""
    try:
        yield
    except gr.Error:
        raise
    except SpecLensError as exc:
        raise gr.Error(str(exc)) from None
    except MemoryError:
        raise gr.Error("out of memory: pick a smaller model or fewer tokens") from None
    except Exception as exc:
        if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError
            raise gr.Error("the GPU ran out of memory: pick a smaller model or fewer tokens") from None
        log.exception("unexpected error")
        raise gr.Error(f"unexpected error: {type(exc).__name__}: {exc}") from None


def draft_spec(source: str, n_layers: float, draft_model: str) -> str:
    kind = DRAFT_SOURCES.get(source)
    if kind is None:
        raise SpecLensError(f"unknown draft source '{source}'")
    if kind == "layers":
        return f"layers:{int(n_layers)}"
    if kind == "model":
        return (draft_model or "").strip()
    return "ngram"


def make_config(
    prompt,
    target,
    source,
    n_layers,
    draft_model,
    k,
    policy,
    confidence,
    temperature,
    top_k,
    top_p,
    seed,
    max_new,
) -> RunConfig:
    if len(prompt or "") > MAX_PROMPT_CHARS:
        raise SpecLensError(f"the prompt is over {MAX_PROMPT_CHARS:,} characters; shorten it")
    return RunConfig(
        target=(target or "").strip(),
        draft=draft_spec(source, n_layers, draft_model),
        k=int(k),
        policy=policy,
        confidence=float(confidence),
        sampling=Sampling(float(temperature), int(top_k), float(top_p), int(seed)),
        max_new_tokens=int(max_new),
        prompt=prompt or "",
    )


def save_downloads(trace: Trace) -> tuple[str, str]:
    folder = Path(tempfile.mkdtemp(prefix="speclens-"))
    json_path, csv_path = folder / "speclens-trace.json", folder / "speclens-tokens.csv"
    trace.save(json_path)
    trace.to_dataframe().to_csv(csv_path, index=False)
    return str(json_path), str(csv_path)


def trace_views(trace: Trace) -> list:
    """Timeline, text, cards and the four charts of a finished trace."""
    return [
        timeline_html(trace),
        trace.output.text,
        stats_html(trace),
        *trace_figures(trace),
    ]


def _decode_in_thread(config: RunConfig, steps: queue.Queue) -> threading.Event:
    """Run the decoder beside the UI thread; its steps and its end arrive on `steps`.

    Setting the returned event stops the run at its next round (the browser
    went away), so an abandoned run does not keep the CPU busy.
    """
    started = time.perf_counter()
    stop = threading.Event()

    def on_step(step, trace):
        if stop.is_set():
            raise RunTimeout("the run was cancelled")
        if time.perf_counter() - started > TIME_LIMIT_S:
            raise RunTimeout(f"the run went past its {TIME_LIMIT_S:.0f} s limit; ask for fewer tokens")
        steps.put(("step", trace))

    def work():
        try:
            steps.put(("done", generate(config, on_step)))
        except BaseException as exc:  # handed to the UI thread, which reports it
            steps.put(("error", exc))

    threading.Thread(target=work, daemon=True).start()
    return stop


EXPLORE_OUTPUTS = 12  # timeline, text, cards, 4 charts, 2 downloads, trace state, round slider, sentence


@gpu
def run_explore(
    prompt,
    target,
    source,
    n_layers,
    draft_model,
    k,
    policy,
    confidence,
    temperature,
    top_k,
    top_p,
    seed,
    max_new,
    compare,
):
    """Stream the timeline while decoding, then every view of the finished run."""
    rest = [gr.skip()] * (EXPLORE_OUTPUTS - 2)
    with user_errors():
        config = make_config(
            prompt,
            target,
            source,
            n_layers,
            draft_model,
            k,
            policy,
            confidence,
            temperature,
            top_k,
            top_p,
            seed,
            max_new,
        )
        steps: queue.Queue = queue.Queue()
        stop = _decode_in_thread(config, steps)
        last_yield = 0.0
        try:
            while True:
                kind, item = steps.get()
                if kind == "error":
                    raise item
                if kind == "done":
                    trace = item
                    break
                if time.perf_counter() - last_yield > 0.15:  # the browser needs no more than this
                    last_yield = time.perf_counter()
                    yield [timeline_html(item), "…", *rest]
        finally:
            stop.set()
        if compare:
            yield [timeline_html(trace), trace.output.text + "\n\n(decoding plainly to compare…)", *rest]
            trace.attach_baseline(plain_baseline(config))
        yield [
            *trace_views(trace),
            *save_downloads(trace),
            trace.to_dict(),
            gr.update(maximum=max(1, len(trace.steps)), value=1),
            explain_step(trace.steps[0], 0) if trace.steps else "",
        ]


def explain_round(trace_dict: dict | None, round_no: float):
    if not trace_dict:
        return empty_timeline_html(), "Run a prompt first."
    trace = Trace.from_dict(trace_dict)
    if not trace.steps:
        return timeline_html(trace), "This run has no rounds."
    i = min(max(int(round_no), 1), len(trace.steps)) - 1
    return timeline_html(trace, selected=i), explain_step(trace.steps[i], i)


@gpu
def run_sweep(
    prompt,
    target,
    source,
    n_layers,
    draft_model,
    temperature,
    top_k,
    top_p,
    seed,
    max_new,
    k_from,
    k_to,
    progress=gr.Progress(),
):
    """Measured speedup for each k in [k_from, k_to], beside the cost model's predictions."""
    with user_errors():
        lo, hi = sorted((int(k_from), int(k_to)))
        config = make_config(
            prompt,
            target,
            source,
            n_layers,
            draft_model,
            lo,
            "fixed",
            0.4,
            temperature,
            top_k,
            top_p,
            seed,
            max_new,
        )

        def report(done: int, total: int) -> None:
            progress(done / total, desc=f"k = {lo + done} of {lo}…{hi}" if done < total else "done")

        _, table = sweep(config, range(lo, hi + 1), report)
        best = table.loc[table["speedup"].idxmax()]
        identical = (
            "all identical to plain decoding ✓"
            if table["identical_to_baseline"].all()
            else "outputs differ from plain decoding ✗"
        )
        summary = (
            f"**Best k = {int(best['k'])}**: ×{best['speedup']:.2f} over plain decoding "
            f"({best['tokens_per_s']:.1f} vs {best['baseline_tokens_per_s']:.1f} tokens/s), "
            f"acceptance {best['acceptance_rate']:.0%}; {identical}."
        )
        folder = Path(tempfile.mkdtemp(prefix="speclens-sweep-"))
        csv_path = folder / "speclens-sweep.csv"
        table.to_csv(csv_path, index=False)
        return speedup_curve(table), acceptance_vs_k(table), table.round(3), str(csv_path), summary


def run_theory(alpha: float, c: float, verify_growth: float, gamma_max: float):
    gammas = range(1, int(gamma_max) + 1)
    cost = [costmodel.expected_speedup_measured(alpha, g, 1.0, c, 1.0 + verify_growth * g) for g in gammas]
    best = max(gammas, key=lambda g: cost[g - 1])
    text = (
        f"With acceptance **α = {alpha:.2f}**, a draft step costing **c = {c:.2f}** target steps and checking "
        f"γ+1 tokens costing **1 + {verify_growth:.2f}·γ** target steps, the best draft length is "
        f"**γ = {best}**: {costmodel.expected_tokens(alpha, best):.2f} tokens per round, "
        f"×{cost[best - 1]:.2f} faster than plain decoding."
        + (" Below 1 means speculation costs more than it saves." if cost[best - 1] < 1 else "")
    )
    return theory_figure(alpha, c, verify_growth, int(gamma_max)), text


def run_simulation(alpha: float, gamma: float, rounds: float, seed: float, delay_s: float = 0.5):
    trace = simulate_trace(float(alpha), int(gamma), int(rounds), int(seed))
    for i in range(len(trace.steps)):
        yield timeline_html(trace, upto=i + 1, selected=i), explain_step(trace.steps[i], i)
        time.sleep(delay_s)
    t = trace.totals
    yield (
        timeline_html(trace),
        f"{t['steps']} rounds gave {t['new_tokens']} tokens: {t['tokens_per_step']:.2f} per round "
        f"(the formula expects {costmodel.expected_tokens(float(alpha), int(gamma)):.2f}).",
    )


@functools.cache
def example_traces() -> dict[str, str]:
    return {p.stem: str(p) for p in sorted((ASSETS / "traces").glob("*.json"))}


def load_replay(upload: str | None, example: str | None):
    with user_errors():
        path = upload or example_traces().get(example or "")
        if not path:
            raise SpecLensError("upload a trace JSON or pick an example")
        try:
            trace = Trace.load(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecLensError(f"cannot read that file: {exc}") from None
        n = len(trace.steps)
        if n == 0:
            raise SpecLensError("that trace has no rounds to replay")
        return (
            trace.to_dict(),
            gr.update(maximum=n, value=1, interactive=True),
            *replay_views(trace, 1),
            stats_html(trace),
            *trace_figures(trace),
        )


def replay_views(trace: Trace, round_no: int) -> tuple[str, str]:
    i = min(max(round_no, 1), len(trace.steps)) - 1
    return timeline_html(trace, upto=i + 1, selected=i), explain_step(trace.steps[i], i)


def replay_step(trace_dict: dict | None, round_no: float):
    if not trace_dict:
        return empty_timeline_html("Load a trace first."), ""
    return replay_views(Trace.from_dict(trace_dict), int(round_no))
