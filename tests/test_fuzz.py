"""Hostile uploads, fuzzed: every mutated trace is either refused with a TraceError or rendered
safely (no unescaped markup from its text), never anything else."""

from __future__ import annotations

import copy
import json
import re
from html.parser import HTMLParser

from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoding.errors import TraceError
from decoding.trace import Trace, validate
from visualize.cards import stats_html
from visualize.charts import trace_figures
from visualize.explain import explain_round_markdown
from visualize.timeline import STEPPER, timeline_html

# In today's shape (the files are version 2, which tests/test_trace.py migrates).
BASES = [
    Trace.load(ROOT / "assets" / "traces" / name).to_dict()
    for name in (
        "summarization-ngram-greedy.json",
        "classroom-ngram-sampled.json",
        "math_reasoning-gemma-smollm2-greedy.json",
    )
]
HOSTILE = [
    "<script>alert(1)</script>",
    '" onmouseover="alert(1)',
    "<img src=x onerror=alert(1)>",
    "\u202eevil",
    "a\x00b",
    "**bold** [x](javascript:alert(1))",
    "x" * 100_000,
]
TAGS_WE_WRITE = {"div", "span", "p", "details", "summary"}


def paths(node, prefix=()):
    """Every path into a JSON tree, cut short in long lists to keep the set small."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node[:3]):
            yield from paths(value, (*prefix, i))


PATHS = [(b, p) for b, base in enumerate(BASES) for p in paths(base) if p]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(HOSTILE)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


class TagCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attrs.update(name for name, _ in attrs)
        # The only inline styles are an entropy bar's height and a pass bar's width: numbers the page computes.
        assert all(
            re.fullmatch(r"height:\d+px|width:\d+(\.\d+)?%", value)
            for name, value in attrs
            if name == "style"
        ), attrs


def render_or_refuse(text: str) -> None:
    try:
        trace = Trace.from_json(text)
        validate(trace)
    except TraceError:
        return
    html = timeline_html(trace) + stats_html(trace)
    if trace.rounds:
        html += timeline_html(trace, upto=1, selected=0)
        for i, step in enumerate(trace.rounds[:3]):
            assert "<" not in explain_round_markdown(step, i).replace("&lt;", "")
    trace_figures(trace)
    found = TagCollector()
    # The step-through controls are a fixed string, the same for every trace: only what the trace
    # shapes is under test here.
    found.feed(html.replace(STEPPER, ""))
    assert found.tags <= TAGS_WE_WRITE, found.tags
    assert found.attrs <= {
        "class",
        "data-tip",
        "tabindex",
        "data-round",
        "data-step",
        "data-entropy",
        "data-copy",
        "data-key",
        "data-pos",
        "data-check",  # the step-through's stage texts, escaped (timeline._stage_attrs)
        "data-verdicts",
        "open",
        "style",
    }, found.attrs


# Derandomized: CI runs the same 1,300 examples every time (2,000 were run once) (other seeds were tried while writing it).
@settings(max_examples=800, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), json_values)
def test_a_field_replaced_by_anything(where, value):
    base, path = where
    data = copy.deepcopy(BASES[base])
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    render_or_refuse(json.dumps(data, allow_nan=True))


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.integers(0, 10**9), st.integers(1, 40), st.text(max_size=8))
def test_the_json_text_cut_and_spliced(at, cut, insert):
    text = json.dumps(BASES[0])
    at %= len(text)
    render_or_refuse(text[:at] + insert + text[at + cut :])


def test_hostile_text_in_every_text_field_is_shown_as_text():
    data = copy.deepcopy(BASES[0])
    for step in data["rounds"]:
        for tok in step["draft"]:
            tok["text"] = HOSTILE[len(tok["text"]) % len(HOSTILE)]
    data["meta"]["prompt_token_texts"] = HOSTILE * 3
    data["meta"]["prompt"] = HOSTILE[0]
    render_or_refuse(json.dumps(data))
