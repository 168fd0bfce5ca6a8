"""Event handlers: UI values in, `decoding` runs, `visualize` renders, UI values out.

Every handler turns a user's mistake into a `gr.Error` with a plain
message; the worker keeps serving.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import shutil
import tempfile
import threading
import time
import typing
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import gradio as gr

from decoding import costmodel
from decoding.api import RunConfig, compare_with_plain, iter_generate, prepare
from decoding.core.budget import RunBudget
from decoding.core.proposal import Draft
from decoding.drafts.suffix import SuffixCorpus, SuffixDraft
from decoding.errors import SpecLensError
from decoding.models.loading import layer_count, load_model
from decoding.models.paths import check_allowed
from decoding.settings.sampling import Sampling
from decoding.tools import metrics
from decoding.tools.compare import compare
from decoding.tools.probe import cached, measure, measured_verify_ratio, verify_ratios
from decoding.tools.prompts import read_prompts
from decoding.tools.sweep import BestSetting, best_of, parse_sizes, progress_reporter, sweep, tree_sweep
from decoding.tools.workload import best_ks, run_labels, workload_sweep
from decoding.trace import Round, Trace, agreement, token_frame, validate
from visualize.cards import stats_html
from visualize.charts import (
    acceptance_vs_k,
    best_k_figure,
    compare_figure,
    compare_tokens_figure,
    concurrency_figure,
    per_position_figure,
    speedup_curve,
    theory_figure,
    trace_figures,
    tree_size_curve,
    tree_theory_figure,
    tree_verify_cost,
    workload_curve,
    workload_tokens_per_round,
)
from visualize.explain import explain_round_markdown
from visualize.race import race_html, race_many_html
from visualize.simulate import simulate_trace
from visualize.timeline import empty_timeline_html, timeline_html
from visualize.tree import tree_figure

log = logging.getLogger("speclens")

ASSETS = Path(__file__).resolve().parents[1] / "assets"
MAX_PROMPT_CHARS = 50_000  # beyond this no model here has the context anyway
DOWNLOADS = Path(tempfile.gettempdir()) / "speclens-downloads"
DOWNLOAD_MAX_AGE_S = 3600
MAX_TRACE_BYTES = 20_000_000  # a 2,048-token run with every list filled is well under 5 MB
# Decoding time a request may take, counted from its first round (loading excluded),
# for everything it runs: the speculative run, the comparison, every k of a sweep.
TIME_LIMIT_S = float(os.environ.get("SPECLENS_TIME_LIMIT_S", "180"))
DRAFT_SOURCES = {
    "n-gram (prompt lookup)": "ngram",
    "trained draft head (EAGLE-3)": "head",
    "n-gram where the text repeats, else the head": "ngram+head",
    "suffix decoding (this session's runs)": "suffix",
    "first N layers of the target": "layers",
    "separate draft model": "model",
}

try:  # On ZeroGPU Spaces this asks for a GPU per call; elsewhere it does nothing.
    import spaces

    # The decoding budget plus a minute to load the models: ZeroGPU must not cut a run short.
    gpu = spaces.GPU(duration=int(TIME_LIMIT_S) + 60)
except ImportError:

    def gpu(fn):
        return fn


_budgets: dict[str, RunBudget] = {}  # the running model-bound request of each browser session


@contextlib.contextmanager
def session_budget(request: gr.Request | None) -> Iterator[RunBudget]:
    """A fresh budget for this session's request, findable by `request_stop` while it runs."""
    key = getattr(request, "session_hash", None) or f"anonymous-{threading.get_ident()}"
    budget = RunBudget(TIME_LIMIT_S)
    _budgets[key] = budget
    try:
        yield budget
    finally:
        if _budgets.get(key) is budget:
            del _budgets[key]


def request_stop(request: gr.Request) -> None:
    """Stop button: this session's run ends at its next round and shows what it has."""
    budget = _budgets.get(request.session_hash)
    if budget is not None:
        budget.stop()


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
    except SystemExit as exc:  # a library called exit() mid-run: this request ends, the server stays up
        log.error("the decoder raised SystemExit(%s)", exc.code)
        raise gr.Error(f"the decoder stopped ({type(exc).__name__}); run it again") from None
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
        name = (draft_model or "").strip()
        if not name:
            raise SpecLensError("choose a draft model: a preset, a folder or a hub id of a smaller model")
        check_allowed(name)
        return name
    return kind


