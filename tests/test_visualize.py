"""visualize/: pure functions of a trace, tested without Gradio or a model."""

from __future__ import annotations

import colorsys
import html as html_lib
import json
import re
import subprocess
import sys
from dataclasses import replace

import pandas as pd
import pytest
import torch
from conftest import ROOT, tiny_model_folder

from app.tabs.theory import cached_verify, run_concurrency, run_theory, run_tree_theory
from decoding import costmodel
from decoding.api import RunConfig, plain_baseline
from decoding.core.speculative import speculative_generate
from decoding.drafts import LayerDraft
from decoding.settings.policies import make_policy
from decoding.settings.sampling import Sampling
from decoding.tools import metrics
from decoding.trace import (
    Baseline,
    DraftToken,
    Emitted,
    Output,
    Round,
    RunMeta,
    TopToken,
    Trace,
    TreeNode,
    Verdict,
    token_frame,
    validate,
)
from visualize.cards import stats_html
from visualize.charts import (
    accepted_length_histogram,
    per_position_figure,
    speedup_curve,
    theory_figure,
    trace_figures,
    workload_curve,
    workload_tokens_per_round,
)
from visualize.explain import explain_round, explain_round_markdown
from visualize.race import plain_tokens, race_html, race_many_html, spec_tokens
from visualize.simulate import simulate_trace
from visualize.timeline import (
    KIND_COLOURS,
    KIND_LABELS,
    _entropy_caption,
    check_stage,
    pass_html,
    plain_step,
    round_sentence_markdown,
    timeline_html,
    token_entropies,
    verdicts_stage,
)

EXAMPLES = sorted((ROOT / "assets" / "traces").glob("*.json"))


def hand_made() -> Trace:
    """Three rounds covering every kind: rejected then correction, bonus, and an accepted EOS."""
    steps = [
        Round(
            3,
            [
                DraftToken(1, "<script>alert(1)</script>", 0.9),
                DraftToken(2, " b", 0.8),
                DraftToken(3, " c", 0.7),
            ],
            [Verdict(0.6, 1.0, None, True), Verdict(0.1, 0.0, None, False), Verdict(0.2, 1.0, None, False)],
            1,
            Emitted(4, " d", "correction", 0.7),
            10.0,
            20.0,
            31.0,
        ),
        Round(
            2,
            [DraftToken(5, "\n", 0.9), DraftToken(6, " f", 0.9)],
            [Verdict(0.9, 1.0, None, True), Verdict(0.8, 1.0, None, True)],
            2,
            Emitted(7, " g", "bonus", 0.6),
            9.0,
            21.0,
            30.0,
        ),
        Round(1, [DraftToken(8, "</s>", 0.9)], [Verdict(0.9, 1.0, None, True)], 1, None, 5.0, 15.0, 20.0),
    ]
    trace = Trace(meta=RunMeta(prompt="Hi & <b>bold</b>"), rounds=steps)
    trace.output = Output("x", [1, 4, 5, 6, 7, 8])
    trace.finish(0.1)
    return trace


def test_hand_made_trace_is_consistent():
    validate(hand_made())


def test_timeline_escapes_and_colours_every_kind():
    html = timeline_html(hand_made())
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>" not in html
    for kind in ("prompt", "accepted", "rejected", "discarded", "correction", "bonus"):
        assert f'class="sl-tok sl-{kind}"' in html
    assert html.count("data-round=") == 3
    assert "↵" in html  # a newline token stays visible
    tips = html_lib.unescape(html)  # the popover text, as the page shows it
    assert "draft's probability q = 0.800" in tips
    # Greedy (the trace's sampling): the target's top choice decides, not min(1, p ÷ q).
    assert "kept only if it is the target's own top choice" in tips and "chance to keep" not in tips
    sampled = hand_made()
    sampled.meta.sampling = Sampling(temperature=1.0)
    for v in (v for r in sampled.rounds for v in r.verdicts if v.kind != "discarded"):
        v.u = 0.0 if v.kind == "accepted" else 0.999  # a sampled run's draws, each on its verdict's side
    sampled_tips = html_lib.unescape(timeline_html(sampled))
    assert "chance to keep = min(1, p ÷ q)" in sampled_tips and "top choice" not in sampled_tips


def test_a_round_label_says_what_it_drafted_not_k():
    """k is what the policy asked for; a round's label counts the tokens it drafted."""
    trace = hand_made()
    trace.meta.policy = make_policy("fixed", 4)
    labels = re.findall(r'<span class="sl-label">(#[^<]*)</span>', timeline_html(trace))
    assert [label.split(" · ")[:2] for label in labels] == [
        ["#1", "3 drafted"],
        ["#2", "2 drafted"],
        ["#3", "1 drafted"],
    ]


def test_timeline_upto_and_selected():
    html = timeline_html(hand_made(), upto=2, selected=1)
    assert html.count("data-round=") == 2
    assert 'class="sl-round sl-selected" data-round="1"' in html


def test_explanations_say_what_happened():
    t = hand_made()
    first = explain_round(t.rounds[0], 0)
    assert "kept “<script>alert(1)</script>”" in first and "rejected “ b”" in first
    assert (
        "wrote “ d” instead" in first
        and "the draft token after it was discarded without being judged, since it followed" in first
    )
    assert "added “ g” for free" in explain_round(t.rounds[1], 1)
    assert "ended the text" in explain_round(t.rounds[2], 2)


def test_sampling_explanation_gives_p_q_and_u():
    step = Round(
        1,
        [DraftToken(1, " x", 0.8)],
        [Verdict(0.2, 0.25, 0.6, False)],
        0,
        Emitted(2, " y", "correction", 0.3),
        1,
        1,
        2,
    )
    text = explain_round(step, 4, greedy=False)
    assert text.startswith("Round 5:") and "min(1, 0.20/0.80) = 0.25" in text and "u=0.60" in text


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_traces_render(path):
    trace = Trace.load(path)
    validate(trace)
    figs = trace_figures(trace)
    assert len(figs) == 4 and all(len(f.data) >= 1 for f in figs)
    assert "acceptance rate" in stats_html(trace)
    assert timeline_html(trace).count("data-round=") == len(trace.rounds)


