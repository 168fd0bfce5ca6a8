"""Explore: one prompt decoded round by round as the timeline streams, every view of the finished
run, its plain comparison and race, and any round explained."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator

import gradio as gr

from app.common import (
    EXAMPLE_MACHINE,
    SETTINGS,
    by_name,
    example_recorded,
    example_traces,
    gpu,
    make_config,
    outside_gpu_call,
    round_slider,
    save_downloads,
    session_budget,
    tree_view,
    user_errors,
)
from app.examples import chosen_line
from decoding.api import RunConfig, compare_with_plain, iter_generate, prepare
from decoding.core.budget import RunBudget
from decoding.core.proposal import Draft
from decoding.drafts.suffix import SuffixCorpus, SuffixDraft
from decoding.tools.gpu_figures import recorded
from decoding.trace import Trace
from visualize.cards import stats_html
from visualize.charts import trace_figures
from visualize.gpu import on_gpu_markdown
from visualize.race import race_html
from visualize.timeline import empty_timeline_html, round_sentence_markdown, timeline_html

EXPLORE_INPUTS = ("prompt", *SETTINGS, "compare")
EXPLORE_OUTPUTS = (
    *("timeline", "text", "cards", "charts", "trace_json", "trace_csv"),
    *("trace_state", "round_slider", "sentence", "tree"),
)
CHARTS = 4  # what trace_figures draws
EXAMPLE_RUN = "summarization-ngram-greedy"  # what a first visit sees before running anything
NO_RUN = "Run a prompt first."  # the round's sentence where there is no run


def trace_views(trace: Trace, recorded: str = "") -> list:
    """Timeline, text, cards (flagged `recorded` where replayed from a file) and the four charts of a
    finished trace."""
    return [
        timeline_html(trace),
        trace.output.text,
        stats_html(trace, recorded),
        *trace_figures(trace),
    ]


@by_name(EXPLORE_INPUTS)
def check_explore(settings: dict) -> None:
    """Refuse bad settings before a run starts. This step has no outputs, so the page shows the
    message alone and every view keeps what it showed. It needs no GPU call: the run captures its
    graphs inside its own."""
    with user_errors():
        prepare(outside_gpu_call(make_config(settings)))


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


def explore_views(trace: Trace, recorded: str = "") -> list:
    """Every view of a finished (or stopped) run, in EXPLORE_OUTPUTS' order."""
    first = trace.rounds[0] if trace.rounds else None
    return [
        *trace_views(trace, recorded),
        *save_downloads(trace),
        trace.to_dict(),
        round_slider(len(trace.rounds)),
        round_sentence_markdown(trace, 0) if first else "",
        tree_view(first),
    ]


def default_prompt() -> str:
    """The example run's prompt: where drafting measurably wins on a 2-core CPU, with the
    default pair as with n-gram lookup (docs/app.md), so the first Run shows the idea working."""
    return Trace.load(example_traces()[EXAMPLE_RUN]).meta.prompt


def example_run() -> list:
    """Explore's views filled with a real run replayed from assets/traces/, and the line that says
    so: a first visit sees the idea at work before it runs anything."""
    trace = Trace.load(example_traces()[EXAMPLE_RUN])
    m = trace.meta
    status = (
        f"**Example run**, replayed from `assets/traces/{EXAMPLE_RUN}.json` ({m.target}, {m.draft} draft, "
        f"k = {m.policy.k}, measured on {EXAMPLE_MACHINE}). Press **Run** to decode the prompt above here, "
        "with the pair and settings in the sidebar."
    )
    return [*explore_views(trace, example_recorded(trace, EXAMPLE_RUN)), status]


def chosen_example(prompt: str) -> list:
    """Explore's views emptied once an example is chosen (the run on show was of another prompt), and
    the status line saying what the example is: nothing on screen then speaks of another run."""
    # The timeline and sentence as explain_round leaves them without a run: the slider's reset may call it.
    empty = [empty_timeline_html(), "", ""]
    return [*empty, *[None] * (CHARTS + 3), round_slider(0), NO_RUN, tree_view(None), chosen_line(prompt)]


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


def gpu_view(trace_dict: dict | None) -> str:
    """The run's acceptance priced on each GPU whose figures are recorded in benchmarks/gpu-*/ (a
    prediction, visualize/gpu.py); read at each run, so figures added since count."""
    return on_gpu_markdown(Trace.from_dict(trace_dict) if trace_dict else None, recorded())


def explain_round(trace_dict: dict | None, round_no: float):
    """The timeline with one round selected, its sentence, and its tree."""
    if not trace_dict:
        return empty_timeline_html(), NO_RUN, tree_view(None)
    trace = Trace.from_dict(trace_dict)
    if not trace.rounds:
        return timeline_html(trace), "This run has no rounds.", tree_view(None)
    i = min(max(int(round_no), 1), len(trace.rounds)) - 1
    return timeline_html(trace, selected=i), round_sentence_markdown(trace, i), tree_view(trace.rounds[i], i)
