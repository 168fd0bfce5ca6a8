"""A run or a sweep whose timings no quiet machine gives says the machine was busy, rather than
stating its speedup as a fact; a run faster than plain decoding says why, as a slower one does."""

from __future__ import annotations

import html
import re

import pandas as pd
import pytest
from conftest import ROOT

from app.tabs.sweep import compare_summary, sweep_summary
from decoding.trace import Baseline, DraftToken, Emitted, Output, Round, RunMeta, Trace, Verdict
from visualize.busy import BUSY, busy_note, busy_signs, sweep_busy_note
from visualize.cards import stats_html
from visualize.race import race_html, race_many_html

EXAMPLES = sorted((ROOT / "assets" / "traces").glob("*.json"))
# A real run of SmolLM2-135M with an n-gram draft on 2 cores under a load average of 7-11: its
# five-token checks took 118-301 ms for the same work (their fastest and slowest tenth).
LOADED = ROOT / "tests" / "data" / "trace-busy-cpu.json"


def steady(round_ms: list[float], plain_steps_ms: list[float], prefill_s: float = 0.2) -> Trace:
    """Rounds that each check two tokens and make two (one accepted, the bonus), timed as given,
    beside a plain run of as many tokens whose steps took `plain_steps_ms` after a first token at
    `prefill_s`."""

    def two(ms: float) -> Round:
        return Round(1, [DraftToken(1, " a", 0.9)], [Verdict(0.9, 1.0, None, True)], 1, Emitted(2, " b", "bonus", 0.9), 0.0, ms, ms)  # fmt: skip

    rounds = len(round_ms)
    trace = Trace(meta=RunMeta(prompt="p", device="cpu"), rounds=[two(ms) for ms in round_ms])
    trace.output = Output(" a b" * rounds, [1, 2] * rounds)
    trace.finish(prefill_s + sum(round_ms) / 1e3)
    times = [prefill_s]
    for ms in plain_steps_ms[: 2 * rounds - 1]:
        times.append(times[-1] + ms / 1e3)
    trace.attach_baseline(
        Baseline(" a b" * rounds, [1, 2] * rounds, times[-1], 2 * rounds / times[-1], times)
    )
    return trace


def why(trace: Trace) -> tuple[str, str]:
    """The sentence under the cards, and its kind (its class after sl-why)."""
    found = re.search(r'class="sl-why ?([^"]*)">([^<]*)<', stats_html(trace))
    return (html.unescape(found.group(2)), found.group(1)) if found else ("", "")


def test_the_example_traces_and_steady_runs_are_not_called_busy():
    for path in EXAMPLES:
        assert busy_signs(Trace.load(path)) == [], path.name
    assert busy_signs(steady([40.0] * 32, [30.0] * 63)) == []


def test_a_speedup_above_tokens_per_round_says_the_machine_was_busy():
    """Plain decoding slowed by a neighbour: ×2.85 with 2 tokens a round, as an Explore run showed."""
    trace = steady([30.0] * 32, [75.0] * 63)
    assert trace.totals.speedup > 2.2 and trace.totals.tokens_per_round == 2.0
    signs = busy_signs(trace)
    assert signs and "×2.00 at most" in signs[0]
    sentence, kind = why(trace)
    assert kind == "sl-busy" and sentence.startswith(BUSY) and "Faster than plain" not in sentence
    card = re.search(r'class="sl-card sl-busy"[^>]*><div class="sl-card-value">([^<]*)<', stats_html(trace))
    assert card and card.group(1).endswith("?")  # the card queries its figure rather than state it


def test_a_check_cheaper_than_a_plain_step_or_like_steps_scattered_say_busy():
    cheap = steady([20.0] * 32, [40.0] * 63)  # two tokens checked in half a plain step of one
    assert any("a plain step of one 40.0 ms" in s for s in busy_signs(cheap))
    scattered = steady([40.0, 40.0, 120.0, 40.0] * 8, [30.0] * 63)
    assert any("ranged from 40.0 to 120.0 ms for the same work" in s for s in busy_signs(scattered))


def test_a_run_recorded_under_load_says_the_machine_was_busy():
    trace = Trace.load(LOADED)
    assert trace.meta.device == "cpu" and "for the same work" in busy_note(trace)
    assert why(trace)[1] == "sl-busy"


def race_note(html_text: str) -> str:
    """The race's busy line, unescaped; empty when it has none."""
    found = re.search(r'<div class="sl-why sl-busy">([^<]*)</div>', html_text)
    return html.unescape(found.group(1)) if found else ""