def test_histogram_counts_rounds():
    fig = accepted_length_histogram(hand_made())
    assert sum(fig.data[0].y) == 3


def test_cost_model_formulas():
    assert costmodel.expected_tokens(0.0, 5) == 1.0
    assert costmodel.expected_tokens(1.0, 5) == 6.0
    assert costmodel.expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert costmodel.expected_speedup(0.5, 2, 0.0) == pytest.approx(1.75)
    assert costmodel.expected_speedup(0.5, 2, 0.5) == pytest.approx(1.75 / 2)
    assert costmodel.expected_speedup_measured(0.5, 2, 1.0, 0.0, 1.75) == pytest.approx(1.0)
    fig = theory_figure(0.7, 0.1, 0.2, 8)
    assert len(fig.data) == 3 and len(fig.data[0].x) == 8


def test_the_best_draft_length_and_tree_size_are_the_formulas_best():
    """Theory's picks come from the cost model: the γ (or N) whose predicted speedup is highest."""
    verify = costmodel.linear_verify(0.1)
    best, speedups = costmodel.best_gamma(0.8, 0.05, verify, 12)
    by_formula = [costmodel.expected_speedup_measured(0.8, g, 1.0, 0.05, verify(g + 1)) for g in range(1, 13)]
    assert speedups == pytest.approx(by_formula)
    assert best == 1 + by_formula.index(max(by_formula)) and 1 < best < 12
    assert costmodel.best_gamma(0.0, 0.5, verify, 6)[0] == 1  # nothing accepted: the shortest
    ranks = costmodel.rank_acceptance(0.7, 0.15, 3)
    size, tree = costmodel.best_tree_size(ranks, 4, 0.05, costmodel.linear_verify(0.02), max_nodes=20)
    assert len(tree) == 20 and tree[size - 1] == max(tree)
    by_formula = costmodel.expected_tokens_tree(ranks, 4, size) / (4 * 0.05 + 1 + 0.02 * size)
    assert tree[size - 1] == pytest.approx(by_formula)


def test_a_rounds_spread_is_the_simulations():
    """The Simulate sentence's ±: one round's standard deviation, as simulated rounds scatter."""
    sd = costmodel.tokens_per_round_sd(0.7, 4)
    made = [r.new_tokens for seed in range(200) for r in simulate_trace(0.7, 4, 20, seed).rounds]
    mean = sum(made) / len(made)
    assert mean == pytest.approx(costmodel.expected_tokens(0.7, 4), abs=0.1)
    assert (sum((m - mean) ** 2 for m in made) / len(made)) ** 0.5 == pytest.approx(sd, rel=0.05)
    assert costmodel.tokens_per_round_sd(1.0, 4) == 0 and costmodel.tokens_per_round_sd(0.0, 4) == 0


def test_the_theory_tab_uses_this_machines_measured_verify_cost():
    measured = {1: 1.0, 2: 1.24, 3: 1.31, 5: 1.55, 9: 1.77, 17: 2.26}  # the probe's figures here
    assert costmodel.verify_ratio_at(measured, 4) == pytest.approx(1.43)  # between 3 and 5
    assert costmodel.verify_ratio_at(measured, 21) == pytest.approx(2.26 + 0.49 * 4 / 8)  # the last slope on
    fig, text = run_theory(0.7, 0.1, 0.0, 8, measured)
    assert "speedup (V measured here)" in [d.name for d in fig.data]
    assert "what the probe measured on this machine" in text
    free, _ = run_theory(0.7, 0.1, 0.0, 8)
    assert "speedup (V measured here)" not in [d.name for d in free.data]
    # Measured verify costs make long drafts dear: the best γ is shorter than with free verification.
    best = int(text.split("**γ = ")[1].split("**")[0])
    assert best < int(run_theory(0.7, 0.1, 0.0, 8)[1].split("**γ = ")[1].split("**")[0])
    # The trees below use the same measured cost, not the b slider's 0: a tree checks N+1 rows.
    _, trees = run_tree_theory(0.7, 0.15, 3, 4, 0.1, 0.0, measured)
    _, free_trees = run_tree_theory(0.7, 0.15, 3, 4, 0.1, 0.0)
    assert "what the probe measured on this machine" in trees and "1 + 0.00·N" in free_trees
    size = int(trees.split("**N = ")[1].split("**")[0])
    assert size < int(free_trees.split("**N = ")[1].split("**")[0])
    ranks = costmodel.rank_acceptance(0.7, 0.15, 3)
    expected = costmodel.expected_tokens_tree(ranks, 4, size) / (
        0.4 + costmodel.verify_ratio_at(measured, size + 1)
    )
    assert f"×{expected:.2f} over plain decoding" in trees


def test_the_concurrency_what_if_is_the_cost_model_on_a_hand_made_v():
    """A step that costs the same up to 8 rows (reading the weights) and grows with rows beyond
    (arithmetic): one request gains what the cost model says, eight lose."""

    def ratio(n: int) -> float:
        return max(1.0, n / 8)

    alpha, k, c = 0.8, 3, 0.05
    one = costmodel.concurrent_speedup(alpha, k, c, ratio, 1)
    assert one == pytest.approx(costmodel.expected_speedup_measured(alpha, k, 1.0, c, ratio(k + 1)))
    assert costmodel.concurrent_speedup(alpha, k, c, ratio, 8) == pytest.approx(
        costmodel.expected_tokens(alpha, k) / (k * c + 4.0)  # 32 rows: 4 plain steps
    )
    assert costmodel.concurrent_speedup(alpha, k, c, ratio, 4) == pytest.approx(2.952 / 2.15)  # 16 rows
    assert costmodel.break_even_concurrency(alpha, k, c, ratio) == 8
    fig, text = run_concurrency(alpha, c, 0.0, {1: 1.0, 8: 1.0, 64: 8.0})
    assert [d.name for d in fig.data if d.showlegend is not False] == [
        *(f"k={k}" for k in range(1, 7)),
        "dashed: beyond 64 rows, a guess",
    ] and "measured on this machine" in text
    assert "stops paying at" in text and "**Predicted**" in text


