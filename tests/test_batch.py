"""Batched decoding: several sequences in one target pass, each as if alone."""

from __future__ import annotations

import ctypes
import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_llama, tiny_model_folder
from test_heads import random_head
from test_sampling import ALPHA, chi2_pvalue, exact_pair_distribution, noisy_copy

from app.tabs.production import batch_line
from app.tabs.theory import with_measured_batches
from app.tabs.traffic import open_measured
from decoding import costmodel
from decoding.core.batch import BatchRun, BatchSettings, Pass, batch_generate
from decoding.core.plain import autoregressive_generate
from decoding.core.speculative import speculative_generate
from decoding.core.tree import TreeShape
from decoding.drafts import HybridDraft, LayerDraft, ModelDraft, NGramDraft
from decoding.drafts.head import HeadDraft
from decoding.drafts.head.model import HeadCache
from decoding.drafts.suffix import SuffixCorpus, SuffixDraft
from decoding.runtime import llama, rowlinear
from decoding.runtime.forward import forward, forward_batch, new_cache
from decoding.runtime.rowlinear import use_row_kernel
from decoding.settings.policies import make_policy
from decoding.settings.sampling import Sampling
from decoding.tools.batch_bench import BATCH_COLUMNS, BatchResults, full_batch_tps, save_measured
from decoding.tools.cli import main
from decoding.trace import Trace, validate
from visualize.batch import busy_note, draft_kind, engine_configs, spread_note, why_sentence
from visualize.charts import batch_figure

needs_kernel = pytest.mark.skipif(rowlinear.library() is None, reason="the kernel did not build here")


def _kernel_llama(seed: int) -> torch.nn.Module:
    model = tiny_llama(seed=seed).to(torch.float32)
    assert use_row_kernel(model) and llama.use_layer_kernel(model)
    return model


def _same(a: torch.Tensor, b: torch.Tensor, exact: bool) -> bool:
    return torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-12, atol=1e-12)


# The kernel computes each row on its own, in a fixed order: bit for bit. torch's float64
# products (the module path) sum in an order that depends on the row count: to rounding.
MODELS = [
    pytest.param(lambda: tiny_llama(seed=3), False, id="modules"),
    pytest.param(lambda: _kernel_llama(3), True, marks=needs_kernel, id="kernel"),
]


@pytest.mark.parametrize("make,exact", MODELS)
def test_a_batched_pass_gives_each_sequence_what_it_gets_alone(make, exact):
    """Sequences of different cached lengths, checking 1 to 5 rows each: every row's logits, and
    every cache afterwards, are those of the same pass over that sequence alone."""
    model = make()
    torch.manual_seed(0)
    prompts = [torch.randint(0, 64, (1, n)) for n in (7, 300, 2, 40)]
    alone, together = [new_cache(model) for _ in prompts], [new_cache(model) for _ in prompts]
    for p, a, t in zip(prompts, alone, together, strict=True):
        forward(model, p, a)
        forward(model, p, t)
    for sizes in ((1, 1, 1, 1), (5, 1, 3, 2), (1, 4, 1, 5)):
        ids = [torch.randint(0, 64, (1, n)) for n in sizes]
        batched = forward_batch(model, ids, together)
        for i, a, b in zip(ids, alone, batched, strict=True):
            assert _same(forward(model, i, a), b, exact)
    for a, t in zip(alone, together, strict=True):
        assert a.get_seq_length() == t.get_seq_length()
        for la, lt in zip(a.layers, t.layers, strict=True):
            assert _same(la.keys, lt.keys, exact) and _same(la.values, lt.values, exact)


PROMPTS = [[1, 5, 9, 3, 7, 5, 9], [2, 2, 2, 8, 2, 2], [42], [7, 7, 1, 2, 3, 4, 7, 7, 1], [9, 8, 7, 6, 5]]


