"""The Trace: invariants, JSON round trip, the flat DataFrame."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from decoding.core.speculative import speculative_generate, untraced_generate
from decoding.drafts import LayerDraft, ModelDraft, NGramDraft
from decoding.errors import TraceError
from decoding.settings.policies import make_policy
from decoding.settings.sampling import Sampling
from decoding.trace import (
    EVENT_COLUMNS,
    TOKEN_KINDS,
    TRACE_VERSION,
    RunMeta,
    Totals,
    Trace,
    token_frame,
    validate,
)
from visualize.timeline import timeline_html

V1_TRACE = Path(__file__).parent / "data" / "trace-v1.json"  # written before verdicts had kinds


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
        validate(trace)
        t = trace.totals
        assert t.new_tokens == 40
        assert t.acceptance_rate == pytest.approx(t.accepted / t.proposed)
        assert t.tokens_per_round == pytest.approx(40 / t.rounds)
        for s in trace.rounds:
            assert s.round_ms >= s.draft_ms + s.verify_ms - 1e-6
            # Positions after the first rejection were conditioned on a wrong
            # prefix: they were never judged, and carry no numbers.
            n, k = s.n_accepted, s.drafted
            refused = ["rejected"] + ["discarded"] * (k - n - 1) if n < k else []
            assert [v.kind for v in s.verdicts] == ["accepted"] * n + refused
            for v in s.verdicts[s.n_accepted + 1 :]:
                assert (v.p, v.accept_prob, v.u, v.accepted) == (None, None, None, False)
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
        assert set(data) >= {"meta", "rounds", "totals", "output"}
        assert all(r["drafted"] == len(r["draft"]) and "k" not in r for r in data["rounds"])


def test_dataframe_one_row_per_event(tiny_target):
    for trace in traces(tiny_target):
        df = token_frame(trace)
        assert list(df.columns) == EVENT_COLUMNS
        emitted = sum(s.emitted is not None for s in trace.rounds)
        assert len(df) == sum(s.drafted for s in trace.rounds) + emitted
        assert set(df["kind"]) <= set(TOKEN_KINDS)
        thrown = df["kind"].isin(["rejected", "discarded"])
        out = df[~thrown]
        assert out["output_index"].tolist() == list(range(len(trace.output.token_ids)))
        assert out["token_id"].tolist() == trace.output.token_ids
        assert df[thrown]["output_index"].isna().all()
        # Rounds and positions count from 1, as the timeline's #1 and the acceptance chart's x do.
        assert df["round"].min() == 1 and df["round"].max() == len(trace.rounds) and df["position"].min() == 1
        # One judged-and-refused token per round at most; everything after it is discarded, unjudged.
        assert (df[df["kind"] == "rejected"].groupby("round").size() <= 1).all()
        discarded = df[df["kind"] == "discarded"]
        assert discarded[["p", "accept_prob", "u"]].isna().all().all()
    assert any((token_frame(t)["kind"] == "discarded").any() for t in traces(tiny_target))


def test_invariant_checker_catches_a_broken_trace(tiny_target):
    trace = traces(tiny_target)[0]
    step = next(s for s in trace.rounds if s.drafted > s.n_accepted)
    step.verdicts[step.n_accepted].accepted = True  # no longer a prefix
    with pytest.raises(TraceError, match="round"):
        validate(trace)


def test_version_1_traces_load_with_kinds_and_without_unjudged_numbers():
    old = json.loads(V1_TRACE.read_text())
    assert "version" not in old and "kind" not in old["steps"][0]["verdicts"][0]
    trace = Trace.load(V1_TRACE)
    validate(trace)
    assert trace.version == TRACE_VERSION  # migrated to today's
    discarded = [v for s in trace.rounds for v in s.verdicts if v.kind == "discarded"]
    assert len(discarded) == 46  # 31 of them said "accept prob = 1.000" before
    assert all(v.p is None and v.accept_prob is None for v in discarded)
    again = Trace.from_json(trace.to_json())
    assert again.to_dict() == trace.to_dict()


def test_version_2_traces_load_with_rounds_and_typed_totals():
    """Three example traces as they were written before rounds were called rounds."""
    paths = sorted((ROOT / "tests" / "data").glob("trace-v2-*.json"))
    assert len(paths) == 3 and all(json.loads(p.read_text())["version"] == 2 for p in paths)
    for path in paths:
        old = json.loads(path.read_text())
        assert "steps" in old and "tokens_per_step" in old["totals"]
        trace = Trace.load(path)
        validate(trace)
        assert len(trace.rounds) == len(old["steps"]) == trace.totals.rounds == old["totals"]["steps"]
        assert trace.totals.tokens_per_round == old["totals"]["tokens_per_step"]
        assert [r.round_ms for r in trace.rounds] == [s["step_ms"] for s in old["steps"]]
        data = trace.to_dict()
        assert data["version"] == TRACE_VERSION and "steps" not in data and "steps" not in data["totals"]
        assert Trace.from_dict(data).to_dict() == data


def test_version_4_traces_load_with_drafted_for_what_was_k():
    """A round's `k` was the tokens it drafted, which the policy's k need not be."""
    path = ROOT / "tests" / "data" / "trace-v4-summarization-ngram-greedy.json"
    old = json.loads(path.read_text())
    assert old["version"] == 4 and all("k" in r and "drafted" not in r for r in old["rounds"])
    trace = Trace.load(path)
    validate(trace)
    assert [r.drafted for r in trace.rounds] == [r["k"] for r in old["rounds"]]
    assert {r.drafted for r in trace.rounds} > {trace.meta.policy.k}  # a short match drafts fewer
    data = trace.to_dict()
    assert data["version"] == TRACE_VERSION == 6
    assert all("drafted" in r and "k" not in r for r in data["rounds"])
    assert Trace.from_json(trace.to_json()).to_dict() == data
    assert Trace.load(path).totals.proposed == sum(r["k"] for r in old["rounds"]) == old["totals"]["proposed"]


def corrupt(data: dict, path: str, value) -> dict:
    data = json.loads(json.dumps(data))
    *keys, last = path.split(".")
    node = data
    for key in keys:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("steps.0.k", 9, "round 1: drafted is 9"),
        ("steps.3.n_accepted", -1, "round 4: n_accepted -1"),
        ("steps.0.draft.0.q", 7.5, "round 1: draft position 1: a draft token needs"),
        ("steps.3.draft.0.id", "x", "round 4: draft position 1"),
        ("steps.0.emitted.kind", "bonus", "round 1: the emitted token is a 'bonus'"),
        ("steps.2.emitted", None, "round 3: nothing was emitted"),
        ("output.token_ids", [1, 2, 3], "do not rebuild the output"),
        ("totals.accepted", 999, "totals.accepted is 999"),
        ("version", 99, "unknown version 99"),
        ("steps.0.verdicts", "nope", "not a SpecLens trace"),
        ("meta", [1], "meta must be an object"),
        ("meta.compiled", "yes", "meta.compiled must be true or false"),
        ("meta.prompt_tokens", "many", "meta.prompt_tokens must be a whole number"),
        ("meta.sampling.temperature", "hot", "meta.sampling must be an object"),
        ("meta.sampling.temperature", 99.0, "meta: temperature must be between 0 and 10"),
        ("meta.policy.k", 2.5, "meta.policy must be an object"),
    ],
)
def test_a_corrupt_trace_is_refused_naming_its_first_problem(path, value, message):
    data = json.loads(V1_TRACE.read_text())
    with pytest.raises(TraceError, match=message):
        validate(Trace.from_dict(corrupt(data, path, value)))


def test_a_discarded_token_with_numbers_is_refused():
    trace = Trace.load(V1_TRACE)
    step = next(s for s in trace.rounds if s.drafted - s.n_accepted >= 2)
    step.verdicts[-1].p = 0.5
    with pytest.raises(TraceError, match="never judged"):
        validate(trace)


def test_meta_loads_typed_from_old_and_hand_made_traces():
    meta = Trace.load(V1_TRACE).meta
    assert isinstance(meta, RunMeta) and meta.policy.k == 4 and meta.sampling.greedy
    assert meta.prompt_token_texts == [] and meta.stopped is None  # not recorded in version 1
    data = meta.to_dict()
    assert data["sampling"]["greedy"] is True and data["policy"]["name"] == "fixed"
    hand_made = RunMeta.from_dict({"sampling": {"greedy": False}, "prompt": None, "colour": "red"})
    assert not hand_made.sampling.greedy and hand_made.prompt == "" and not hasattr(hand_made, "colour")


@pytest.mark.parametrize("text", ["", "[1, 2]", "{not json", '{"meta": {}}'])
def test_loading_garbage_is_a_clear_error(text):
    with pytest.raises(ValueError, match="not a SpecLens trace"):
        Trace.from_json(text)


@pytest.mark.parametrize("data", [b"\x89PNG\r\n\x1a\n\x00\x00", b'{"version": 4, "meta": "caf\xe9"}'])
def test_a_binary_file_is_refused_in_speclenss_words(tmp_path, data):
    path = tmp_path / "upload.json"
    path.write_bytes(data)
    with pytest.raises(TraceError) as refused:
        Trace.load(path)
    assert str(refused.value) == "not a SpecLens trace: the file is not text (a trace is JSON in UTF-8)"


def test_untraced_run_has_the_same_output_and_totals(tiny_target):
    prompt = torch.tensor([[1, 5, 9, 3, 7, 5, 9]])
    for draft in (NGramDraft(), ModelDraft(tiny_target, 64, "self")):
        traced = speculative_generate(
            tiny_target, prompt, draft, make_policy("heuristic", 3), max_new_tokens=40
        )
        bare = untraced_generate(tiny_target, prompt, draft, make_policy("heuristic", 3), max_new_tokens=40)
        assert bare.rounds == [] and bare.output.token_ids == traced.output.token_ids
        for key in ("rounds", "new_tokens", "proposed", "accepted", "acceptance_rate", "tokens_per_round"):
            assert getattr(bare.totals, key) == getattr(traced.totals, key), key


def test_where_a_round_turned_the_trace_keeps_both_top_fives(tiny_target, tiny_draft):
    prompt = torch.tensor([[1, 5, 9, 3, 7, 5, 9]])
    for sampling in (Sampling(), Sampling(1.0, seed=3)):
        trace = speculative_generate(
            tiny_target, prompt, ModelDraft(tiny_draft, 64, "tiny"), make_policy("fixed", 3), sampling, 30
        )
        turned = [s for s in trace.rounds if s.n_accepted < s.drafted]
        assert turned
        for s in trace.rounds:
            probs = [t.prob for t in s.target_top]
            assert len(probs) == 5 and probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
            if sampling.greedy:  # the target's own token is its top choice
                assert s.target_top[0].id == s.emitted.id
            if s.n_accepted == s.drafted:  # a bonus: no draft distribution at that position
                assert s.draft_top is None and s.residual_top is None
        for s in turned:
            rejected = s.draft[s.n_accepted]
            if sampling.greedy:
                assert s.draft_top[0].id == rejected.id and s.residual_top is None
            else:
                assert s.draft_top[0].prob >= rejected.q - 1e-6
                # Rejected means p < q there, so the residual max(0, p - q) holds none of it.
                residual = {t.id: t.prob for t in s.residual_top}
                assert residual.get(rejected.id, 0.0) == 0.0
                assert sum(residual.values()) <= 1 + 1e-6
        tips = timeline_html(trace)
        assert "target&#x27;s top 5 here" in tips and "draft&#x27;s top 5 here" in tips
        assert ("drawn from the residual" in tips) == (not sampling.greedy)


def test_ngram_rounds_say_where_they_copied_from(tiny_target):
    prompt_ids = [1, 5, 9, 3, 7, 5, 9, 3, 7, 5, 9]
    texts = [f"<{i}>" for i in prompt_ids]
    trace = speculative_generate(
        tiny_target,
        torch.tensor([prompt_ids]),
        NGramDraft(),
        make_policy("fixed", 4),
        max_new_tokens=30,
        meta=RunMeta(prompt="p", prompt_tokens=len(prompt_ids), prompt_token_texts=texts),
    )
    seq = list(prompt_ids)
    for s in trace.rounds:
        if s.drafted:
            m = s.match
            assert seq[m.start - m.ngram : m.start] == seq[len(seq) - m.ngram :]  # the suffix it matched
            assert [t.id for t in s.draft] == seq[m.start : m.start + s.drafted]  # what followed it
        seq += trace.output.token_ids[len(seq) - len(prompt_ids) :][: s.new_tokens]
    first = next(i for i, s in enumerate(trace.rounds) if s.match and s.match.start < len(prompt_ids))
    html = timeline_html(trace, selected=first)
    assert 'class="sl-match-key"' in html and 'class="sl-match-copy"' in html
    assert "copied from prompt tokens" in html
    assert 'class="sl-match' not in timeline_html(trace)  # only for a selected round


def test_a_translation_without_a_list_of_sources_is_refused_in_one_line():
    """Found by the fuzz test: sources set to null broke the check instead of naming the problem."""
    data = json.loads((ROOT / "assets" / "traces" / "math_reasoning-gemma-smollm2-greedy.json").read_text())
    data["rounds" if "rounds" in data else "steps"][2]["translation"]["sources"] = None
    with pytest.raises(TraceError, match="translation sources must be a list"):
        validate(Trace.from_dict(data))


def test_the_run_length_is_said_in_words_with_singulars():
    assert Totals(rounds=1, new_tokens=1).tokens_in_rounds == "1 token in 1 round"
    assert Totals(rounds=5, new_tokens=12).tokens_in_rounds == "12 tokens in 5 rounds"


@pytest.mark.parametrize("version", [None, 1, 2, 4])
def test_a_trace_without_rounds_is_refused_naming_rounds(version):
    """A file of any version with no rounds is refused in today's words, not as missing 'steps'."""
    data = json.loads((ROOT / "assets" / "traces" / "summarization-ngram-greedy.json").read_text())
    del data["rounds"]
    data = {k: v for k, v in data.items() if k != "version"} | ({"version": version} if version else {})
    with pytest.raises(TraceError, match="missing or malformed field 'rounds'"):
        Trace.from_dict(data)
