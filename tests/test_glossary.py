"""The glossary (visualize/glossary.py): every figure a card or a table shows is defined there."""

from __future__ import annotations

import html
import json
import re

import pytest
from test_visualize import EXAMPLES, hand_made, with_baseline

from decoding.tools.compare import COMPARE_COLUMNS
from decoding.tools.sweep import SWEEP_COLUMNS, TREE_COLUMNS
from decoding.tools.workload import WORKLOAD_COLUMNS
from decoding.trace import Trace
from visualize import glossary
from visualize.cards import stats_html

CARD = re.compile(r'<div class="sl-card [^"]*" data-tip="([^"]*)".*?<div class="sl-card-label">([^<]*)</div>')


def shown_cards() -> list[tuple[str, str]]:
    """(label, popover text) of every card the example traces and each kind of comparison show."""
    traces = [Trace.load(p) for p in EXAMPLES]
    for greedy, dtype, same in [
        (True, "float32", True),
        (False, "float32", False),
        (True, "bfloat16", False),
    ]:
        trace = hand_made()
        ids = list(trace.output.token_ids) if same else [1, 4, 99, 6, 7, 8]
        traces.append(with_baseline(trace, ids, greedy, dtype))
    return [
        (html.unescape(label), html.unescape(tip))
        for t in traces
        for tip, label in CARD.findall(stats_html(t))
    ]


def test_every_card_label_has_a_glossary_entry_in_its_popover():
    cards = shown_cards()
    assert {"acceptance rate", "tokens per round", "speedup vs plain"} <= {label for label, _ in cards}
    for label, tip in cards:
        entry = glossary.term(label.split(" (plain:")[0]) or glossary.term("agreement")
        assert entry.definition in tip, label
    same = [tip for label, tip in cards if label == "identical to plain decoding"]
    assert same and all(tip.startswith("output identical") for tip in same)  # the run's own sentence first


@pytest.mark.parametrize(
    "columns",
    [SWEEP_COLUMNS, TREE_COLUMNS, COMPARE_COLUMNS, WORKLOAD_COLUMNS, ["best"]],
    ids=["sweep", "trees", "sources", "workload", "best"],
)
def test_every_table_column_has_a_glossary_entry(columns):
    assert [c for c in columns if glossary.term(c) is None] == []


def test_alpha_and_the_acceptance_rate_and_both_per_position_senses_are_told_apart():
    alpha, rate = glossary.term("alpha"), glossary.term("acceptance_rate")
    assert alpha is not rate and "accepted / (accepted + refusals)" in alpha.definition
    assert "accepted / proposed" in rate.definition
    ours, vllm = (
        glossary.term("per-position acceptance (SpecLens)"),
        glossary.term("per-position acceptance (vLLM)"),
    )
    assert "judged" in ours.definition and "every round" in vllm.definition


def test_the_page_gets_every_name_once_and_safely():
    script = glossary.glossary_script()
    assert script.count("</script>") == 1
    tips = json.loads(script.removeprefix("<script>window.SL_GLOSSARY = ").removesuffix(";</script>"))
    assert tips["alpha"] == glossary.tip("alpha") and tips["speedup_low"].startswith("lowest speedup")


def test_the_glossary_shows_no_markup_it_cannot_render():
    """The glossary is HTML and its popovers plain text: a Markdown `*emphasis*` would show its stars."""
    shown = glossary.glossary_html() + "".join(glossary.tip(name) for name in glossary.GLOSSARY)
    assert re.findall(r"\*[^*\s][^*]*\*|`[^`]+`", shown) == []


def test_a_table_is_headed_in_the_glossarys_words_and_each_header_opens_its_term():
    """Sweep's tables show no raw column names: each header is its term's heading, which the
    page's popover looks up as it looks up a column's name."""
    for columns in (SWEEP_COLUMNS, TREE_COLUMNS, COMPARE_COLUMNS, WORKLOAD_COLUMNS):
        headers = [glossary.header(c) for c in (*columns, "best")]
        assert not [h for h in headers if "_" in h], headers
        assert len(set(headers)) == len(headers)
        assert [glossary.term(h) for h in headers] == [glossary.term(c) for c in (*columns, "best")]
    assert glossary.header("identical_to_baseline") == "identical to plain decoding"
    assert glossary.header("draft_cost") == "c (draft cost)"
    tips = json.loads(
        glossary.glossary_script().removeprefix("<script>window.SL_GLOSSARY = ").removesuffix(";</script>")
    )
    assert tips["lowest speedup"] == glossary.tip("speedup_low")