def _drafts(target, draft, kernel: bool = False) -> dict:
    """Every draft source, built for the tiny target (the head random, over the even tokens; on the
    kernel path, stepping through the layer kernel, which drafts for a batch in shared steps)."""
    head = random_head(target, list(range(0, 64, 2)), std=0.2)
    if kernel:
        use_row_kernel(head, panels=False)
        assert HeadDraft(head, target, "h").drafts_together()
    models = {"layers": LayerDraft(target, 1, 64), "model": ModelDraft(draft, 64, "self")}
    assert all(d.drafts_together() for d in models.values())  # one pass of the draft a step for all
    return {
        "ngram": NGramDraft(),
        "suffix": SuffixDraft(SuffixCorpus()),
        **models,  # "model" is the target itself: always right, so bonus rounds too
        "head": HeadDraft(head, target, "h"),
        "hybrid": HybridDraft(NGramDraft(), HeadDraft(head, target, "h"), min_match=2),
    }


def _batch(target, draft, size: int, k: int = 3, sampling: Sampling = Sampling(), tokens: int = 30):
    prompts = [torch.tensor([p]) for p in PROMPTS]
    settings = BatchSettings(size, sampling, tokens)
    return batch_generate(
        target, prompts, settings, draft, (lambda: make_policy("fixed", k)) if draft else None
    )


@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=needs_kernel)], ids=["modules", "kernel"])
def test_every_sequence_of_a_batch_is_its_own_plain_run_for_every_draft_source(kernel):
    """Greedy, plain at batch sizes 1, 2 and 5 and every draft source at 1 and 3, sequences joining as
    others finish: every output is its prompt's plain output, and every sequence's acceptance round by round is what it gets decoding
    alone (a head's features sent to the wrong sequence would keep the output and lose acceptance)."""
    target = _kernel_llama(0) if kernel else tiny_llama(seed=0)
    plain = [autoregressive_generate(target, torch.tensor([p]), max_new_tokens=30).token_ids for p in PROMPTS]
    for size in (1, 2, 5):
        assert _batch(target, None, size).outputs == plain, size
    for name, draft in _drafts(target, target, kernel).items():
        alone = [
            speculative_generate(
                target, torch.tensor([p]), draft.fork(), make_policy("fixed", 3), max_new_tokens=30
            )
            for p in PROMPTS
        ]
        for size in (1, 3):
            run = _batch(target, draft, size)
            assert run.outputs == plain, (name, size)
            if name != "suffix":  # its corpus holds what the other sequences wrote so far
                accepted = [[r.verdict.n_accepted for r in rounds] for rounds in run.rounds]
                assert accepted == [[r.n_accepted for r in t.rounds] for t in alone], (name, size)
                drafted = [[r.proposal.tokens.tolist() for r in rounds] for rounds in run.rounds]
                assert drafted == [[[d.id for d in r.draft] for r in t.rounds] for t in alone], (name, size)
        assert sum(t.totals.accepted for t in alone) > 0, name


@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=needs_kernel)], ids=["modules", "kernel"])
def test_every_sequence_of_a_batch_checking_token_trees_is_its_own_plain_run(kernel):
    """Tree rounds at batch size 3, each sequence's tree checked in the shared pass through its own
    positions and mask: every output is its plain run's and every sequence accepts, round by
    round, what it accepts decoding alone with the same trees."""
    target = _kernel_llama(0) if kernel else tiny_llama(seed=0)
    plain = [autoregressive_generate(target, torch.tensor([p]), max_new_tokens=30).token_ids for p in PROMPTS]
    shape = TreeShape(6, 2)
    prompts = [torch.tensor([p]) for p in PROMPTS]
    for name, draft in _drafts(target, target, kernel).items():
        if not draft.drafts_trees:
            continue
        policy = lambda: make_policy("fixed", 3)  # noqa: E731
        alone = [
            speculative_generate(target, p, draft.fork(), policy(), max_new_tokens=30, tree=shape)
            for p in prompts
        ]
        run = batch_generate(target, prompts, BatchSettings(3, Sampling(), 30, tree=shape), draft, policy)
        assert run.outputs == plain, name
        assert all(r.tree is not None for rounds in run.rounds for r in rounds), name
        if name != "suffix":  # its corpus holds what the other sequences wrote so far
            accepted = [[r.verdict.n_accepted for r in rounds] for rounds in run.rounds]
            assert accepted == [[r.n_accepted for r in t.rounds] for t in alone], name
        assert sum(t.totals.accepted for t in alone) > 0, name


