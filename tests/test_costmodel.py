"""No prediction exceeds what its own inputs allow: a round's tokens over its drafting plus a check
that costs at least one target step, whatever V(n) a busy machine timed."""

from __future__ import annotations

import pytest
from conftest import ROOT

from app.tabs.theory import run_concurrency, run_theory, run_tree_theory
from decoding import costmodel
from decoding.trace import Trace

# What the probe kept on a busy machine: V(1) = 66.7 ms (2.26× its limit), V(2) = 30.9 ms.
BUSY = {1: 1.0, 2: 30.9 / 66.7, 3: 0.52, 5: 0.61, 9: 0.83, 17: 1.31, 32: 2.2, 64: 4.1}


def busy_ratio(n: int) -> float:
    return costmodel.verify_ratio_at(BUSY, n)


def test_the_busy_machines_v_gives_no_speedup_above_tokens_per_round():
    """Theory said "γ = 1: 1.70 tokens per round, ×3.02 faster" from these figures."""
    alpha, c = 0.7, 0.1
    best, speedups = costmodel.best_gamma(alpha, c, busy_ratio, 12)
    for gamma, speedup in enumerate(speedups, start=1):
        ceiling = costmodel.speedup_ceiling(costmodel.expected_tokens(alpha, gamma), gamma * c)
        assert speedup <= ceiling + 1e-12, (gamma, speedup, ceiling)
    _, text = run_theory(alpha, c, 0.0, 12, BUSY)
    assert "×3.02" not in text
    tokens = float(text.split("**: ")[1].split(" tokens per round")[0])
    said = float(text.split("round, ×")[1].split(" faster")[0])
    assert said <= tokens / (1 + best * c) + 0.005, text


def test_a_measured_v_is_held_monotone_and_never_below_one_step():
    held = costmodel.monotone_ratios(BUSY)
    assert held[2] == held[3] == 1.0 and held[9] == 1.0 and held[17] == 1.31
    assert all(a <= b for a, b in zip(held.values(), list(held.values())[1:]))
    assert [busy_ratio(n) for n in (1, 2, 4, 9)] == [1.0, 1.0, 1.0, 1.0]
    assert busy_ratio(128) == pytest.approx(4.1 + (4.1 - 2.2) * 64 / 32)  # the last slope on
    assert costmodel.linear_verify(-0.5)(9) == 1.0  # no b makes checking cheaper than one token
    assert costmodel.check_cost(lambda n: 0.4, 3) == 1.0


@pytest.mark.parametrize("k", range(1, 7))
def test_every_prediction_stays_under_its_ceiling(k):
    """Each function that predicts a speedup, fed the busy V(n): tokens ÷ (drafting + ≥ 1 step)."""
    alpha, c = 0.7, 0.1
    tokens = costmodel.expected_tokens(alpha, k)
    ceiling = costmodel.speedup_ceiling(tokens, k * c)
    assert costmodel.expected_speedup_measured(alpha, k, 66.7, 66.7 * c, 30.9) <= ceiling + 1e-12
    for batch in costmodel.CONCURRENCY:
        assert costmodel.concurrent_speedup(alpha, k, c, busy_ratio, batch) <= ceiling + 1e-12
    _, profile = costmodel.best_k_profile([alpha**i for i in range(1, 7)], c, busy_ratio, 6)
    assert profile[k - 1] <= ceiling + 1e-12
    ranks = costmodel.rank_acceptance(alpha, 0.15, 3)
    for nodes in (1, 4, 16):
        tree = costmodel.expected_speedup_tree(ranks, k, nodes, c, busy_ratio)
        assert (
            tree <= costmodel.speedup_ceiling(costmodel.expected_tokens_tree(ranks, k, nodes), k * c) + 1e-12
        )


def test_the_theory_tabs_views_on_the_busy_v_stay_under_their_ceilings():
    fig, _ = run_concurrency(0.7, 0.1, 0.0, BUSY)
    for line in fig.data:
        k = int(line.name.split("k=")[1].split(",")[0]) if line.name.startswith("k=") else None
        if k is not None:
            ceiling = costmodel.speedup_ceiling(costmodel.expected_tokens(0.7, k), k * 0.1)
            assert max(line.y) <= ceiling + 1e-12, line.name
    fig, text = run_tree_theory(0.7, 0.15, 3, 4, 0.1, 0.0, BUSY)
    speedup = float(text.split("), ×")[1].split(" over plain")[0])
    tokens = float(text.split("nodes: ")[1].split(" tokens per round")[0])
    assert speedup <= tokens / (1 + 4 * 0.1) + 0.005, text


def test_a_runs_prediction_counts_a_check_as_a_plain_step_at_least():
    """predicted_speedup on a real trace, with T_target set above every check it timed: each check
    then counts one T_target, and the prediction is the model's tokens over rounds of one step."""
    trace = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")
    slow_step = 10 * max(r.verify_ms for r in trace.rounds)
    alpha = costmodel.estimate_alpha(trace)
    tokens = sum(costmodel.expected_tokens(alpha, r.drafted) for r in trace.rounds)
    drafting = sum(r.drafted for r in trace.rounds) * costmodel.draft_ms_per_token(trace)
    expected = tokens * slow_step / (drafting + len(trace.rounds) * slow_step)
    assert costmodel.predicted_speedup(trace, slow_step) == pytest.approx(expected)
    assert costmodel.predicted_speedup(trace, slow_step) <= tokens / len(trace.rounds)