def spec_controls(spec: str) -> tuple[str, int | None, str | None]:
    """The draft source, N and draft model that `draft_spec` turns into `spec` (None: not named)."""
    kind, _, n = spec.partition(":")
    sources = {name: label for label, name in DRAFT_SOURCES.items()}
    if kind == "layers":
        return sources["layers"], int(n), None
    if spec in sources and spec not in ("layers", "model"):
        return sources[spec], None, None
    return sources["model"], None, spec


def layer_range(target: str, n_layers: float):
    """Bind the N slider to the target's own layer count (N must leave at least one layer out)."""
    try:
        check_allowed(target)
    except SpecLensError:  # the run will say why; the slider stays as it is
        return gr.update()
    total = layer_count(target)
    if not total or total < 2:
        return gr.update()
    return gr.update(maximum=total - 1, value=min(int(n_layers), total - 1))


def draft_controls(source: str):
    """Show N only for the layer draft and the model box only for a separate draft model."""
    kind = DRAFT_SOURCES.get(source)
    return gr.update(visible=kind == "layers"), gr.update(visible=kind == "model")


def make_config(settings: Mapping[str, Any]) -> RunConfig:
    """A run's settings, from the page's controls named as `SETTINGS` (and the prompt)."""
    prompt = settings.get("prompt") or ""
    if not prompt.strip():
        raise SpecLensError("the prompt is empty: type something for the model to continue")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise SpecLensError(f"the prompt is over {MAX_PROMPT_CHARS:,} characters; shorten it")
    target = (settings["target"] or "").strip()
    check_allowed(target)
    return RunConfig(
        target=target,
        draft=draft_spec(settings["draft_source"], settings["n_layers"], settings["draft_model"]),
        k=int(settings["k"]),
        tree_nodes=int(settings["tree_nodes"]),
        branch=int(settings["branch"]),
        policy=settings["policy"],
        confidence=float(settings["confidence"]),
        sampling=Sampling(
            float(settings["temperature"]),
            int(settings["top_k"]),
            float(settings["top_p"]),
            int(settings["seed"]),
        ),
        max_new_tokens=int(settings["max_new_tokens"]),
        prompt=prompt,
    )


def by_name(names: tuple[str, ...]) -> Callable:
    """Gradio hands a handler its inputs one by one; the decorated function takes them as one
    mapping by name. The wrapper's signature lists the names, so Gradio's API (and gradio_client)
    names each input as the page does."""

    def wrap(fn: Callable) -> Callable:
        extra = list(inspect.signature(fn).parameters.values())[1:]  # request, progress
        positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
        signature = inspect.Signature([inspect.Parameter(n, positional) for n in names] + extra)

        def split(args: tuple, kwargs: dict) -> tuple[dict, dict]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            values = bound.arguments
            return {n: values[n] for n in names}, {p.name: values[p.name] for p in extra}

        if inspect.isgeneratorfunction(fn):

            def handler(*args, **kwargs):
                settings, rest = split(args, kwargs)
                yield from fn(settings, **rest)
        else:

            def handler(*args, **kwargs):
                settings, rest = split(args, kwargs)
                return fn(settings, **rest)

        handler.__name__, handler.__doc__ = fn.__name__, fn.__doc__
        handler.__signature__ = signature
        # Gradio finds the request and progress parameters by their types.
        hints = typing.get_type_hints(fn)
        handler.__annotations__ = {p.name: hints[p.name] for p in extra if p.name in hints}
        return handler

    return wrap


def download_folder() -> Path:
    """A fresh folder for one request's downloads; those older than DOWNLOAD_MAX_AGE_S go first,
    so a server that runs for days does not pile them up (Gradio cleans its own copies)."""
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for old in DOWNLOADS.iterdir():
        with contextlib.suppress(OSError):
            if now - old.stat().st_mtime > DOWNLOAD_MAX_AGE_S:
                shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(dir=DOWNLOADS))


def save_downloads(trace: Trace) -> tuple[str, str]:
    folder = download_folder()
    json_path, csv_path = folder / "speclens-trace.json", folder / "speclens-tokens.csv"
    trace.save(json_path)
    token_frame(trace).to_csv(csv_path, index=False)
    return str(json_path), str(csv_path)