def test_a_batch_pass_checks_every_sequences_rows_and_shares_its_time(tiny_target):
    run = _batch(tiny_target, NGramDraft(), 3)
    assert max(p.sequences for p in run.passes) == 3
    for rounds, passes in zip(run.rounds, run.round_passes, strict=True):
        for r, i in zip(rounds, passes, strict=True):
            whole = run.passes[i]
            assert r.verify_s * 1e3 <= whole.ms + 1e-9
            assert whole.rows >= len(r.proposal) + 1
    assert sum(p.rows for p in run.passes) == sum(len(r.proposal) + 1 for rs in run.rounds for r in rs)


@pytest.mark.parametrize(
    "source", ["head", pytest.param("head-kernel", marks=needs_kernel), "ngram", "model"]
)
def test_sampling_in_a_batch_follows_the_target(source):
    """Three copies of a prompt decoded together, each with its own generator: the pairs of tokens
    they write are drawn from the target's own distribution (with the head drafting for the three
    in shared kernel steps, and a draft model in shared passes, too)."""
    vocab = 10
    target = tiny_llama(seed=3, layers=4, vocab=vocab, init=0.6)
    if source == "head-kernel":
        target = target.to(torch.float32)
        assert use_row_kernel(target) and llama.use_layer_kernel(target)
    sampling = Sampling(temperature=1.0)
    head = random_head(target, [0, 1, 2, 3, 5, 6, 8], seed=2, std=0.5)
    if source == "head-kernel":
        use_row_kernel(head, panels=False)
    if source == "model":
        draft = ModelDraft(noisy_copy(target, scale=0.3), vocab, "d")
    else:
        draft = NGramDraft() if source == "ngram" else HeadDraft(head, target, "h")
    assert draft.drafts_together() == (source in ("head-kernel", "model"))
    prompt = [3, 5, 3, 5, 3]
    joint = exact_pair_distribution(target, torch.tensor([prompt]), sampling)
    counts, accepted = np.zeros((vocab, vocab)), 0
    for seed in range(350):
        s = Sampling(1.0, seed=3 * seed)
        run = batch_generate(
            target,
            [torch.tensor([prompt])] * 3,
            BatchSettings(3, s, 2),
            draft,
            lambda: make_policy("fixed", 2),
        )
        for out, rounds in zip(run.outputs, run.rounds, strict=True):
            counts[out[0], out[1]] += 1
            accepted += sum(r.verdict.n_accepted for r in rounds)
    assert accepted > 50
    assert chi2_pvalue(counts.ravel(), joint.ravel()) > ALPHA


@pytest.fixture(scope="module")
def tiny_prompt_set(tmp_path_factory):
    """A little model on disk and four prompts of its words, in two categories."""
    root = tmp_path_factory.mktemp("batch")
    folder = tiny_model_folder(root / "tiny")
    lines = [
        {"category": c, "prompt": p}
        for c, p in [
            ("a", "a b c a b c a"),
            ("a", "d e f d e"),
            ("b", "x y z x y z x y"),
            ("b", "m n o p m n"),
        ]
    ]
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(line) for line in lines))
    return folder, prompts


