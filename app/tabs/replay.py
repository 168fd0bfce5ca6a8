"""Replay: a saved trace, checked, then stepped through round by round."""

from __future__ import annotations

import os
from pathlib import Path

from app.common import (
    example_recorded,
    example_traces,
    round_slider,
    tree_view,
    user_errors,
)
from decoding.errors import SpecLensError
from decoding.trace import Trace, validate
from visualize.cards import recorded_note, stats_html
from visualize.charts import trace_figures
from visualize.timeline import empty_timeline_html, round_sentence_markdown, timeline_html

MAX_TRACE_BYTES = 20_000_000  # a 2,048-token run with every list filled is well under 5 MB


def read_replay(upload: str | None, example: str | None) -> Trace:
    """The uploaded trace, or the named example, checked: one line for anything that is not one.
    An upload, while it is there, is what Load loads: a refused one is refused again, naming the
    file, never swapped for the example behind it."""
    if upload:
        try:
            return read_trace(upload)
        except SpecLensError as exc:
            raise SpecLensError(
                f"{Path(upload).name}: {exc}. The trace on screen stays; remove the file (×) to load an example"
            ) from None
    path = example_traces().get(example or "")
    if not path:
        raise SpecLensError("upload a trace JSON or pick an example")
    return read_trace(path)


def read_trace(path: str) -> Trace:
    """A trace file, checked: one line for anything that is not a trace with rounds to replay."""
    try:
        if os.path.getsize(path) > MAX_TRACE_BYTES:
            raise SpecLensError(f"over {MAX_TRACE_BYTES // 10**6} MB: not a SpecLens trace")
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


def check_upload(upload: str | None) -> None:
    """Refuse a file as it arrives, whatever its name ends with, in the words Load would use; the
    screen stays as it was."""
    if upload:
        check_replay(upload, None)


def load_replay(upload: str | None, example: str | None):
    with user_errors():
        trace = read_replay(upload, example)
        return (
            trace.to_dict(),
            round_slider(len(trace.rounds)),
            *replay_views(trace, 1),
            stats_html(trace, recorded(trace, upload, example)),
            *trace_figures(trace),
        )


def recorded(trace: Trace, upload: str | None, example: str | None) -> str:
    """What the cards say the trace is: a file (the upload's own name) or an example, recorded elsewhere."""
    return (
        recorded_note(trace, f"the file {Path(upload).name}") if upload else example_recorded(trace, example)
    )


def replay_views(trace: Trace, round_no: int) -> tuple:
    """The trace up to the chosen round (the rounds after it there but hidden, so the step-through
    covers the whole trace and moves the slider), its sentence and its tree."""
    i = min(max(round_no, 1), len(trace.rounds)) - 1
    timeline = timeline_html(trace, selected=i, built_up=True)
    return timeline, round_sentence_markdown(trace, i), tree_view(trace.rounds[i], i)


def replay_step(trace_dict: dict | None, round_no: float):
    if not trace_dict:
        return empty_timeline_html("Load a trace first."), "", tree_view(None)
    return replay_views(Trace.from_dict(trace_dict), int(round_no))