def trace_views(trace: Trace) -> list:
    """Timeline, text, cards and the four charts of a finished trace."""
    return [
        timeline_html(trace),
        trace.output.text,
        stats_html(trace),
        *trace_figures(trace),
    ]


# The sidebar's settings, named as RunConfig and Sampling name them (the draft is three controls:
# its source, N for a layer draft, the model for a separate one). The page builds its controls
# under these names and the handlers read them by these names.
SETTINGS = (
    *("target", "draft_source", "n_layers", "draft_model", "k", "tree_nodes", "branch", "policy"),
    *("confidence", "temperature", "top_k", "top_p", "seed", "max_new_tokens"),
)
EXPLORE_INPUTS = ("prompt", *SETTINGS, "compare")
SWEEP_INPUTS = (
    *("prompt", *SETTINGS, "sweep_over", "k_from", "k_to", "tree_sizes", "repeats"),
    *("workload", "workload_file", "sources"),
)
EXPLORE_OUTPUTS = (
    *("timeline", "text", "cards", "charts", "trace_json", "trace_csv"),
    *("trace_state", "round_slider", "sentence", "tree"),
)
SWEEP_OVER = ("draft length k", "tree size N (depth k)", "k over a workload", "draft sources")
DEV_PROMPTS = ASSETS / "prompts" / "specbench_dev.jsonl"
WORKLOAD_PER_CATEGORY = 2  # of the dev file, as the benchmarks take them
MAX_WORKLOAD_PROMPTS = 24  # of an uploaded file: a sweep runs each of them at every k, repeats times
EVERY_CATEGORY = "Spec-Bench dev: every category"
CHARTS = 4  # what trace_figures draws


@gpu
@by_name(EXPLORE_INPUTS)
def check_explore(settings: dict) -> None:
    """Refuse bad settings before a run starts. This step has no outputs, so the page shows the
    message alone and every view keeps what it showed."""
    with user_errors():
        prepare(make_config(settings))


@gpu
@by_name(EXPLORE_INPUTS)
def run_explore(settings: dict, request: gr.Request = None):
    """Stream the timeline while decoding, then every view of the finished (or stopped) run."""
    rest = [gr.skip()] * (len(EXPLORE_OUTPUTS) - 3 + CHARTS)  # all but the timeline and the text
    with user_errors(), session_budget(request) as budget:
        config = make_config(settings)
        trace = yield from _stream_rounds(config, budget, rest, session_draft(config, request))
        if settings["compare"] and not trace.meta.stopped:
            yield [timeline_html(trace), trace.output.text + "\n\n(decoding plainly to compare…)", *rest]
            compare_with_plain(trace, config, budget)
        if trace.meta.stopped:
            gr.Warning(
                f"{trace.meta.stopped.capitalize()}: showing the {len(trace.rounds)} rounds before that."
            )
        yield explore_views(trace)


def explore_views(trace: Trace) -> list:
    """Every view of a finished (or stopped) run, in EXPLORE_OUTPUTS' order."""
    first = trace.rounds[0] if trace.rounds else None
    return [
        *trace_views(trace),
        *save_downloads(trace),
        trace.to_dict(),
        round_slider(len(trace.rounds)),
        explain_round_markdown(first, 0) if first else "",
        tree_view(first),
    ]


def tree_view(rnd: Round | None, index: int = 0):
    """A tree round's tree; a chain round has none, so the figure is hidden."""
    if rnd is None or not rnd.tree:
        return gr.update(value=None, visible=False)
    return gr.update(value=tree_figure(rnd, index), visible=True)


EXAMPLE_RUN = "summarization-ngram-greedy"  # what a first visit sees before running anything


def default_prompt() -> str:
    """The example run's prompt: where n-gram drafting measurably wins on a 2-core CPU
    (docs/app.md), so the first Run shows the idea working."""
    return Trace.load(example_traces()[EXAMPLE_RUN]).meta.prompt


def example_run() -> list:
    """Explore's views filled with a real run replayed from assets/traces/, and the line that says
    so: a first visit sees the idea at work before it runs anything."""
    trace = Trace.load(example_traces()[EXAMPLE_RUN])
    m = trace.meta
    status = (
        f"**Example run**, replayed from `assets/traces/{EXAMPLE_RUN}.json` ({m.target}, {m.draft} draft, "
        f"k = {m.policy.k}, measured on a 2-core CPU). Press **Run** to decode the prompt above here."
    )
    return [*explore_views(trace), status]


