"""Sweeps that tell the truth: every setting against plain runs of its own, taking turns, with
repeats; a best setting only where it beats the rest beyond their spread."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import tiny_model_folder

from decoding.api import RunConfig
from decoding.tools.sweep import best_setting, sweep, tree_sweep, with_best


def table(rows: list[tuple[int, float, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["k", "speedup", "speedup_low", "speedup_high"])


def test_the_best_is_starred_only_beyond_the_spread():
    clear = table([(1, 1.10, 1.05, 1.15), (2, 1.40, 1.32, 1.45), (3, 1.20, 1.18, 1.25)])
    assert best_setting(clear, "k") == 2
    assert list(with_best(clear, "k")["best"]) == [False, True, False]
    overlapping = table([(1, 1.10, 1.05, 1.15), (2, 1.40, 1.22, 1.45), (3, 1.30, 1.18, 1.35)])
    assert best_setting(overlapping, "k") is None
    assert not with_best(overlapping, "k")["best"].any()
    assert best_setting(table([(4, 0.9, 0.8, 1.0)]), "k") == 4  # one setting: nothing to beat


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> RunConfig:
    folder = tiny_model_folder(tmp_path_factory.mktemp("sweep") / "tiny", seed=3)
    return RunConfig(
        target=str(folder), draft="ngram", prompt="a b c a b c a b c", chat=False, max_new_tokens=12
    )


def test_each_setting_runs_its_repeats_against_plain_runs_of_its_own(tiny_config):
    order = []
    traces, result = sweep(tiny_config, [1, 2, 3], lambda done, total: order.append(done), repeats=3)
    assert list(result["k"]) == [1, 2, 3] and (result["repeats"] == 3).all()
    assert order == list(range(10))  # 9 runs, taking turns, then done
    assert (result["speedup_low"] <= result["speedup"]).all() and (
        result["speedup"] <= result["speedup_high"]
    ).all()
    baselines = {id(t.baseline) for t in traces}
    assert len(baselines) == 3  # each median run carries its own plain run
    assert "best" in result and result["best"].sum() <= 1
    _, trees = tree_sweep(tiny_config, [0, 4], repeats=2)
    assert list(trees["nodes"]) == [0, 4] and (trees["repeats"] == 2).all()


@pytest.mark.slow
def test_a_speedup_never_exceeds_what_its_tokens_per_round_allow(smol):
    """k = 1 against its own plain run: a round makes at most 2 tokens and costs at least one
    target step, so the speedup stays within its tokens per round, give or take the spread."""
    config = RunConfig(
        prompt="Repeat exactly: one two three, one two three, one two three.", max_new_tokens=24
    )
    _, result = sweep(config, [1, 2], repeats=3)
    for row in result.itertuples():
        assert row.speedup <= row.tokens_per_round + (row.speedup_high - row.speedup_low), row
    assert result.loc[result["k"] == 1, "tokens_per_round"].item() <= 2.0
