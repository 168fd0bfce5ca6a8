"""The Trace: invariants, JSON round trip, the flat DataFrame."""

from __future__ import annotations

import json

import pytest
import torch

from decoding.drafts import LayerDraft, ModelDraft, NGramDraft
from decoding.policies import make_policy
from decoding.speculative import speculative_generate
from decoding.trace import EVENT_COLUMNS, TOKEN_KINDS, Trace, check_invariants
from decoding.verify import Sampling


def traces(target):
    prompt = torch.tensor([[1, 5, 9, 3, 7, 5, 9]])
    runs = []
    for draft in (NGramDraft(), LayerDraft(target, 2, 64), ModelDraft(target, 64, "self")):
        for sampling in (Sampling(), Sampling(1.0, seed=2)):
            runs.append(
                speculative_generate(
                    target,
                    prompt,
                    draft,
                    make_policy("fixed", 4),
                    sampling,
                    40,
                    token_text=lambda i: f"<{i}>",
                )
            )
    return runs


def test_invariants_hold(tiny_target):
    for i, trace in enumerate(traces(tiny_target)):
        greedy = i % 2 == 0  # traces() alternates greedy and sampled runs
        check_invariants(trace)
        t = trace.totals
        assert t["new_tokens"] == 40
        assert t["acceptance_rate"] == pytest.approx(t["accepted"] / t["proposed"])
        assert t["tokens_per_step"] == pytest.approx(40 / t["steps"])
        for s in trace.steps:
            assert s.step_ms >= s.draft_ms + s.verify_ms - 1e-6
            # Positions after the first rejection were conditioned on a wrong
            # prefix: their verdicts are recorded but decide nothing.
            for v in s.verdicts[: s.n_accepted + 1]:
                assert 0.0 <= v.p <= 1.0 and 0.0 <= v.accept_prob <= 1.0
                if greedy:
                    assert v.u is None
                    assert v.accept_prob in (0.0, 1.0) and v.accept_prob == float(v.accepted)
                else:
                    assert v.accepted == (v.u < v.accept_prob)


def test_json_round_trip(tiny_target, tmp_path):
    for trace in traces(tiny_target):
        path = tmp_path / "t.json"
        trace.save(path)
        again = Trace.load(path)
        assert again.to_dict() == trace.to_dict()
        data = json.loads(path.read_text())
        assert set(data) >= {"meta", "steps", "totals", "output"}


def test_dataframe_one_row_per_event(tiny_target):
    for trace in traces(tiny_target):
        df = trace.to_dataframe()
        assert list(df.columns) == EVENT_COLUMNS
        emitted = sum(s.emitted is not None for s in trace.steps)
        assert len(df) == sum(s.k for s in trace.steps) + emitted
        assert set(df["kind"]) <= set(TOKEN_KINDS)
        out = df[df["kind"] != "rejected"]
        assert out["output_index"].tolist() == list(range(len(trace.output.token_ids)))
        assert out["token_id"].tolist() == trace.output.token_ids
        assert df[df["kind"] == "rejected"]["output_index"].isna().all()


def test_invariant_checker_catches_a_broken_trace(tiny_target):
    trace = traces(tiny_target)[0]
    step = next(s for s in trace.steps if s.k > s.n_accepted)
    step.verdicts[step.n_accepted].accepted = True  # no longer a prefix
    with pytest.raises(AssertionError):
        check_invariants(trace)


@pytest.mark.parametrize("text", ["", "[1, 2]", "{not json", '{"meta": {}}'])
def test_loading_garbage_is_a_clear_error(text):
    with pytest.raises(ValueError, match="not a SpecLens trace"):
        Trace.from_json(text)


def test_untraced_run_has_the_same_output_and_totals(tiny_target):
    prompt = torch.tensor([[1, 5, 9, 3, 7, 5, 9]])
    for draft in (NGramDraft(), ModelDraft(tiny_target, 64, "self")):
        runs = [
            speculative_generate(
                tiny_target, prompt, draft, make_policy("heuristic", 3), max_new_tokens=40, record=r
            )
            for r in (True, False)
        ]
        traced, bare = runs
        assert bare.steps == [] and bare.output.token_ids == traced.output.token_ids
        for key in ("steps", "new_tokens", "proposed", "accepted", "acceptance_rate", "tokens_per_step"):
            assert bare.totals[key] == traced.totals[key], key