def _stream_rounds(config: RunConfig, budget: RunBudget, rest: list, draft: Draft | None) -> Iterator[list]:
    """The timeline as the rounds come; returns the finished trace.

    Rounds run as the page asks for them: when it goes away Gradio stops asking and the run ends.
    The run waits while Gradio sends an update, so updates are spaced to keep that wait under a
    fifth of the time (and 0.15 s apart at most often: the browser needs no more).
    """
    shown = wait = 0.0
    for trace in iter_generate(config, budget, draft):
        if time.perf_counter() - shown > max(0.15, 4 * wait):
            sent = time.perf_counter()
            yield [timeline_html(trace), "…", *rest]
            shown = time.perf_counter()
            wait = shown - sent
    return trace


SESSION_CORPORA: OrderedDict[str, SuffixCorpus] = OrderedDict()
MAX_SESSIONS = 32  # corpora kept; the least recently used session's goes first
SESSION_CORPUS_TOKENS = 50_000
_corpora_lock = threading.Lock()


def session_draft(config: RunConfig, request: gr.Request | None) -> Draft | None:
    """Suffix decoding over this visitor's own earlier runs only: drafts show their tokens, so one
    visitor's text must never reach another's (the command line's corpus is the process's)."""
    if config.draft != "suffix":
        return None
    key = getattr(request, "session_hash", None) or "anonymous"
    with _corpora_lock:
        corpus = SESSION_CORPORA.pop(key, None) or SuffixCorpus(SESSION_CORPUS_TOKENS)
        SESSION_CORPORA[key] = corpus
        while len(SESSION_CORPORA) > MAX_SESSIONS:
            SESSION_CORPORA.popitem(last=False)
    return SuffixDraft(corpus)


def race_view(trace_dict: dict | None) -> str:
    """The run and its plain comparison, ready to race (visualize/race.py)."""
    return race_html(Trace.from_dict(trace_dict) if trace_dict else None)


def round_slider(rounds: int):
    """A slider over the rounds of a run; Gradio needs two values, so one round leaves it fixed."""
    return gr.update(maximum=max(2, rounds), value=1, interactive=rounds > 1)


def explain_round(trace_dict: dict | None, round_no: float):
    """The timeline with one round selected, its sentence, and its tree."""
    if not trace_dict:
        return empty_timeline_html(), "Run a prompt first.", tree_view(None)
    trace = Trace.from_dict(trace_dict)
    if not trace.rounds:
        return timeline_html(trace), "This run has no rounds.", tree_view(None)
    i = min(max(int(round_no), 1), len(trace.rounds)) - 1
    rnd = trace.rounds[i]
    return timeline_html(trace, selected=i), explain_round_markdown(rnd, i), tree_view(rnd, i)


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
    # Over trees: each size at the sidebar's k, from the chain up; over k: from lo up.
    fixed = {"policy": "fixed", **({"tree_nodes": 0} if mode == "trees" else {"k": lo})}
    values = parse_sizes(settings["tree_sizes"]) if mode == "trees" else list(range(lo, hi + 1))
    if mode == "workload":  # each run names its own prompt; the box's may be empty
        fixed["prompt"] = "-"
    config = make_config(settings | fixed)
    if config.draft == "suffix" and mode != "sources":
        raise SpecLensError(SUFFIX_IN_EXPLORE)
    return config, values, mode


SUFFIX_IN_EXPLORE = (
    "suffix decoding learns from this session's earlier runs, which a sweep would mix up: "
    "try it in Explore (run a prompt twice), or with `python -m decoding compare --drafts suffix,…`"
)


def workload_choices() -> list[str]:
    categories = dict.fromkeys(row["category"] for row in read_prompts(DEV_PROMPTS, WORKLOAD_PER_CATEGORY))
    return [EVERY_CATEGORY, *(f"Spec-Bench dev: {c}" for c in categories)]


