"""A run priced on a recorded GPU: the figure sets read from benchmarks/gpu-*/ (and nothing from a
folder that cannot be read), the cost model's own formula with the card's V(n), its cap, and one
line, no numbers, where the pair or the shape was never measured there."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import ROOT

from decoding import costmodel
from decoding.costmodel import GpuFigures, model_shape, price_on_gpu
from decoding.settings.policies import Policy
from decoding.tools.cli import main
from decoding.tools.gpu_figures import recorded
from decoding.trace import DraftToken, Emitted, Round, RunMeta, Trace, Verdict
from visualize.gpu import NO_FIGURES, NOTHING_YET, on_gpu_markdown

H200 = ROOT / "benchmarks" / "gpu-h200-random-bf16"


def a_round(drafted: int, accepted: int, draft_ms: float) -> Round:
    draft = [DraftToken(10 + j, f"t{j}", 1.0) for j in range(drafted)]
    verdicts = [Verdict(1.0 if j < accepted else 0.0, None, None, j < accepted) for j in range(drafted)]
    emitted = Emitted(99, "e", "bonus" if accepted == drafted and drafted else "correction", 0.9)
    return Round(drafted, draft, verdicts, accepted, emitted, draft_ms, 5.0, 6.0)


def a_trace(draft_kind: str = "ngram", draft: str = "ngram", target: str = "smollm2-135m", **meta) -> Trace:
    """Four rounds: 2 drafted and both accepted, 2 drafted and none, nothing drafted, 1 drafted and
    accepted. Position 0 is reached 3 times and accepted twice, position 1 reached and accepted once."""
    rounds = [a_round(2, 2, 0.2), a_round(2, 0, 0.2), a_round(0, 0, 0.1), a_round(1, 1, 0.1)]
    policy = Policy("fixed", 2)
    trace = Trace(RunMeta(target=target, draft_kind=draft_kind, draft=draft, policy=policy, **meta), rounds)
    trace.finish(0.1)
    return trace


def figures(steps: dict[int, float], costs: dict | None = None) -> GpuFigures:
    return GpuFigures(
        "NVIDIA H200",
        "bfloat16",
        False,
        "2026-12-04",
        "benchmarks/gpu-x",
        True,
        {"smollm2-135m": steps},
        costs or {},
    )


def test_the_recorded_h200_figures_are_read_as_they_were_measured():
    (h200,) = recorded()
    assert (h200.card, h200.dtype, h200.graphs, h200.date) == ("NVIDIA H200", "bfloat16", False, "2026-12-04")
    assert h200.source == "benchmarks/gpu-h200-random-bf16" and h200.random_weights
    probe = json.loads((H200 / "probe-smollm2-135m-random.json").read_text())
    assert h200.steps_ms["smollm2-135m"] == {
        int(n): row["step_ms"] for n, row in probe.items() if n.isdigit()
    }
    assert set(h200.steps_ms) == {"smollm2-135m", "smollm2-1.7b"}
    # bench-model: the 135M architecture drafting for the 1.7B one; its summary's "all" row says c 0.896.
    assert h200.draft_costs == {("smollm2-1.7b", "smollm2-135m"): pytest.approx(0.896, abs=5e-4)}


def test_folders_that_cannot_be_read_are_skipped_and_the_rest_still_count(tmp_path):
    root = tmp_path / "benchmarks"
    shutil.copytree(H200, root / "gpu-good")
    (root / "gpu-corrupt").mkdir()
    (root / "gpu-corrupt" / "probe-smollm2-135m-random.json").write_text('{"device": "cuda", "1": {"step')
    (root / "gpu-cpu").mkdir()
    probe = json.loads((H200 / "probe-smollm2-135m-random.json").read_text())
    (root / "gpu-cpu" / "probe-x.json").write_text(json.dumps(probe | {"device": "cpu"}))
    (root / "gpu-empty").mkdir()
    (root / "gpu-a-file").write_text("not a folder")
    (root / "gpu-good" / "bench-model" / "results.csv").write_text("")  # a bench cut short: no c
    # Graphs on at the top, off in no-graphs/: two figure sets of one folder.
    (root / "gpu-graphs").mkdir()
    (root / "gpu-graphs" / "probe-smollm2-135m-random.json").write_text(json.dumps(probe | {"graphs": True}))
    (root / "gpu-graphs" / "no-graphs").mkdir()
    (root / "gpu-graphs" / "no-graphs" / "probe-smollm2-135m-random.json").write_text(json.dumps(probe))
    found = recorded(root)
    assert [(f.source, f.graphs) for f in found] == [
        ("benchmarks/gpu-good", False),
        ("benchmarks/gpu-graphs", True),
        ("benchmarks/gpu-graphs/no-graphs", False),
    ]
    assert found[0].draft_costs == {}
    assert found[1].date == ""  # no probe or bench there recorded when
    assert recorded(tmp_path / "nowhere") == []


def test_an_ngram_run_priced_by_the_cost_models_formula_with_v_held_monotone():
    # V(3) timed below V(2), as a busy machine can: held at V(2) = 1.1 steps, as check_cost holds it.
    trace, gpu = a_trace(), figures({1: 10.0, 2: 11.0, 3: 9.0, 5: 15.0})
    priced = price_on_gpu(trace, gpu)
    assert costmodel.position_profile(trace) == pytest.approx([2 / 3, 2 / 3])
    # The n-gram draft costs what this run measured: 0.6 ms over 4 rounds, in the card's 10 ms steps.
    drafting = 0.6 / 10.0
    # k = 1: three rounds draft one token (1 + 2/3 expected each), one drafts none (1 token).
    k1 = (3 * (1 + 2 / 3) + 1) / (drafting + 3 * 1.1 + 1)
    # k = 2: two rounds draft two (1 + 2/3 + 2/3), one none, one a single token; V(3) held at 1.1.
    k2 = (2 * (1 + 4 / 3) + 1 + (1 + 2 / 3)) / (drafting + 2 * 1.1 + 1 + 1.1)
    assert [p.k for p in priced.prices] == [1, 2]  # no position past the second was reached
    assert [p.speedup for p in priced.prices] == pytest.approx([k1, k2])
    assert [p.tokens_per_s for p in priced.prices] == pytest.approx([k1 * 100, k2 * 100])
    assert priced.step_ms == 10.0 and "this run's own" in priced.draft_cost and not priced.unpriced


def cap(trace: Trace, k: int, step_ms: float) -> float:
    """Tokens per round over drafting and one step a round, the rounds drafting what they drafted, k at most."""
    profile = costmodel.position_profile(trace)
    tokens = sum(costmodel.expected_tokens_profile(profile, min(r.drafted, k)) for r in trace.rounds)
    drafting = sum(r.draft_ms for r in trace.rounds) / step_ms
    return costmodel.speedup_ceiling(tokens / len(trace.rounds), drafting / len(trace.rounds))


def test_no_prediction_passes_the_cap_of_tokens_per_round_over_drafting_and_one_step():
    trace = a_trace()
    cheap = price_on_gpu(trace, figures({1: 10.0, 2: 4.0, 3: 3.0}))  # checking more timed as cheaper
    assert [p.speedup for p in cheap.prices] == pytest.approx([cap(trace, k, 10.0) for k in (1, 2)])
    # The real card's 135M step timed V(3) at 0.97 V(1).
    example = Trace.load(ROOT / "assets/traces/summarization-ngram-greedy.json")
    h200 = price_on_gpu(example, recorded()[0])
    assert len(h200.prices) == 4
    for price in h200.prices:
        assert price.speedup <= cap(example, price.k, h200.step_ms) + 1e-12


def test_a_draft_model_costs_its_c_measured_on_the_card_and_one_never_measured_there_gets_no_numbers():
    gpu = GpuFigures(
        "NVIDIA H200",
        "bfloat16",
        False,
        "",
        "x",
        True,
        {"smollm2-1.7b": {1: 10.0, 2: 10.0}},
        {("smollm2-1.7b", "smollm2-135m"): 0.5},
    )
    measured = price_on_gpu(a_trace("model", "smollm2-135m", "HuggingFaceTB/SmolLM2-1.7B-Instruct"), gpu)
    (k1,) = [p.speedup for p in measured.prices]  # V(n) measured up to 2 tokens: k = 1 at most
    assert k1 == pytest.approx((3 * (1 + 2 / 3) + 1) / (3 * 0.5 + 3 * 1.0 + 1))
    assert "c = 0.50" in measured.draft_cost
    for kind, draft in (
        ("model", "smollm2-360m"),
        ("head", "head"),
        ("layers", "layers:10"),
        ("hybrid", "ngram+head"),
    ):
        never = price_on_gpu(a_trace(kind, draft, "smollm2-1.7b"), gpu)
        assert never.prices == () and "never measured on the NVIDIA H200" in never.unpriced, kind
    other_shape = price_on_gpu(a_trace(target="gemma3-270m"), gpu)
    assert other_shape.prices == () and "no V(n) on the NVIDIA H200" in other_shape.unpriced
    tree = price_on_gpu(a_trace(target="smollm2-1.7b", tree_nodes=8), gpu)
    assert tree.prices == () and "tree" in tree.unpriced


def test_a_model_is_known_by_its_shape_under_each_of_its_names():
    assert model_shape("HuggingFaceTB/SmolLM2-1.7B-Instruct") == model_shape("smollm2-1.7b") == "smollm2-1.7b"
    assert model_shape("/tmp/device-models/smollm2-135m-random") == "smollm2-135m"
    assert model_shape("google/gemma-3-270m-it") == model_shape("gemma3-270m")
    assert model_shape("meta-llama/Llama-3.1-8B-Instruct") == model_shape("llama3.1-8b")
    assert model_shape("smollm2-135m") != model_shape("smollm2-360m")


def test_the_view_says_prediction_card_source_and_the_runs_own_measurement():
    trace = Trace.load(ROOT / "assets/traces/summarization-ngram-greedy.json")
    text = on_gpu_markdown(trace, recorded())
    assert "Predicted on the NVIDIA H200" in text and "A prediction, not a measurement" in text
    assert "random\\-weight models of the real shapes" in text and "CUDA graphs off" in text
    assert "gpu\\-h200\\-random\\-bf16" in text and "2026\\-12\\-04" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 4 and f"×{trace.totals.speedup:.2f}" in rows[3] and "| – |" in rows[0]
    head = Trace.load(ROOT / "assets/traces/mt_bench-layers20-greedy.json")
    assert "never measured on the NVIDIA H200" in on_gpu_markdown(
        head, recorded()
    ) and "|" not in on_gpu_markdown(head, recorded())
    assert on_gpu_markdown(None, recorded()) == NOTHING_YET and on_gpu_markdown(trace, []) == NO_FIGURES


def test_price_on_the_command_line(tmp_path, capsys):
    assert main(["price", str(ROOT / "assets/traces/summarization-ngram-greedy.json")]) == 0
    out = capsys.readouterr().out
    assert "predicted on the NVIDIA H200" in out and "k=4" in out and "×1.30 against plain decoding" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["price", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("error: not a SpecLens trace")
    assert main(["price", str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.strip().endswith("missing.json: No such file or directory")