def test_bench_batch_writes_a_row_per_batch_size(tiny_prompt_set, tmp_path, capsys):
    folder, prompts = tiny_prompt_set
    out = tmp_path / "out"
    args = ["bench", "--prompts", str(prompts), "--target", str(folder), "--draft", "ngram", "--k", "2"]
    args += ["--batch", "1,2,4", "--max-new-tokens", "12", "--no-chat", "--out", str(out)]
    assert main([*args, "--trace-dir", str(tmp_path / "traces")]) == 0
    table = pd.read_csv(out / "batch.csv")
    assert list(table["batch"]) == [1, 2, 4]
    assert set(BATCH_COLUMNS) <= set(table.columns)
    assert table["identical"].all() and (table["tokens_per_s_plain"] > 0).all()
    assert table["predicted_speedup"].between(0.05, 20).all()
    assert table["tokens_per_s_plain_single"].notna().tolist() == [True, False, False]
    assert (table["full_batch_tokens_per_s_plain"] > 0).all()
    summary = (out / "summary.md").read_text()
    assert "with the batch full" in summary and "B = 4: " in summary
    assert "| 4 |" in summary and "num_speculative_tokens_per_batch_size" in summary
    assert "batch 4:" in capsys.readouterr().out
    # Each sequence of each batch size's run, as a trace Replay reads: its rounds' share of each pass.
    trace = Trace.load(tmp_path / "traces" / "b4-002.json")
    validate(trace)
    assert (trace.meta.batch_size, trace.meta.batch_sequence, trace.meta.prompt) == (4, 2, "x y z x y z x y")
    assert all(r.pass_rows >= r.drafted + 1 and r.verify_ms <= r.pass_ms for r in trace.rounds)
    assert len(list((tmp_path / "traces").glob("b*.json"))) == 3 * 4


def test_a_full_batchs_throughput_counts_only_the_passes_with_every_sequence_in():
    # Four sequences at most: two full passes (4 tokens in 20 ms each), then the tail's 3 and 1.
    passes = [Pass(4, 4, 20.0), Pass(4, 4, 20.0), Pass(3, 3, 19.0), Pass(1, 1, 15.0)]
    run = BatchRun([[1] * 3] * 4, [[]] * 4, [[]] * 4, [[]] * 4, [0.0] * 4, passes, 0.1, 0.02, 4)
    assert full_batch_tps(run) == pytest.approx(8 / 0.040)
    assert math.isnan(full_batch_tps(replace(run, passes=passes[2:])))