def workload_prompts(choice: str, upload: str | None) -> list[dict]:
    """An uploaded JSONL's first prompts, else the dev file's first two of the chosen category (or of each)."""
    if upload:
        rows = read_prompts(Path(upload), need_category=False)
        if len(rows) > MAX_WORKLOAD_PROMPTS:
            raise SpecLensError(
                f"the file holds {len(rows)} prompts; a sweep here takes at most {MAX_WORKLOAD_PROMPTS} "
                "(run `python -m decoding sweep --prompts FILE` for more)"
            )
        return rows
    rows = read_prompts(DEV_PROMPTS, WORKLOAD_PER_CATEGORY)
    wanted = (choice or EVERY_CATEGORY).removeprefix("Spec-Bench dev: ")
    return rows if choice in (None, "", EVERY_CATEGORY) else [r for r in rows if r["category"] == wanted]


@gpu
@by_name(SWEEP_INPUTS)
def run_sweep(settings: dict, progress: gr.Progress = gr.Progress(), request: gr.Request = None):
    """Measured speedup for each k in [k_from, k_to], beside the cost model's predictions;
    sweeping tree sizes, for each N at the sidebar's k; over a workload, per category."""
    with user_errors(), session_budget(request) as budget:
        config, values, mode = sweep_plan(settings)
        if mode == "workload":
            return _workload_sweep(settings, config, values, progress, budget)
        if mode == "sources":
            return _compare_sources(settings, config, progress, budget)
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
            finished = ", ".join(
                str(t.meta.tree_nodes if mode == "trees" else t.meta.policy.k) for t in traces
            )
            summary += f" **{budget() or 'Stopped'}**: only {name} = {finished} finished every repeat."
        return *figures, table.round(3), _csv(table), summary, NO_RACE


NO_RACE = gr.update(value="", visible=False)


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
    return compare_figure(table), compare_tokens_figure(table), table.round(3), _csv(table), summary, race


def compare_summary(table, traces: list[Trace]) -> str:
    """The fastest source, starred only beyond the spread of the repeats, and what the outputs show."""
    best = best_of(table, "draft")
    if not best.clear:
        head = (
            f"**No clear best source**: the fastest, {best.value} at ×{best.speedup:.2f}, is {best.why_not}"
        )
    else:
        head = f"**Fastest: {best.value}**, {_best_figures(best)}"
    return f"{head}; {sweep_agreement(traces)}."


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
    summary = workload_summary(table, len(rows), len(ks), repeats, config.sampling.greedy)
    if budget():
        summary += f" **{budget()}**: the table holds the prompts and k that finished every repeat."
    return (
        workload_curve(table),
        workload_tokens_per_round(table),
        table.round(3),
        _csv(table),
        summary,
        NO_RACE,
    )


def _csv(table) -> str:
    path = download_folder() / "speclens-sweep.csv"
    table.to_csv(path, index=False)
    return str(path)


def workload_summary(table, prompts: int, ks: int, repeats: int, greedy: bool) -> str:
    """Each category's best k, or that none is clear, and whether every output matched plain decoding."""
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
    return f"{prompts} prompts × {ks} k × {repeats} repeats{once}. " + "; ".join(parts) + f"; {same}."


def sweep_summary(table, traces: list[Trace], column: str) -> str:
    """The best setting, where one beats the rest beyond the spread of their repeats; else why not."""
    name = "N" if column == "nodes" else "k"
    best = best_of(table, column)
    if not best.clear:
        head = f"**No clear best {name}**: the highest, ×{best.speedup:.2f} at {name} = {best.value}, is {best.why_not}"
    else:
        head = f"**Best {name} = {best.value}**: {_best_figures(best)}"
    return f"{head}; {sweep_agreement(traces)}."


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


def run_theory(alpha: float, c: float, verify_growth: float, gamma_max: float, measured: dict | None = None):
    """The best γ under the sliders' verify cost, or under this machine's when it was measured."""
    gammas = range(1, int(gamma_max) + 1)

    def verify(g: int) -> float:
        return costmodel.verify_ratio_at(measured, g + 1) if measured else 1.0 + verify_growth * g

    cost = [costmodel.expected_speedup_measured(alpha, g, 1.0, c, verify(g)) for g in gammas]
    best = max(gammas, key=lambda g: cost[g - 1])
    checking = (
        "checking γ+1 tokens costing what the probe measured on this machine"
        if measured
        else f"checking γ+1 tokens costing **1 + {verify_growth:.2f}·γ** target steps"
    )
    text = (
        f"With acceptance **α = {alpha:.2f}**, a draft step costing **c = {c:.2f}** target steps and {checking}, "
        f"the best draft length is **γ = {best}**: {costmodel.expected_tokens(alpha, best):.2f} tokens per "
        f"round, ×{cost[best - 1]:.2f} faster than plain decoding."
        + (" Below 1 means speculation costs more than it saves." if cost[best - 1] < 1 else "")
    )
    return theory_figure(alpha, c, verify_growth, int(gamma_max), measured), text