def test_the_concurrency_chart_says_so_when_this_machine_is_not_measured_yet(tmp_path, monkeypatch):
    """With nothing measured here, b = 0 is the slider's, not this machine's: the text says so
    rather than promising that speculation pays at every k."""
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path))
    ratios, text = cached_verify("smollm2-135m")
    assert ratios is None and "not measured on this machine yet" in text
    _, text = run_concurrency(0.7, 0.1, 0.0, ratios)
    assert "not measured on this machine yet" in text and "b = 0.00" in text


def test_simulation_matches_the_formula():
    alpha, gamma = 0.7, 4
    trace = simulate_trace(alpha, gamma, rounds=4000, seed=1)
    validate(trace)
    assert trace.totals.tokens_per_round == pytest.approx(costmodel.expected_tokens(alpha, gamma), rel=0.03)
    assert costmodel.estimate_alpha(trace) == pytest.approx(alpha, abs=0.02)


def run_isolated(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_visualize_needs_no_model_libraries():
    out = run_isolated(
        "import sys, glob\n"
        "from decoding.trace import Trace\n"
        "from visualize import timeline, charts, cards, explain, simulate\n"
        "t = Trace.load(sorted(glob.glob('assets/traces/*.json'))[0])\n"
        "timeline.timeline_html(t); charts.trace_figures(t)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    assert out.strip() == "[]"


def test_decoding_imports_no_ui_code():
    out = run_isolated(
        "import sys\n"
        "import decoding.api, decoding.tools.sweep, decoding.tools.cli, decoding.costmodel\n"
        "print(sorted(m for m in ('gradio', 'plotly') if m in sys.modules))\n"
    )
    assert out.strip() == "[]"


def chips(html: str, kind: str) -> list[str]:
    """The popover text of every chip of one kind, unescaped."""
    return [html_lib.unescape(t) for t in re.findall(rf'class="sl-tok sl-{kind}" data-tip="([^"]*)"', html)]


def test_discarded_tokens_are_greyed_unjudged_and_out_of_the_acceptance_chart():
    trace = hand_made()
    v = trace.rounds[0].verdicts
    assert [x.kind for x in v] == ["accepted", "rejected", "discarded"]
    assert (v[2].p, v[2].accept_prob, v[2].u) == (None, None, None)  # it came in with numbers: dropped
    html = timeline_html(trace)
    (tip,) = chips(html, "discarded")
    assert "never judged" in tip and "chance to keep" not in tip and "target's probability" not in tip
    assert "discarded draft (never judged)" in html  # the legend
    df = token_frame(trace)
    assert df[df["kind"] == "discarded"][["p", "accept_prob", "u", "output_index"]].isna().all().all()
    fig = trace_figures(trace)[0]
    assert "judged tokens only" in fig.layout.xaxis.title.text
    # Position 3 was drafted once, in round 1, but never judged: the chart has no bar for it.
    assert list(fig.data[0].x) == [1, 2] and [list(c) for c in fig.data[0].customdata] == [[3, 3], [1, 2]]


def with_baseline(trace: Trace, ids: list[int], greedy: bool = True, dtype: str = "float32") -> Trace:
    trace.meta = replace(trace.meta, sampling=Sampling(temperature=0.0 if greedy else 0.8), dtype=dtype)
    trace.attach_baseline(Baseline("x", ids, 1.0, 6.0))
    return trace


@pytest.mark.parametrize(
    ("greedy", "dtype", "same", "label", "value"),
    [
        (True, "float32", True, "identical to plain decoding", "✓"),
        (True, "float32", False, "identical to plain decoding", "✗"),
        (False, "float32", False, "same distribution as plain sampling", "≈"),
        (False, "float32", True, "same distribution as plain sampling", "≈"),
        (True, "bfloat16", False, "may differ at near-ties (bfloat16)", "≠ from token 3"),
        (True, "bfloat16", True, "identical to plain decoding", "✓"),
    ],
)
def test_comparison_card_says_what_the_run_promises(greedy, dtype, same, label, value):
    trace = hand_made()
    ids = list(trace.output.token_ids) if same else [1, 4, 99, 6, 7, 8]
    cards = stats_html(with_baseline(trace, ids, greedy, dtype))
    assert f'<div class="sl-card-value">{value}</div><div class="sl-card-label">{label}</div>' in cards
    assert ("sl-bad" in cards) == (greedy and dtype == "float32" and not same)


def test_round_sentences_in_markdown_escape_token_text():
    step = Round(
        2,
        [DraftToken(1, "<img src=x>", 0.9), DraftToken(2, "**bold** [a](b)", 0.8)],
        [Verdict(0.9, 1.0, None, True), Verdict(0.1, 0.0, None, False)],
        1,
        Emitted(3, "$$x$$", "correction", 0.7),
        1,
        1,
        2,
    )
    text = explain_round_markdown(step, 0)
    assert "<img" not in text and "&lt;img src=x&gt;" in text
    assert r"\*\*bold\*\* \[a\]\(b\)" in text and r"\$\$x\$\$" in text


def test_a_round_that_drafted_nothing_is_the_target_alone_and_out_of_the_histogram():
    old = Trace.load(ROOT / "tests" / "data" / "trace-v2-summarization-ngram-greedy.json")
    alone = [r for r in old.rounds if r.drafted == 0]
    assert alone and all(r.emitted.kind == "target" for r in alone)  # read as today's word
    validate(old)
    html = timeline_html(old)
    assert 'class="sl-tok sl-target"' in html and "target alone (nothing drafted)" in html
    histogram = accepted_length_histogram(old)
    assert sum(histogram.data[0].y) == len(old.rounds) - len(alone)
    title = histogram.layout.xaxis.title.text.replace("<br>", " ")  # wrapped to fit a phone
    assert f"{len(alone)} rounds that drafted nothing left out" in title


def test_acceptance_by_position_names_its_counts_and_greys_the_thin_ones():
    trace = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")
    fig = trace_figures(trace)[0]
    judged = [r for _, r in fig.data[0].customdata]
    assert list(fig.data[0].text) == [f"n={n}" for n in judged]
    green, grey = "#2e9d5b", "#b8b8b8"
    assert list(fig.data[0].marker.color) == [green if n >= 5 else grey for n in judged]
    assert list(fig.data[0].marker.pattern.shape) == ["" if n >= 5 else "/" for n in judged]
    thin = hand_made()  # one round: every position judged fewer than 5 times
    bars = trace_figures(thin)[0].data[0].marker
    assert set(bars.color) == {"#b8b8b8"} and set(bars.pattern.shape) == {"/"}  # never a solid full bar


def test_each_per_position_chart_says_which_acceptance_it_shows():
    """Explore's and Replay's chart divides what was kept at a position by the tokens judged there
    (α by position, as the cost model and the benchmarks take it); Production's, by vLLM's
    definition, by every draft. The same run gives other bars in each: each title says which."""
    trace = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")
    rows = costmodel.acceptance_by_position(trace)
    ours = trace_figures(trace)[0]
    assert "of the tokens judged there" in ours.layout.title.text.replace("<br>", " ")
    assert ours.layout.yaxis.title.text.replace("<br>", " ") == "kept / judged there"
    assert list(ours.data[0].y) == pytest.approx([kept / judged for _, judged, kept in rows])
    vllm = per_position_figure({"this run": metrics.summary(metrics.snapshot_of([trace]))["per_position"]})
    title = vllm.layout.title.text.replace("<br>", " ")
    assert "vLLM's" in title and "of all drafts" in title
    assert vllm.layout.yaxis.title.text.replace("<br>", " ") == "kept there / drafts"
    drafts = sum(1 for r in trace.rounds if r.drafted)
    assert list(vllm.data[0].y) == pytest.approx([kept / drafts for _, _, kept in rows])
    # Every draft is judged at its first position: there the two agree, and after it they part.
    assert ours.data[0].y[0] == pytest.approx(vllm.data[0].y[0]) and ours.data[0].y[1] > vllm.data[0].y[1]


def timed(prefill_s: float, round_s: float, rounds: int, plain_first_s: float, plain_step_s: float) -> Trace:
    """Rounds that each make two tokens (one accepted, the bonus), the first ready after the prefill
    and one round, and a plain run of as many tokens, the first ready at `plain_first_s`."""

    def two(ms: float) -> Round:
        return Round(1, [DraftToken(1, " a", 0.9)], [Verdict(0.9, 1.0, None, True)], 1, Emitted(2, " b", "bonus", 0.9), 0.0, ms, ms)  # fmt: skip

    trace = Trace(meta=RunMeta(prompt="p"), rounds=[two(round_s * 1e3) for _ in range(rounds)])
    trace.output = Output(" a b" * rounds, [1, 2] * rounds)
    trace.finish(prefill_s + round_s * rounds)
    times = [plain_first_s + i * plain_step_s for i in range(2 * rounds)]
    trace.attach_baseline(
        Baseline(" a b" * rounds, [1, 2] * rounds, times[-1], 2 * rounds / times[-1], times)
    )
    return trace


SLOWER = {
    # What a first run after start-up looked like: its start slow, its rounds faster than plain steps.
    "slow-start": lambda: timed(0.9, 0.05, 32, 0.40, 0.028),
    "slow-rounds": lambda: timed(0.1, 0.1, 32, 0.1, 0.03),
    **{p.stem: lambda p=p: Trace.load(p) for p in EXAMPLES if "layers20" in p.stem or "gemma" in p.stem},
}


def card(html: str, label: str) -> str:
    return re.search(
        rf'sl-card-value">([^<]*)</div><div class="sl-card-label">{re.escape(label)}<', html
    ).group(1)


def beside_plain(html: str, label: str) -> tuple[str, str]:
    """A card's value and, from its label, plain decoding's."""
    found = re.search(
        rf'sl-card-value">([^<]*)</div><div class="sl-card-label">{label} \(plain: ([^)]*)\)<', html
    )
    return found.group(1), found.group(2)


@pytest.mark.parametrize("name", SLOWER)
def test_the_why_sentence_multiplies_out_to_the_cards_figures(name):
    trace = SLOWER[name]()
    html = stats_html(trace)
    why = html_lib.unescape(re.search(r'class="sl-why">([^<]*)<', html).group(1))
    speedup = float(card(html, "speedup vs plain").lstrip("×"))
    assert speedup < 1
    took = re.search(r"(\d+) tokens took ([\d.]+) s, plain decoding's (\d+) took ([\d.]+) s", why)
    assert took, why
    n, wall, plain_n, plain_wall = (float(x) for x in took.groups())
    implied = (n / wall) / (plain_n / plain_wall)
    assert implied == pytest.approx(trace.totals.speedup, rel=0.01) and abs(implied - speedup) <= 0.015, why
    # The time to the first token and the pace after it, as the cards show them.
    first = re.search(r"first token came after ([\d.]+) s .*plain decoding's after ([\d.]+) s", why)
    assert (f"{first.group(1)} s", f"{first.group(2)} s") == beside_plain(html, "time to first token"), why
    rounds = re.search(r"a round made ([\d.]+) tokens (?:and|while it) cost ([\d.]+) plain target steps", why)
    ours, plain = (float(x) for x in beside_plain(html, "decode tokens / s"))
    pace = float(rounds.group(1)) / float(rounds.group(2))
    assert pace == pytest.approx(ours / plain, rel=0.025) and f"×{pace:.2f} plain decoding's pace" in why, why
    # Where the rounds beat plain steps, the start is what the sentence blames.
    assert ("its start made the difference" in why) == (ours > plain), why


def ending_on_a_round_alone(max_new_tokens: int) -> Trace:
    """The slow-rounds run (64 tokens) with a 65th from a round that drafted nothing."""
    trace = timed(0.1, 0.1, 32, 0.1, 0.03)
    trace.rounds.append(Round(0, [], [], 0, Emitted(3, " c", "target", 0.9), 0.0, 100.0, 100.0))
    trace.meta.max_new_tokens = max_new_tokens
    trace.output = Output(trace.output.text + " c", [*trace.output.token_ids, 3])
    trace.finish(0.1 + 0.1 * 33)
    times = [0.1 + i * 0.03 for i in range(65)]
    trace.attach_baseline(
        Baseline(trace.output.text, trace.output.token_ids, times[-1], 65 / times[-1], times)
    )
    return trace


def test_a_round_the_token_limit_left_to_the_target_is_not_called_an_idle_draft():
    """The loop drafts at most the tokens left but one: with one token left, the target writes it."""
    at_limit, idle = ending_on_a_round_alone(65), ending_on_a_round_alone(128)
    assert at_limit.left_to_the_target(32) and not at_limit.left_to_the_target(31)
    assert not idle.left_to_the_target(32)
    limit_why = html_lib.unescape(stats_html(at_limit))
    assert "nothing to propose" not in limit_why and "in 1 of 33 rounds the draft had nothing to propose" in (
        html_lib.unescape(stats_html(idle))
    )
    limit_sentence = "the token limit left room for one token only, so nothing was drafted"
    assert limit_sentence in html_lib.unescape(timeline_html(at_limit))
    assert limit_sentence not in html_lib.unescape(timeline_html(idle))
    assert "had nothing to propose" in explain_round(idle.rounds[32], 32)


def test_a_first_run_slowed_by_its_start_is_not_blamed_on_its_rounds():
    why = html_lib.unescape(stats_html(SLOWER["slow-start"]()))
    assert "its start made the difference" in why and "first token came after 0.950 s" in why
    assert "after 0.400 s" in why and "the prompt's prefill, 0.900 s" in why
    assert "draft tokens (" not in why


def test_the_why_sentence_says_a_tree_runs_count_is_of_its_main_lines():
    """A tree round's draft and verdicts are its main line; the sentence must not let them pass for every node."""
    chain = html_lib.unescape(stats_html(SLOWER["slow-rounds"]()))
    trees = SLOWER["slow-rounds"]()
    for r in trees.rounds:  # the main line's token, and a sibling the target never tried
        r.tree = [TreeNode(1, " a", 0.9, -1, 1, 0.9, True), TreeNode(3, " c", 0.1, -1, 1, None, False)]
    why = html_lib.unescape(stats_html(trees))
    assert "of the 32 draft tokens on the trees' main lines (" in why, why
    assert "draft tokens (" in chain and "main lines" not in chain


def test_cards_show_time_to_first_token_and_decode_rate_for_both_runs():
    trace = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")
    html = stats_html(trace)
    t, first, base = trace.totals, trace.rounds[0], trace.baseline
    ttft = (t.prefill_ms + first.round_ms) / 1e3
    rate = (t.new_tokens - first.new_tokens) / (t.wall_s - ttft)
    plain_rate = (len(base.token_ids) - 1) / (base.wall_s - base.token_times_s[0])
    assert beside_plain(html, "time to first token") == (f"{ttft:#.3g} s", f"{base.token_times_s[0]:#.3g} s")
    assert beside_plain(html, "decode tokens / s") == (f"{rate:.1f}", f"{plain_rate:.1f}")
    alone = Trace.load(ROOT / "assets" / "traces" / "classroom-ngram-sampled.json")  # no comparison
    assert "time to first token<" in stats_html(alone) and "decode tokens / s<" in stats_html(alone)


def test_the_race_replays_both_runs_token_by_token_at_their_times():
    trace = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")
    html = race_html(trace)
    data = json.loads(html_lib.unescape(re.search(r'data-race="([^"]*)"', html).group(1)))
    spec, plain = data["speculative"], data["plain"]
    assert [x for _, x in spec] == spec_tokens(trace) and len(spec) == len(trace.output.token_ids)
    assert [x for _, x in plain] == plain_tokens(trace) == spec_tokens(trace)  # identical outputs
    for lane in (spec, plain):
        times = [t for t, _ in lane]
        assert times == sorted(times) and times[0] > 0
    assert abs(plain[-1][0] - trace.baseline.token_times_s[-1]) < 1e-3
    assert "not a simulation" in html
    assert "Compare with plain decoding" in race_html(hand_made())  # no comparison: nothing to race


def finish(html: str) -> str:
    return html_lib.unescape(re.search(r'class="sl-race-end" hidden>([^<]*)<', html).group(1))


def test_the_race_ends_saying_who_finished_first_and_by_how_much():
    faster = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")
    spec_end, plain_end = faster.token_times_s()[-1], faster.baseline.token_times_s[-1]
    assert spec_end < plain_end
    assert finish(race_html(faster)) == (
        f"First to finish: speculative, 64 tokens in {spec_end:#.3g} s; plain {plain_end - spec_end:#.3g} s "
        f"later (64 tokens in {plain_end:#.3g} s, ×{plain_end / spec_end:.2f} the time)."
    )
    slower = timed(0.1, 0.1, 32, 0.1, 0.03)  # plain's 64 tokens end at 1.99 s, the run's at 3.3 s
    assert finish(race_html(slower)) == (
        "First to finish: plain, 64 tokens in 1.99 s; speculative 1.31 s later (64 tokens in 3.30 s, ×1.66 the time)."
    )
    slower.meta.draft = "layers:20"
    html = race_many_html([faster, slower])
    assert finish(html) == (  # each source against its own plain run: the table's speedup, from its times
        f"Each against its own plain run: ngram ×{plain_end / spec_end:.2f} ({spec_end:#.3g} s against its "
        f"plain run's {plain_end:#.3g} s); layers:20 ×0.60 (3.30 s against its plain run's 1.99 s)."
    )
    assert f"×{faster.totals.speedup:.2f}" in finish(html) and f"×{slower.totals.speedup:.2f}" in finish(html)


def test_each_source_races_against_its_own_plain_run():
    """Two sources whose plain runs ran at different speeds (a busy machine): each lane of plain
    decoding is that source's own, so the race says what the table's bars say."""
    calm, busy = timed(0.1, 0.05, 32, 0.1, 0.03), timed(0.1, 0.05, 32, 0.2, 0.06)
    calm.meta.draft, busy.meta.draft = "ngram", "ngram+head"
    html = race_many_html([calm, busy])
    data = json.loads(html_lib.unescape(re.search(r'data-race="([^"]*)"', html).group(1)))
    assert list(data) == ["ngram", "plain, before ngram", "ngram+head", "plain, before ngram+head"]
    for trace in (calm, busy):
        plain = data[f"plain, before {trace.meta.draft}"]
        assert [t for t, _ in plain] == [round(t, 4) for t in trace.baseline.token_times_s]
        ratio = plain[-1][0] / data[trace.meta.draft][-1][0]
        assert ratio == pytest.approx(trace.totals.speedup, rel=1e-3)
        assert f"{trace.meta.draft} ×{trace.totals.speedup:.2f} (" in finish(html)


def test_a_plain_run_records_each_tokens_time_and_text(tmp_path):

    folder = tiny_model_folder(tmp_path / "tiny")
    base = plain_baseline(RunConfig(target=str(folder), prompt="a b c", chat=False, max_new_tokens=20))
    assert len(base.token_times_s) == len(base.token_ids) == len(base.token_texts)
    assert base.token_times_s == sorted(base.token_times_s) and base.token_times_s[-1] <= base.wall_s + 1e-6


def test_the_entropy_strip_shows_the_traces_entropies(tiny_target):
    """Each bar's value is the trace's; the first is the entropy of the target's own distribution
    after the prompt; refused positions carry the correction's colour."""

    prompt = torch.tensor([[3, 14, 15, 9, 2, 6]])
    trace = speculative_generate(
        tiny_target, prompt, LayerDraft(tiny_target, 3, 64), make_policy("fixed", 3), max_new_tokens=20
    )
    validate(trace)
    html = timeline_html(trace)
    shown = [float(x) for x in re.findall(r'data-entropy="([^"]+)"', html)]
    expected = [h for _, _, h in token_entropies(trace)]
    assert shown == expected and len(shown) == len(trace.output.token_ids)
    probs = tiny_target(prompt).logits[0, -1].double().softmax(-1)
    assert shown[0] == pytest.approx(float(-(probs * probs.log()).sum()), abs=1e-3)
    kinds = re.findall(r'class="sl-ent sl-ent-(\w+)"', html)
    assert kinds.count("correction") == sum(
        r.emitted is not None and r.emitted.kind == "correction" for r in trace.rounds
    )
    named = "Mean at a target's correction (amber), where a draft was refused"
    assert (html_lib.escape(named) in html) == ("correction" in kinds and "accepted" in kinds)


def test_a_workload_of_one_category_draws_its_line_without_a_copy_named_all():
    def table(categories: list[str]) -> pd.DataFrame:
        rows = [
            {"category": c, "k": k, "speedup": 1 + k / 10, "speedup_low": 1, "speedup_high": 2,
             "tokens_per_round": 1 + k / 5, "best": False}
            for c in categories
            for k in (1, 2)
        ]  # fmt: skip
        return pd.DataFrame(rows)

    for figure in (workload_curve, workload_tokens_per_round):
        assert [t.name for t in figure(table(["qa", "all"])).data] == ["qa"]
        assert [t.name for t in figure(table(["qa", "rag", "all"])).data] == ["qa", "rag", "all"]


def test_the_chat_template_unfolds_to_numbered_tokens_and_a_draft_copied_from_it_points_there():
    trace = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")
    fold = re.compile(r'<details class="sl-template"( open)?><summary>([^<]*)</summary>(.*?)</details>', re.S)
    before, after = fold.findall(timeline_html(trace))
    n = len(re.findall(r"data-pos=", before[2]))
    assert before[:2] == ("", f"chat template · tokens 1–{n}")  # folded, and says which positions
    assert re.findall(r'data-pos="(\d+)"', before[2]) == [str(i) for i in range(1, n + 1)]
    assert after[1].endswith(f"–{trace.meta.prompt_tokens}")  # the template after the typed text
    i, rnd = next((i, r) for i, r in enumerate(trace.rounds) if r.match and r.match.start < n)
    copy = f"{rnd.match.start + 1}-{rnd.match.start + rnd.drafted}"
    chip = re.search(
        rf'data-round="{i}".*?<span class="sl-tok sl-\w+" data-tip="([^"]*)"[^>]*data-copy="{copy}"',
        timeline_html(trace),
        re.S,
    )
    assert chip and "copied from prompt tokens" in chip.group(1) and "chat template" in chip.group(1)
    opened, _ = fold.findall(timeline_html(trace, selected=i))  # the round chosen: its source shown
    assert opened[0] == " open"
    marked = re.findall(r'<span class="sl-match-copy" data-pos="(\d+)"', opened[2])
    assert marked == [str(p) for p in range(rnd.match.start + 1, rnd.match.start + rnd.drafted + 1)]


def test_a_round_of_one_token_is_told_in_the_singular():
    kept = Round(
        1,
        [DraftToken(1, " a", 0.9)],
        [Verdict(0.9, 1.0, None, True)],
        1,
        Emitted(2, " b", "bonus", 0.8),
        1,
        1,
        2,
    )
    refused = replace(kept, verdicts=[Verdict(0.1, 0.0, None, False)], n_accepted=0)
    refused.emitted = Emitted(3, " c", "correction", 0.7)
    two = Round(
        3,
        [DraftToken(1, " a", 0.9), DraftToken(2, " b", 0.8), DraftToken(3, " c", 0.7)],
        [Verdict(0.1, 0.0, None, False)] + [Verdict(None, None, None, False, "discarded")] * 2,
        0,
        Emitted(4, " d", "correction", 0.7),
        1,
        1,
        2,
    )
    assert "the target kept it and added “ b” for free" in explain_round(kept, 0)
    assert "the target rejected “ a”, because" in explain_round(refused, 0)
    sentence = explain_round(two, 0)
    assert "the 2 draft tokens after it were discarded without being judged, since they followed" in sentence
    assert "the target kept none of them, rejected" in sentence
    for text in map(explain_round, (kept, refused), (0, 0)):
        assert "all of them" not in text and "none of them" not in text, text


def test_the_tree_text_says_why_its_second_choice_is_not_the_sliders():
    _, text = run_tree_theory(0.9, 0.15, 3, 4, 0.1, 0.0)
    assert "0.90, 0.09, 0.01" in text  # what the cost model used: the first choice leaves 0.10
    assert "α₂ = 0.15" in text and "0.10 (1 − α)" in text
    _, text = run_tree_theory(0.7, 0.15, 3, 4, 0.1, 0.0)
    assert "0.70, 0.15, 0.03" in text and "1 − α" not in text  # room enough: the slider's own value


def test_the_race_writes_the_text_without_its_end_of_text_token():
    trace = hand_made()  # its last round's token, "</s>", ended the text
    trace.output = Output("<script>alert(1)</script> d\n f g", trace.output.token_ids)
    texts = ["<script>alert(1)</script>", " d", "\n", " f", " g", "</s>"]
    trace.attach_baseline(Baseline(trace.output.text, trace.output.token_ids, 1.0, 6.0, [0.1] * 6, texts))
    data = json.loads(html_lib.unescape(re.search(r'data-race="([^"]*)"', race_html(trace)).group(1)))
    for lane in data.values():
        assert "".join(x for _, x in lane) == trace.output.text and len(lane) == 6  # its time still counts
    example = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")  # cut at 64 tokens
    assert spec_tokens(example)[-1] == "tle" and plain_tokens(example)[-1] == "tle"


def test_a_stopped_run_says_why_it_has_no_race():
    trace = hand_made()
    trace.meta = replace(trace.meta, stopped="stopped by the user")  # Stop, with Compare ticked
    html = race_html(trace)
    assert "Stopped by the user: no plain run to race against." in html and "Compare" not in html


def hue(hex_colour: str) -> tuple[float, float]:
    """(hue in degrees, saturation) of a #rrggbb colour."""
    h, _, s = colorsys.rgb_to_hls(*(int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)))
    return h * 360, s


HUES = {"red": (345, 15), "amber": (25, 45), "green": (90, 160), "blue": (200, 240), "purple": (250, 290)}


def test_each_kind_has_one_colour_that_its_chips_bars_and_captions_share():
    """A kind's chip border, its legend chip and its entropy bar are one CSS colour, and the word a
    caption uses for it names that colour."""
    css = (ROOT / "assets" / "speclens.css").read_text()
    for kind, name in KIND_COLOURS.items():
        value = re.search(rf"--sl-{kind}: (#[0-9a-f]{{6}})", css).group(1)
        h, saturation = hue(value)
        if name == "grey":
            assert saturation < 0.1, kind
        else:
            low, high = HUES[name]
            assert (low <= h <= high) if low < high else (h >= low or h <= high), (kind, value, name)
        rules = re.findall(rf"\.sl-tok\.sl-{kind} {{([^}}]*)}}", css)
        borders = [r.split("border-color:")[1].split(";")[0].strip() for r in rules if "border-color:" in r]
        assert borders and set(borders) == {f"var(--sl-{kind})"}, (kind, borders)  # light and dark alike
    for kind in ("accepted", "correction", "bonus", "target"):
        assert re.search(rf"\.sl-ent-{kind} {{ background: var\(--sl-{kind}\); }}", css), kind
    caption = _entropy_caption([("correction", "a", 1.0), ("accepted", "b", 0.5), ("bonus", "c", 0.2)])
    assert f"{KIND_LABELS['correction']} ({KIND_COLOURS['correction']})" in caption
    assert f"{KIND_LABELS['accepted']} ({KIND_COLOURS['accepted']})" in caption
    assert "refused" not in caption.split("(amber)")[0]  # a refusal is named by the bar that stands for it


def test_the_concurrency_text_says_when_speculation_never_pays():
    """Nothing accepted: it does not pay even for one request, rather than "stops paying at B = 1"."""
    _, text = run_concurrency(0.0, 0.5, 0.2)
    assert "does not pay even alone" in text and "stops paying at k = 1 at B = 1" not in text
    _, text = run_concurrency(0.8, 0.02, 0.0)
    assert "does not pay" not in text


@pytest.mark.parametrize(
    ("repeats", "why"), [(1, "each setting ran once, so there is no spread"), (3, "the spreads overlap")]
)
def test_a_sweep_chart_without_a_best_says_why(repeats, why):
    table = pd.DataFrame(
        {"k": [1, 2], "speedup": [1.1, 1.2], "speedup_low": [1.0, 1.05], "speedup_high": [1.2, 1.3]}
    ).assign(predicted_leviathan=1.3, predicted_measured=1.2, best=False, repeats=repeats)
    notes = [a.text for a in speedup_curve(table).layout.annotations]
    assert any(why in note for note in notes), notes


def test_a_draft_without_a_distribution_is_named_where_the_round_turned():
    """An n-gram draft has no distribution: the correction's popover names the token it refused."""
    trace = hand_made()
    trace.rounds[0].target_top = [TopToken(4, " d", 0.7), TopToken(2, " b", 0.1)]
    chips = re.findall(r'class="sl-tok sl-(correction|rejected)" data-tip="([^"]*)"', timeline_html(trace))
    assert len(chips) == 2
    for _, tip in chips:
        assert "draft: only “ b”, with q = 1" in html_lib.unescape(tip)


def test_the_check_stage_sets_one_pass_against_k_plus_one_plain_steps():
    """The step-through's check stage: every guess read in one target pass, its measured time beside
    the k + 1 plain steps writing them one at a time would take, at the plain run's measured step."""
    trace = hand_made()  # no plain run, and every round drafted
    first = trace.rounds[0]
    assert plain_step(trace) is None
    assert check_stage(first, None) == (
        "the target reads all 3 guesses in one pass: 20 ms. "
        "(No plain step was measured in this run to set it against.)"
    )
    plain_times = [0.05, 0.06, 0.07, 0.08, 0.09, 0.10]  # a 10 ms step after the first token
    trace.attach_baseline(Baseline("x", trace.output.token_ids, 0.1, 60.0, plain_times))
    plain = plain_step(trace)
    assert plain.ms == pytest.approx(10.0) and plain.source == "the plain run's measured step"
    assert check_stage(first, plain).endswith(
        "One at a time, those 3 tokens and the target's next would take 4 plain steps: "
        "4 × 10.0 ms = 40 ms (the plain run's measured step)."
    )
    # One pass drawn as one bar, half as long as the four plain steps' four bars.
    drawn = pass_html(first, plain)
    one, steps = drawn.split('class="sl-pass-row sl-pass-steps"')
    assert one.count("sl-pass-seg") == 1 and 'style="width:50.0%"' in one
    assert steps.count("sl-pass-seg") == 4 and 'style="width:100.0%"' in steps
    html = html_lib.unescape(timeline_html(trace))
    assert 'data-check="the target reads all 3 guesses in one pass: 20 ms. One at a time' in html


def test_without_a_plain_run_the_check_stage_uses_the_runs_own_one_token_passes():
    trace = hand_made()
    alone = Round(0, [], [], 0, Emitted(9, " h", "target", 0.5), 0.0, 12.0, 12.0)
    trace.rounds.append(alone)
    plain = plain_step(trace)
    assert plain.ms == 12.0 and plain.source == "this run's one-token passes, 1 round that drafted nothing"
    assert "2 plain steps: 2 × 12.0 ms = 24 ms (this run's one-token passes" in check_stage(
        trace.rounds[2], plain
    )
    rows = re.findall(r'<div class="sl-round[^"]*" data-round="\d+"[^>]*>', timeline_html(trace))
    assert all("data-check=" in r for r in rows[:3]) and "data-check=" not in rows[3]


def test_a_simulated_round_is_read_in_one_pass_with_no_time_claimed():
    trace = simulate_trace(0.7, 3, 4, seed=1)
    assert check_stage(trace.rounds[0], plain_step(trace)) == "the target reads all 3 guesses in one pass."
    assert "sl-pass" not in timeline_html(trace) and "data-check=" in timeline_html(trace)


def test_the_verdict_stage_gives_every_verdict_of_the_pass_at_once():
    first, second, third = hand_made().rounds
    assert verdicts_stage(first) == (
        "all 3 verdicts at once, from that one pass: 1 kept, 1 refused (the target would have written "
        "another token), 1 never judged (after the refusal)"
    )
    assert verdicts_stage(second) == "both verdicts at once, from that one pass: both kept"
    assert verdicts_stage(third) == "the verdict, from that one pass: kept"


def test_a_built_up_timeline_holds_every_round_and_hides_those_after_the_chosen_one():
    """Replay shows the trace up to its chosen round; the later rounds are there, hidden, so the
    step-through counts and reaches every round."""
    html = timeline_html(hand_made(), selected=1, built_up=True)
    classes = re.findall(r'<div class="(sl-round[^"]*)" data-round', html)
    assert classes == ["sl-round", "sl-round sl-selected", "sl-round sl-later"]
    assert "sl-later" not in timeline_html(hand_made(), selected=1)


def test_a_draft_copied_from_the_chat_template_says_so_and_quotes_it():
    """The default pair's first round copies "You are a helpful" from the system prompt the chat
    template adds: its sentence says where that came from, quoting the text the prompt box hides."""
    trace = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")
    sentence = round_sentence_markdown(trace, 0)
    assert sentence.startswith(explain_round_markdown(trace.rounds[0], 0))
    assert (
        "The draft copied them from the chat template, text the model reads before the typed prompt"
        in sentence
    )
    assert "You are a helpful AI assistant named SmolLM" in sentence
    # Round 4 copied from the article typed in the prompt (prompt token 31 on): nothing to add.
    assert trace.rounds[3].match.start == 30 and "chat template" not in round_sentence_markdown(trace, 3)
    assert "You are a helpful AI assistant" in html_lib.unescape(timeline_html(trace))  # the row's sentence