@pytest.mark.parametrize(
    ("batch", "expect"),
    [("0", "at least 1 sequence"), ("2,x", "whole numbers"), ("8", "a batch of 8 needs at least 8 prompts")],
)
def test_bench_batch_refuses_a_batch_it_cannot_run_in_one_line(
    tiny_prompt_set, tmp_path, capsys, batch, expect
):
    folder, prompts = tiny_prompt_set
    args = ["bench", "--prompts", str(prompts), "--target", str(folder), "--draft", "ngram"]
    assert main([*args, "--batch", batch, "--no-chat", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert expect in err and "\n" not in err and "Traceback" not in err


@needs_kernel
def test_a_heads_shared_step_gives_each_sequence_what_its_own_step_gives():
    """The head's step over several sequences' rows (1 to 5 each, after caches of different
    lengths): each sequence's output rows, last-row logits and cache are bit for bit its own step's."""
    target = _kernel_llama(0)
    head = random_head(target, list(range(0, 64, 2)), std=0.2)
    use_row_kernel(head, panels=False)
    stepper = HeadDraft(head, target, "h").stepper
    hidden = head.c.hidden_size
    torch.manual_seed(0)
    alone, together = [HeadCache() for _ in range(4)], [HeadCache() for _ in range(4)]
    for n, a, t in zip((3, 70, 1, 12), alone, together, strict=True):
        emb, feature = torch.randn(n, hidden), torch.randn(n, hidden)
        stepper.step_logits(emb, feature, a)
        stepper.step_logits(emb, feature, t)
    for counts in ((1, 1, 1, 1), (5, 1, 3, 2), (1, 4, 1, 5)):
        embs = [torch.randn(n, hidden) for n in counts]
        features = [torch.randn(n, hidden) for n in counts]
        out, logits = stepper.step_together(torch.cat(embs), torch.cat(features), together, counts)
        ends = np.cumsum(counts)
        for j, (e, f, a) in enumerate(zip(embs, features, alone, strict=True)):
            own_out, own_logits = stepper.step_logits(e, f, a)
            assert torch.equal(out[ends[j] - counts[j] : ends[j]], own_out)
            assert torch.equal(logits[j], own_logits[-1])
    for a, t in zip(alone, together, strict=True):
        assert len(a) == len(t)
        assert torch.equal(a.k[:, : len(a)], t.k[:, : len(t)]) and torch.equal(
            a.v[:, : len(a)], t.v[:, : len(t)]
        )


def test_the_ctypes_structs_match_the_kernels_layout():
    """llama.py's mirrors of the kernel's structs have the C++ sizes and offsets: a field out of
    place would have the kernel read another field's bytes, with no error."""
    out = (ctypes.c_int64 * 13)()
    rowlinear.library().struct_layout(out)
    expected = [
        ctypes.sizeof(llama._Mask), ctypes.sizeof(llama._Layer), ctypes.sizeof(llama._LayerCacheView),
        ctypes.sizeof(llama._Head), ctypes.sizeof(llama._Segment), llama._Segment.caches.offset,
        llama._Segment.mask.offset, ctypes.sizeof(llama._Step), llama._Step.head.offset,
        llama._Step.segments.offset, llama._Step.segment.offset, ctypes.sizeof(llama._Attention),
        llama._Head.last_of_each.offset,
    ]  # fmt: skip
    assert list(out) == expected


def test_the_batched_cost_model_gives_tokens_per_round_where_rows_are_free_and_less_where_they_cost():
    costs = costmodel.BatchCosts(
        plain_batch=4, batch=4, tokens_per_round=2.0, rows_per_round=3.0, draft_ms=0.0,
        round_overhead_ms=0.0, step_overhead_ms=0.0, prefill_ms_per_token=0.0,
    )  # fmt: skip
    assert costmodel.batched_speedup(costs, lambda n: 20.0) == pytest.approx(2.0)  # a pass costs the same
    assert costmodel.batched_speedup(costs, lambda n: 5.0 * n) == pytest.approx(2.0 / 3.0)  # rows cost
    drafting = replace(costs, draft_ms=5.0)  # 4 sequences × 5 ms on a 20 ms pass
    assert costmodel.batched_speedup(drafting, lambda n: 20.0) == pytest.approx(2.0 * 20 / 40)


def test_pass_cost_takes_medians_held_monotone_and_goes_on_along_the_last_slope():
    v = costmodel.pass_cost([(1, 10.0), (1, 12.0), (1, 50.0), (2, 9.0), (4, 20.0)])
    assert v(1) == 12.0 and v(2) == 12.0  # the median of 1 row; 2 rows never cheaper than 1
    assert v(3) == pytest.approx(16.0) and v(6) == pytest.approx(28.0)


def test_k_by_batch_size_merges_ranges_and_turns_speculation_off_where_nothing_pays():
    speedups = {
        1: {2: 1.4, 4: 1.5},
        2: {2: 1.2, 4: 1.1},
        4: {2: 1.1, 4: 0.9},
        8: {2: 0.8, 4: 0.7},
        16: {2: 0.6},
    }
    ranges = costmodel.k_per_batch_size(speedups)
    assert ranges == [(1, 1, 4), (2, 7, 2), (8, 1024, 0)]
    vllm = costmodel.vllm_speculative_config("ngram", ranges)
    assert vllm["num_speculative_tokens"] == 4 and vllm["num_speculative_tokens_per_batch_size"][-1] == [
        8,
        1024,
        0,
    ]
    assert costmodel.sglang_adaptive_config(ranges) == {
        "1": {"candidate_steps": [4]}, "2": {"candidate_steps": [2]}, "8": {"candidate_steps": [0]}
    }  # fmt: skip
    assert costmodel.k_per_batch_size({1: {3: 1.2}, 4: {3: 1.1}}) == [
        (1, 4, 3)
    ]  # still paying: no guess beyond


def _table() -> pd.DataFrame:
    rows = [(1, 2, 1.4, 2.2, 2.1), (2, 2, 1.1, 4.4, 2.1), (4, 2, 0.8, 8.8, 2.1)]
    return pd.DataFrame(
        [
            {"batch": b, "k": k, "speedup": s, "speedup_low": s - 0.05, "speedup_high": s + 0.05,
             "predicted_speedup": s + 0.02, "rows_per_pass": rows_, "tokens_per_round": t}
            for b, k, s, rows_, t in rows
        ]
    )  # fmt: skip


def test_the_sentence_says_where_rows_stop_being_free_and_where_speculation_stops_paying():
    text = why_sentence(_table(), {1: 20.0, 2: 21.0, 4: 24.0, 8: 40.0, 9: 44.0})
    assert "up to 4 rows" in text and "1 request" in text and "×1.40 at k=2" in text
    assert "at 4 requests together" in text and "speculation does not pay (×0.80" in text
    vllm, sglang = engine_configs(_table(), draft_kind("ngram+head@1/2"))
    assert json.loads(vllm)["method"] == "eagle3" and json.loads(sglang)["4"] == {"candidate_steps": [0]}
    fig = batch_figure(_table())
    assert [t.name for t in fig.data][:2] == ["k=2 measured", "k=2 predicted"]
    assert [t.x[0] for t in fig.data if t.text and "off from here" in t.text[0]] == [4]
    # A smallest batch that already loses still has the larger ones said; rows never free said plainly.
    losing = _table().assign(speedup=[0.8, 1.1, 0.9])
    text = why_sentence(losing, {1: 20.0, 2: 30.0, 4: 60.0})
    assert "even 2 rows cost more" in text and "at 4 requests together" in text
    assert [t.x[0] for t in batch_figure(losing).data if t.text] == [4]  # the dip at 1 came back above 1
    off = _table().assign(speedup=[0.9, 0.8, 0.7])
    assert engine_configs(off, "ngram")[0].startswith("speculation paid at no batch size measured (1, 2, 4)")


def test_a_batched_table_says_when_the_machine_was_busy_or_the_spread_decides_nothing():
    quiet = _table().assign(decode_tokens_per_s_plain=[10.0, 19.0, 36.0])
    passes = {1: 20.0, 2: 21.0, 4: 22.0}
    assert busy_note(quiet, passes) == ""
    busy = quiet.assign(
        decode_tokens_per_s_plain=[10.0, 10.5, 11.0]
    )  # batching gave nothing its passes allow
    assert "plain decoding at batch 4 ran 1.1 times" in busy_note(busy, passes)
    assert "above its tokens a round" in busy_note(quiet.assign(speedup=[2.5, 1.1, 0.8]), passes)
    assert "within the noise" in spread_note(_table().assign(speedup_low=[1.3, 0.95, 0.7]))
    once = _table().assign(speedup_low=lambda t: t["speedup"], speedup_high=lambda t: t["speedup"])
    assert "ran once" in spread_note(once)


def test_theory_and_production_show_the_traffic_tabs_measurement_and_say_it_is_measured(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path))
    _, before = with_measured_batches("smollm2-135m", 0.5, 0.05, 0.1)
    assert "Measured**" not in before and batch_line("smollm2-135m", "ngram") == ""
    assert "Nothing measured yet" in open_measured("smollm2-135m")[1]
    save_measured("smollm2-135m", "ngram", BatchResults(_table(), [(1, 20.0)], 12))
    save_measured("smollm2-135m", "ngram", BatchResults(_table().assign(k=4), [(5, 22.0)], 12))
    figure, said, vllm, _, shown, _ = open_measured("smollm2-135m")
    assert said.startswith("**Kept from") and "num_speculative_tokens_per_batch_size" in vllm
    assert sorted(set(shown["k"])) == [2, 4] and len(shown) == 6  # a second k's rows join the first's
    fig, text = with_measured_batches("smollm2-135m", 0.5, 0.05, 0.1)
    assert "**Measured** here on" in text and "×0.80 at B = 4" in text
    assert "k=2 measured" in [t.name for t in fig.data]
    assert "num_speculative_tokens_per_batch_size" in batch_line("smollm2-135m", "ngram")
    assert batch_line("smollm2-135m", "head") == ""  # another pair's measurement says nothing of this one