def run_concurrency(alpha: float, c: float, verify_growth: float, measured: dict | None = None):
    """What serving several requests at once does to speculation, from this machine's V(n) when measured."""

    def ratio(n: int) -> float:
        return costmodel.verify_ratio_at(measured, n) if measured else 1.0 + verify_growth * (n - 1)

    ks = range(1, 7)
    stops = {k: costmodel.break_even_concurrency(alpha, k, c, ratio) for k in ks}
    paying = [f"k = {k} at B = {b}" for k, b in stops.items() if b is not None]
    source = (
        "the step costs measured on this machine"
        if measured
        else f"the slider's verify cost b = {verify_growth:.2f}"
    )
    text = (
        f"**Predicted** from {source} (not measured runs): B requests decoded together check B rows a step; "
        "speculating, B·(k+1). "
        + (
            f"Speculation stops paying at {', '.join(paying)}."
            if paying
            else f"Up to B = {costmodel.CONCURRENCY[-1]} it pays at every k."
        )
        + ("" if measured else f" {NOT_MEASURED}")
    )
    return concurrency_figure(alpha, c, ratio, ks, bool(measured)), text


NOT_MEASURED = (
    "**V(n) is not measured on this machine yet**, so this follows the slider, not this machine "
    "(b = 0 holds on a large GPU; on a CPU checking more tokens costs more). *Measure V(n)* above "
    "times it here once and keeps it: later visits open on it."
)


def cached_verify(target: str):
    """What the probe measured for the sidebar's target on this machine, if it ever did: the
    Theory tab opens on it. Nothing is measured here on opening: a probe takes every core for
    minutes on a 2-core machine, and timed beside a visitor's run it would be wrong."""
    found = cached(target or "")
    if found is None:
        return None, f"Nothing measured yet for **{(target or '').strip()}** on this machine. {NOT_MEASURED}"
    return verify_ratios(found), measured_text(found, f"on {found.get('measured_at', '?')[:10]}")


def check_measure(target: str) -> None:
    with user_errors():
        check_allowed(target)
        load_model((target or "").strip())


@gpu
def measure_verify(target: str):
    """Time the target's pass over 1 to 64 tokens here (decoding/tools/probe.py)."""
    with user_errors():
        check_allowed(target)
        found = measure(load_model((target or "").strip()))
        return verify_ratios(found), measured_text(found, "just now")


def measured_text(found: dict, when: str) -> str:
    table = ", ".join(f"V({n})/V(1) = {r:.2f}" for n, r in verify_ratios(found).items())
    return (
        f"Measured here for **{found['target']}** ({found['dtype']}, {found['device']}) {when}: {table}; "
        f"one token takes {found['1']['step_ms']:.1f} ms. The curve *speedup (V measured here)* and "
        "the concurrency chart use them."
    )


def run_tree_theory(alpha: float, alpha2: float, branch: float, depth: float, c: float, verify_growth: float):
    """The best tree's expected tokens per round against its size, under the rank-acceptance model."""
    ranks = costmodel.rank_acceptance(alpha, alpha2, int(branch))
    depth = int(depth)
    sizes = range(1, 33)
    speedups = [costmodel.expected_speedup_tree(ranks, depth, n, c, verify_growth) for n in sizes]
    best = max(sizes, key=lambda n: speedups[n - 1])
    tokens = costmodel.expected_tokens_tree(ranks, depth, best)
    chain = costmodel.expected_tokens(alpha, depth)
    text = (
        f"A tree {depth} deep whose candidates are the target's token with probability "
        f"{', '.join(f'{a:.2f}' for a in ranks)} (best first) is fastest at **N = {best}** nodes: "
        f"{tokens:.2f} tokens per round against {chain:.2f} for the chain of {depth} "
        f"(×{tokens / chain:.2f}), ×{speedups[best - 1]:.2f} over plain decoding when drafting a level costs "
        f"c and checking N+1 tokens 1 + b·N target steps.{_ranks_scaled(alpha, alpha2, ranks)}"
    )
    return tree_theory_figure(ranks, depth, c, verify_growth), text


