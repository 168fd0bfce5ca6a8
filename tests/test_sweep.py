"""Sweeps that tell the truth: every setting against plain runs of its own, taking turns, with
repeats; a best setting only where it beats the rest beyond their spread."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import tiny_model_folder

from decoding.api import RunConfig
from decoding.core.budget import RunStopped
from decoding.settings.policies import make_policy
from decoding.tools.sweep import best_of, best_setting, spread, sweep, tree_sweep, with_best
from decoding.tools.workload import best_ks, group_figures, whole_prompts, workload_sweep, workload_table
from decoding.trace import RunMeta, Totals, Trace


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
    once = table([(1, 1.10, 1.10, 1.10), (2, 1.40, 1.40, 1.40)]).assign(repeats=1)
    assert best_setting(once, "k") is None  # measured once: no spread to judge by


def test_the_best_or_why_none_is_one_value():
    clear = with_best(table([(1, 1.10, 1.05, 1.15), (2, 1.40, 1.32, 1.45)]).assign(repeats=3), "k")
    clear["tokens_per_round"] = [1.5, 2.5]
    best = best_of(clear, "k")
    assert (best.value, best.clear, best.speedup, best.repeats, best.why_not) == (2, True, 1.40, 3, "")
    overlapping = clear.assign(speedup_low=[1.05, 1.10], best=False)
    top = best_of(overlapping, "k")
    assert (top.value, top.clear) == (2, False) and "spread over 3 repeats" in top.why_not
    once = overlapping.assign(repeats=1)
    assert "measured once" in best_of(once, "k").why_not
    per_category = pd.concat([clear.assign(category="qa"), overlapping.assign(category="all")])
    assert {c: b.clear for c, b in best_ks(per_category).items()} == {"qa": True, "all": False}


def _run(speedup: float, wall_s: float = 1.0, plain_s: float = 1.0) -> Trace:
    totals = Totals(new_tokens=10, rounds=5, proposed=8, accepted=4, wall_s=wall_s, speedup=speedup,
                    baseline_tokens_per_s=10 / plain_s, identical_to_baseline=True)  # fmt: skip
    return Trace(meta=RunMeta(prompt="p"), totals=totals)


def test_the_median_of_an_even_number_of_repeats_is_the_mean_of_the_middle_two():
    figures = spread([_run(1.4), _run(1.0)])
    assert figures["speedup"] == pytest.approx(1.2) and figures["speedup_low"] == 1.0
    assert spread([_run(1.0), _run(3.0), _run(1.2)])["speedup"] == 1.2
    # A workload's: plain time over speculative time per repeat, then the same median.
    workload = group_figures([[_run(0, wall_s=1.0, plain_s=1.0), _run(0, wall_s=1.0, plain_s=2.0)]])
    assert workload["speedup"] == pytest.approx(1.5) and workload["speedup_low"] == pytest.approx(1.0)


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


def test_a_workload_sweep_takes_turns_and_sums_each_category(tiny_config, tmp_path):
    prompts = [
        {"category": "copy", "prompt": "a b c a b c a b c"},
        {"category": "copy", "prompt": "x y x y x y"},
        {"category": "chat", "prompt": "hello there"},
    ]
    table, order = workload_sweep(tiny_config, prompts, [2, 1], repeats=2)
    # Every prompt at every k, in turn, once per repeat; each run after a plain run of its own.
    assert order == [(0, 1), (0, 2), (1, 1), (1, 2), (2, 1), (2, 2)] * 2
    assert list(zip(table["category"], table["k"])) == [
        ("chat", 1), ("chat", 2), ("copy", 1), ("copy", 2), ("all", 1), ("all", 2),
    ]  # fmt: skip
    assert list(table["prompts"]) == [1, 1, 2, 2, 3, 3] and (table["repeats"] == 2).all()
    assert (table["speedup_low"] <= table["speedup"]).all() and (
        table["speedup"] <= table["speedup_high"]
    ).all()
    assert table["identical_to_baseline"].all()
    for category, part in table.groupby("category"):
        assert part["best"].sum() <= 1, category


def test_a_workload_speedup_is_the_whole_category_finishing_sooner():
    """Plain 3 s + 1 s against speculative 1 s + 1 s: the category finishes ×2 sooner, though
    its prompts' own speedups are ×3 and ×1."""

    def run(new_tokens: int, wall_s: float, plain_s: float) -> Trace:
        totals = Totals(new_tokens=new_tokens, rounds=1, proposed=2, accepted=1, wall_s=wall_s,
                        baseline_tokens_per_s=new_tokens / plain_s, identical_to_baseline=True)  # fmt: skip
        return Trace(meta=RunMeta(prompt="p"), totals=totals)

    figures = group_figures([[run(30, 1.0, 3.0)], [run(10, 1.0, 1.0)]])
    assert figures["speedup"] == pytest.approx(2.0) and figures["tokens_per_round"] == 20
    assert figures["acceptance_rate"] == 0.5 and figures["repeats"] == 1


def _cell(prompt: str, k: int, repeats: int = 1) -> list[Trace]:
    """One prompt's repeats at one k, each twice as fast as its plain run."""
    runs = [_run(2.0, wall_s=1.0, plain_s=2.0) for _ in range(repeats)]
    for run in runs:
        run.meta = RunMeta(prompt=prompt, policy=make_policy("fixed", k))
    return runs


def test_one_categorys_workload_has_no_all_rows_repeating_it():
    """ "all" pools every category; of one category it would repeat its rows, so there is none."""
    one = workload_table([_cell("p", 1), _cell("q", 1)], {"p": "qa", "q": "qa"})
    assert list(one["category"]) == ["qa"] and list(one["prompts"]) == [2]
    two = workload_table([_cell("p", 1), _cell("q", 1), _cell("r", 1)], {"p": "qa", "q": "qa", "r": "rag"})
    assert list(zip(two["category"], two["prompts"])) == [("qa", 2), ("rag", 1), ("all", 3)]


def test_a_stopped_workload_keeps_the_prompts_measured_at_every_k(tiny_config):
    """A stop half-way through a prompt's k values drops that prompt: each row pools the same
    prompts at every k. Stopped before any prompt finished, it says why."""
    measured = [_cell("p", 1), _cell("p", 2), _cell("q", 1)]  # q stopped before its k = 2
    assert [runs[0].meta.prompt for runs in whole_prompts(measured, 2)] == ["p", "p"]
    table = workload_table(whole_prompts(measured, 2), {"p": "qa", "q": "rag"})
    assert list(zip(table["category"], table["k"], table["prompts"])) == [("qa", 1, 1), ("qa", 2, 1)]
    prompts = [{"category": "copy", "prompt": "a b c a b c"}, {"category": "chat", "prompt": "hello"}]
    turn = {"done": 0}  # the first prompt's k = 1 finishes, then Stop

    def note(done: int, total: int) -> None:
        turn["done"] = done

    with pytest.raises(
        RunStopped, match="stopped by the user before a prompt finished every k in every repeat"
    ):
        workload_sweep(
            tiny_config,
            prompts,
            [1, 2],
            note,
            lambda: "stopped by the user" if turn["done"] else None,
            repeats=1,
        )