def test_a_race_of_a_run_under_load_says_the_machine_was_busy_as_its_cards_do():
    """The race replays the times as measured: who finished first on a busy machine is no lesson, and
    the race says so in the cards' words; a quiet run's race says nothing of the kind."""
    loaded = Trace.load(LOADED)
    assert race_note(race_html(loaded)) == busy_note(loaded) and busy_note(loaded).startswith(BUSY)
    many = race_note(race_many_html([loaded]))
    assert many.startswith(f"{BUSY} (ngram: its target passes over") and "quieter machine" in many
    for path in EXAMPLES:
        quiet = Trace.load(path)
        assert race_note(race_html(quiet)) == "" and race_note(race_many_html([quiet])) == "", path.name


def test_a_sweep_under_load_says_the_machine_was_busy():
    """A sweep reported ×2.44 at k = 1 with 1.7 tokens per round."""
    note = sweep_busy_note(["k = 1", "k = 2"], [2.44, 1.3], [1.7, 2.1], [2.3, 1.25], [2.5, 1.35])
    assert note.startswith(f"**{BUSY}**") and "k = 1: ×2.44 with 1.70 tokens a round" in note
    assert "k = 2" not in note
    spread = sweep_busy_note(["ngram"], [1.2], [2.0], [0.7], [1.6])
    assert "ngram: its repeats ranged ×0.70–1.60" in spread
    assert sweep_busy_note(["k = 1"], [1.2], [1.7], [1.1], [1.3]) == ""
    run = sweep_busy_note(["k = 4"], [0.68], [1.48], [0.6], [0.7], [("k = 4", Trace.load(LOADED))])
    assert "k = 4: its target passes over" in run


def pace_and_start(sentence: str) -> tuple[float, float, float]:
    found = re.search(r"×([\d.]+) × ([\d.]+) = ×([\d.]+) in all", sentence)
    assert found, sentence
    return tuple(float(x) for x in found.groups())


@pytest.mark.parametrize(
    "trace",
    [
        pytest.param(
            lambda: Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json"), id="example"
        ),
        pytest.param(lambda: steady([40.0] * 32, [30.0] * 63, prefill_s=0.6), id="slow-start"),
        pytest.param(lambda: steady([40.0] * 32, [30.0] * 63, prefill_s=0.05), id="quick-start"),
    ],
)
def test_a_faster_run_says_why_and_its_figures_multiply_out_to_the_card(trace):
    trace = trace()
    sentence, kind = why(trace)
    assert kind == "sl-gain" and sentence.startswith("Faster than plain decoding:"), sentence
    card = float(re.search(r'sl-card-value">×([\d.]+)</div><div class="sl-card-label">speedup vs plain<', stats_html(trace)).group(1))  # fmt: skip
    pace, start, speedup = pace_and_start(sentence)
    assert speedup == card and abs(pace * start - speedup) <= 0.01, sentence
    made, cost, draft, check, rest, said_pace = (
        float(x)
        for x in re.search(
            r"a round made ([\d.]+) tokens and cost ([\d.]+) plain target steps \(drafting ([\d.]+), "
            r"checking ([\d.]+), the rest (-?[\d.]+)\): ×([\d.]+) plain decoding's pace",
            sentence,
        ).groups()
    )
    assert said_pace == pace and made / cost == pytest.approx(pace, rel=0.01)
    assert draft + check + rest == pytest.approx(cost, abs=0.015)
    # The start: what it took (or gave) is the factor, named by each run's share of its time.
    assert ("took some of that back" in sentence) == (start < 1) and "Its first token came after" in sentence


def test_a_prefill_longer_than_plain_decodings_first_token_is_explained():
    """The example's prefill (0.395 s) exceeds plain decoding's prefill and first step (0.338 s)."""
    sentence, _ = why(Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json"))
    assert "its prefill alone took longer than plain decoding's prefill and first step" in sentence
    assert "the same work, so the machine differed" in sentence


def test_a_sweeps_summary_says_the_machine_was_busy_before_its_best():
    """The Sweep tab's summaries, over a table as the sweep makes it: ×2.44 at k = 1 with 1.7 tokens
    a round, as a sweep under load reported, is said to be a busy machine's."""
    table = pd.DataFrame(
        {"k": [1, 2], "tokens_per_round": [1.7, 2.1], "speedup": [2.44, 1.3], "speedup_low": [2.3, 1.25]}
    ).assign(speedup_high=[2.5, 1.35], repeats=3, draft=["ngram", "head"], best=[True, False])
    said = sweep_summary(table, [], "k")
    assert said.startswith(f"**{BUSY}** (k = 1: ×2.44 with 1.70 tokens a round") and "Best k = 1" in said
    assert compare_summary(table, []).startswith(f"**{BUSY}** (ngram: ×2.44")
    quiet = table.assign(speedup=[1.2, 1.3], speedup_low=[1.1, 1.25], speedup_high=[1.3, 1.35])
    assert BUSY not in sweep_summary(quiet, [], "k") and BUSY not in compare_summary(quiet, [])