def _ranks_scaled(alpha: float, alpha2: float, ranks: list[float]) -> str:
    """Why the second choice's figure is not the slider's, where the cost model scaled it down."""
    if len(ranks) < 2 or abs(ranks[1] - alpha2) < 1e-9:
        return ""
    return (
        f" The slider's α₂ = {alpha2:.2f} and the ranks after it would add up to more than the "
        f"{1 - alpha:.2f} (1 − α) the first choice leaves; the target's token is only one of them, so "
        f"they share that {1 - alpha:.2f} in the same proportions."
    )


def run_simulation(alpha: float, gamma: float, rounds: float, seed: float, delay_s: float = 0.5):
    trace = simulate_trace(float(alpha), int(gamma), int(rounds), int(seed))
    for i in range(len(trace.rounds)):
        yield timeline_html(trace, upto=i + 1, selected=i), explain_round_markdown(trace.rounds[i], i)
        time.sleep(delay_s)
    t = trace.totals
    yield (
        timeline_html(trace),
        f"{t.rounds} rounds gave {t.new_tokens} tokens: {t.tokens_per_round:.2f} per round "
        f"(the formula expects {costmodel.expected_tokens(float(alpha), int(gamma)):.2f}).",
    )


@functools.cache
def example_traces() -> dict[str, str]:
    return {p.stem: str(p) for p in sorted((ASSETS / "traces").glob("*.json"))}


def read_replay(upload: str | None, example: str | None) -> Trace:
    """The uploaded trace, or the named example, checked: one line for anything that is not one."""
    path = upload or example_traces().get(example or "")
    if not path:
        raise SpecLensError("upload a trace JSON or pick an example")
    try:
        if os.path.getsize(path) > MAX_TRACE_BYTES:
            raise SpecLensError(f"that file is over {MAX_TRACE_BYTES // 10**6} MB: not a SpecLens trace")
        trace = Trace.load(path)
    except OSError as exc:
        raise SpecLensError(f"cannot read that file: {exc}") from None
    validate(trace)
    if not trace.rounds:
        raise SpecLensError("that trace has no rounds to replay")
    return trace


def check_replay(upload: str | None, example: str | None) -> None:
    """Refuse a file that is not a trace before any view changes (see `check_explore`)."""
    with user_errors():
        read_replay(upload, example)


def load_replay(upload: str | None, example: str | None):
    with user_errors():
        trace = read_replay(upload, example)
        return (
            trace.to_dict(),
            round_slider(len(trace.rounds)),
            *replay_views(trace, 1),
            stats_html(trace),
            *trace_figures(trace),
        )


def replay_views(trace: Trace, round_no: int) -> tuple:
    i = min(max(round_no, 1), len(trace.rounds)) - 1
    rnd = trace.rounds[i]
    return timeline_html(trace, upto=i + 1, selected=i), explain_round_markdown(rnd, i), tree_view(rnd, i)


def replay_step(trace_dict: dict | None, round_no: float):
    if not trace_dict:
        return empty_timeline_html("Load a trace first."), "", tree_view(None)
    return replay_views(Trace.from_dict(trace_dict), int(round_no))


def read_deployment(url: str | None, first: str | None, second: str | None) -> dict:
    """A deployment's figures from a metrics URL, a saved page, or two pages (the interval between)."""
    sources = [x for x in ((url or "").strip(), first, second) if x]
    if not sources:
        raise SpecLensError("give a metrics URL (http://host:port/metrics) or upload a saved metrics page")
    if len(sources) > 2:
        raise SpecLensError("give a URL or pages, at most two in all (two: the interval between them)")
    snapshots = [metrics.read(s) for s in sources]
    return metrics.interval(*snapshots) if len(snapshots) == 2 else metrics.summary(snapshots[0])


def check_production(url, first, second, *_) -> None:
    """Refuse an unreachable URL or a page without speculative-decoding metrics before any view
    changes (see `check_explore`)."""
    with user_errors():
        read_deployment(url, first, second)


def run_production(url, first, second, draft_cost: float, verify_growth: float, trace_dict: dict | None):
    """A deployment's acceptance beside this session's SpecLens run, and the best k for it (the
    deployment's machine is not this one: its verify cost is the slider's)."""
    with user_errors():
        figures = read_deployment(url, first, second)
        series = {f"{figures['engine']} deployment": figures["per_position"]}
        page = None
        if trace_dict:
            ours = metrics.snapshot_of([Trace.from_dict(trace_dict)])
            series["this SpecLens run"] = metrics.summary(ours)["per_position"]
            page = download_folder() / "speclens-metrics.prom"
            page.write_text(metrics.metrics_page(ours))
        verify = costmodel.linear_verify(float(verify_growth))
        choice = metrics.choose_k(figures, float(draft_cost), verify)
        costing = f"c = {float(draft_cost):.2f} target steps and checking k+1 tokens 1 + b·k, b = {float(verify_growth):.2f}"
        return (
            per_position_figure(series),
            best_k_figure(choice.speedups, choice.best),
            production_text(figures, choice, costing),
            str(page) if page else None,
        )


def production_example(draft_cost: float, verify_growth: float, trace_dict: dict | None):
    """The Production tab without a server: the current Explore run exported as a metrics page in
    vLLM's names (the `speclens:` prefix), read back as a deployment's page would be."""
    with user_errors():
        if not trace_dict:
            raise SpecLensError("run a prompt in Explore first: its run becomes the example page")
        trace = Trace.from_dict(trace_dict)
        page = download_folder() / "speclens-example-metrics.prom"
        page.write_text(metrics.metrics_page(metrics.snapshot_of([trace])))
        figures = read_deployment(None, str(page), None)
        verify, checking = example_verify_cost(trace, float(verify_growth))
        costing = f"c = {float(draft_cost):.2f} target steps and {checking}"
        choice = metrics.choose_k(figures, float(draft_cost), verify)
        label = (
            "**Example page**: the current Explore run exported in vLLM's metric names (prefix `speclens:`), "
            "read back as a deployment's page would be. Point the URL at a real server to read yours."
        )
        return (
            per_position_figure({f"{figures['engine']} deployment": figures["per_position"]}),
            best_k_figure(choice.speedups, choice.best),
            f"{label}\n\n{production_text(figures, choice, costing)}",
            str(page),
        )


def example_verify_cost(trace: Trace, verify_growth: float) -> tuple[Callable[[int], float], str]:
    """The example run's verify cost: what the probe measured for its target on this machine, where
    it did; else the slider's b, said so."""
    m = trace.meta
    measured = measured_verify_ratio(m.target, m.device or None, m.dtype or None)
    if measured is not None:
        ratio, when = measured
        return ratio, (
            f"checking k+1 tokens V(k+1)/V(1), as the probe measured it for {m.target} on this machine ({when})"
        )
    return costmodel.linear_verify(verify_growth), (
        f"checking k+1 tokens 1 + b·k, b = {verify_growth:.2f} from the slider: "
        f"V(n) is not measured for {m.target} on this machine yet (Theory → *Measure V(n)*)"
    )


def production_text(figures: dict, choice: metrics.KChoice, costing: str) -> str:
    def pct(x):
        return "–" if x is None else f"{x:.1%}"

    length = figures["mean_acceptance_length"]
    lines = [
        f"**{figures['engine']}**: mean acceptance length **{'–' if length is None else f'{length:.2f}'}** "
        f"(bonus token included), acceptance rate **{pct(figures['acceptance_rate'])}**"
        + (f", {figures['num_drafts']:,} drafts" if figures["num_drafts"] is not None else "")
        + ".",
    ]
    if "accepted_tokens_per_s" in figures:
        lines.append(
            f"Over the interval: {figures['accepted_tokens_per_s']:.1f} accepted and "
            f"{figures['drafted_tokens_per_s']:.1f} drafted tokens per second."
        )
    if choice.assumed:
        lines.append(
            "This engine reports no per-position acceptance: the profile assumes the same rate at each "
            f"of {choice.measured} positions."
        )
    lines.append(
        f"With a draft token costing {costing}, **num_speculative_tokens = {choice.best}** is best "
        f"among the k = 1–{choice.measured} its acceptance was measured for: "
        f"×{choice.speedups[choice.best - 1]:.2f} expected over plain decoding."
    )
    return "\n\n".join(lines)
