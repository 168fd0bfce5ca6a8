"""`python -m decoding`: end to end on the offline default, and every bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import ROOT, tiny_model_folder
from huggingface_hub import constants as hub_constants
from transformers import LlamaConfig

from app.tabs.production import production_example
from app.tabs.theory import cached_verify, run_concurrency
from decoding import costmodel
from decoding.api import RunConfig
from decoding.runtime.tuning import TUNED
from decoding.settings.sampling import Sampling
from decoding.tools import metrics
from decoding.tools.cli import build_parser, main, run_config
from decoding.tools.probe import cached, physics_problems, verify_ratios
from decoding.trace import TRACE_VERSION, Trace, validate

PROMPT = "Summarize: the cat sat on the mat. The cat sat on the mat because the mat was warm."


@pytest.mark.slow
def test_generate_end_to_end_subprocess(tmp_path, smol):
    out = tmp_path / "trace.json"
    cmd = [sys.executable, "-m", "decoding", "generate", "--prompt", PROMPT, "--draft", "ngram"]
    cmd += ["--k", "3", "--max-new-tokens", "24", "--baseline", "--trace-out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "tokens/round" in done.stdout and "speedup" in done.stdout
    data = json.loads(out.read_text())
    assert set(data) >= {"meta", "rounds", "totals", "output", "baseline"}
    for key in ["new_tokens", "rounds", "proposed", "accepted", "acceptance_rate", "tokens_per_round"]:
        assert key in data["totals"]
    for key in ["wall_s", "tokens_per_s", "speedup", "identical_to_baseline"]:
        assert key in data["totals"]
    assert data["totals"]["identical_to_baseline"] is True
    assert set(data["baseline"]) >= {"text", "token_ids", "wall_s", "tokens_per_s"}
    step = data["rounds"][1]
    assert set(step) >= {
        "drafted",
        "draft",
        "verdicts",
        "n_accepted",
        "emitted",
        "draft_ms",
        "verify_ms",
        "round_ms",
    }
    assert set(data["meta"]) >= {"target", "draft_kind", "draft", "device", "dtype", "policy", "sampling"}
    assert data["meta"]["prompt_tokens"] > 10
    assert len(data["meta"]["prompt_token_texts"]) == data["meta"]["prompt_tokens"]
    assert data["version"] == TRACE_VERSION and {
        v["kind"] for s in data["rounds"] for v in s["verdicts"]
    } <= {
        "accepted",
        "rejected",
        "discarded",
    }
    # A trace is made to be shared: where the model sits on this machine stays here.
    meta = data["meta"]
    assert meta["target_source"] == "HuggingFaceTB/SmolLM2-135M-Instruct (SmolLM2-135M-Instruct.Q4_1.gguf)"
    assert str(Path.home()) not in out.read_text() and ".cache" not in out.read_text()
    assert "output identical to plain decoding" in done.stdout
    validate(Trace.from_dict(data))


def test_a_local_model_is_named_by_its_folder_alone(tmp_path, capsys, mismatched_draft):
    out = tmp_path / "t.json"
    args = ["--target", str(mismatched_draft), "--draft", "ngram", "--max-new-tokens", "4", "--no-chat"]
    assert main(["generate", "--prompt", "a b a b a b", *args, "--trace-out", str(out)]) == 0
    meta = Trace.load(out).meta
    assert meta.target == meta.target_source == mismatched_draft.name
    assert str(mismatched_draft.parent) not in out.read_text()


@pytest.mark.slow
def test_sampled_comparison_is_not_called_a_difference(capsys, smol):
    args = ["--temperature", "0.9", "--seed", "2", "--max-new-tokens", "8", "--baseline"]
    assert main(["generate", "--prompt", PROMPT, *args]) == 0
    out = capsys.readouterr().out
    assert "same distribution as plain sampling (not token-identical by design)" in out
    assert "DIFFERENT" not in out


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        ["--draft", "layers:12", "--k", "2"],
        [
            "--draft",
            "ngram",
            "--policy",
            "heuristic",
            "--temperature",
            "0.8",
            "--top-p",
            "0.9",
            "--seed",
            "1",
        ],
        ["--draft", "smollm2-135m", "--policy", "confidence", "--k", "6", "--no-chat"],
    ],
)
def test_generate_in_process(tmp_path, capsys, smol, extra):
    out = tmp_path / "t.json"
    code = main(["generate", "--prompt", PROMPT, "--max-new-tokens", "12", "--trace-out", str(out), *extra])
    assert code == 0, capsys.readouterr().err
    trace = Trace.load(out)
    validate(trace)
    assert trace.totals.new_tokens == len(trace.output.token_ids) <= 12
    assert trace.output.text in capsys.readouterr().out


@pytest.fixture(scope="module")
def mismatched_draft(tmp_path_factory) -> Path:
    """A real little model whose tokenizer is not SmolLM2's."""
    return tiny_model_folder(tmp_path_factory.mktemp("mismatch"))


@pytest.fixture(scope="module")
def huge_model(tmp_path_factory) -> Path:
    """Only a config: a 300-billion-parameter Llama that cannot fit here."""
    folder = tmp_path_factory.mktemp("huge")
    LlamaConfig(
        hidden_size=16384, intermediate_size=53248, num_hidden_layers=100, vocab_size=32000
    ).save_pretrained(folder)
    return folder


def run_bad(capsys, *args: str) -> str:
    code = main(["generate", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("error:") and "\n" not in err, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--k", "0"], "k must be"),
        (["--k", "17"], "k must be"),
        (["--policy", "bogus"], "invalid choice"),
        (["--k", "two"], "invalid int"),
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "0"], "top-p"),
        (["--max-new-tokens", "0"], "max new tokens"),
        (["--draft", "layers:99"], "layers:N needs 1 <= N < 30"),
        (["--draft", "layers:x"], "whole number"),
        (["--target", "no-such-model"], "unknown model 'no-such-model'"),
        (["--target", "/nonexistent/folder"], "unknown model"),
        (["--draft", "none"], "needs a draft"),
        (["--trace-out", "/nonexistent/dir/t.json"], "does not exist"),
        (["--dtype", "int3"], "unknown dtype"),
    ],
)
def test_bad_arguments(capsys, smol, args, expect):
    prompt = [] if "--prompt" in args else ["--prompt", "hello"]
    assert expect in run_bad(capsys, *prompt, *args)


def test_missing_prompt_and_empty_prompt(capsys, smol):
    assert "--prompt" in run_bad(capsys)
    assert "prompt is empty" in run_bad(capsys, "--prompt", "   ")


def test_huge_prompt(capsys, smol):
    err = run_bad(capsys, "--prompt", "word " * 9000)
    assert "exceeds" in err and "context" in err


def test_hub_id_offline_names_the_presets(capsys, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    err = run_bad(capsys, "--prompt", "hi", "--target", "someone/some-model")
    assert "not reachable" in err and "smollm2-135m" in err


def test_hub_unreachable_answers_fast(capsys, monkeypatch):
    # Not offline by setting: the socket check finds nothing listening.
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    err = run_bad(capsys, "--prompt", "hi", "--target", "someone/some-model")
    assert "not reachable" in err


def test_a_draft_with_another_tokenizer_drafts_through_text(tmp_path, capsys, smol, mismatched_draft):
    out = tmp_path / "t.json"
    args = ["generate", "--prompt", "hi", "--draft", str(mismatched_draft), "--max-new-tokens", "6"]
    assert main([*args, "--trace-out", str(out)]) == 0, capsys.readouterr().err
    trace = Trace.load(out)
    assert trace.meta.draft_kind == "cross"
    assert all(r.translation is not None for r in trace.rounds if r.drafted)


def test_model_too_large(capsys, huge_model):
    err = run_bad(capsys, "--prompt", "hi", "--target", str(huge_model))
    assert "GiB" in err and "pick a smaller model" in err


def test_folder_without_model(capsys, tmp_path):
    assert "no config.json" in run_bad(capsys, "--prompt", "hi", "--target", str(tmp_path))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_asked_for_without_cuda(capsys):
    assert "CUDA is not available" in run_bad(capsys, "--prompt", "hi", "--device", "cuda")


def test_prepare_fetches_a_hub_preset_or_says_why_not(capsys, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    assert main(["prepare", "smollm2-360m"]) == 2
    err = capsys.readouterr().err
    assert "cannot fetch 'HuggingFaceTB/SmolLM2-360M-Instruct'" in err and "not reachable" in err


def test_prepare_prints_the_cache_folder(capsys, smol):
    assert main(["prepare", "smollm2-135m"]) == 0
    path = capsys.readouterr().out.split(": ", 1)[1].strip()
    assert Path(path, "config.json").exists()
    assert os.path.commonpath([path, str(ROOT)]) != str(ROOT), "the cache must live outside the repository"


@pytest.mark.slow
def test_probe_prints_step_times_against_the_machines_limits(capsys, smol, tmp_path, monkeypatch):
    monkeypatch.setenv(
        "SPECLENS_CACHE", str(tmp_path)
    )  # the model is loaded: only the probe's file goes here
    assert cached("smollm2-135m") is None
    assert main(["probe", "--target", "smollm2-135m"]) == 0
    data = json.loads(capsys.readouterr().out)
    _what_the_app_opens_on(data)
    assert data["weight_bytes"] > 500e6  # SmolLM2-135M in float32, output layer included
    assert data["bandwidth_gbs"] > 0 and data["peak_gflops"] > 0 and data["machine"]
    # Kept only once it broke no physics, saying how it was measured: passes, tries, the load.
    assert physics_problems(data) == [] and data["passes"] == 15 and 1 <= data["tries"] <= 3
    assert set(data["load"]) == {"before", "after", "cores"} and data["load"]["cores"] >= 1
    for n in ("1", "2", "3", "5", "9", "17", "32", "64"):
        row = data[n]
        assert set(row) == {
            *("step_ms", "verify_ratio", "limit_ms", "step_over_limit"),
            *("step_min_ms", "step_max_ms", "spread"),  # each n's passes: fastest, slowest, middle half
        }
        assert row["step_ms"] > 0 and row["limit_ms"] > 0 and row["step_over_limit"] > 0
        assert row["step_min_ms"] <= row["step_ms"] <= row["step_max_ms"] and row["spread"] >= 0
        assert row["verify_ratio"] == pytest.approx(row["step_ms"] / data["1"]["step_ms"], rel=0.01)
    assert data["kernel"]["build"] in ("native", "portable", "none")  # which build ran, and its choices
    if data["kernel"]["build"] != "none":
        assert data["kernel"]["tuning"] in ("measured", "cached", "defaults")
        assert all(isinstance(data["kernel"][name], int) for name in TUNED)
    what_if = data["concurrency"]
    assert what_if["alpha"] == 0.7 and set(what_if["speedup_by_k"]) == {"1", "2", "3", "4", "5", "6"}
    assert set(what_if["speedup_by_k"]["3"]) == {"1", "2", "4", "8", "16", "32", "64"}
    assert "not measured runs" in what_if["predicted_from"]
    # The limit is the larger of streaming the weights and doing the arithmetic.
    assert (
        data["17"]["limit_ms"]
        >= data["1"]["limit_ms"]
        >= data["weight_bytes"] / data["bandwidth_gbs"] / 1e6 * 0.99
    )


def _what_the_app_opens_on(data: dict) -> None:
    """The probe's figures are kept for this machine: Theory's charts and Production's example
    open on them, and another dtype's are not these."""
    ratios = {int(n): data[n]["verify_ratio"] for n in ("1", "2", "3", "5", "9", "17", "32", "64")}
    assert (
        verify_ratios(cached("smollm2-135m")) == ratios and cached("smollm2-135m", dtype="bfloat16") is None
    )
    kept, text = cached_verify("smollm2-135m")
    assert (
        kept == ratios
        and f"**smollm2-135m** ({data['dtype']}, {data['device']}) on {data['measured_at'][:10]}:" in text
        and f"(timed at {data['measured_at'][11:16]} UTC over 15 interleaved passes" in text
    )
    _, text = run_concurrency(0.7, 0.05, 0.0, kept)
    assert "measured on this machine" in text and "not measured on this machine" not in text
    example = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")
    _, best_k, text, _ = production_example(0.0, 0.0, example.to_dict())
    assert "as the probe measured it for smollm2-135m on this machine (measured " in text
    measured = [costmodel.expected_tokens_profile(
        metrics.summary(metrics.snapshot_of([example]))["per_position"], k
    ) / costmodel.verify_ratio_at(ratios, k + 1) for k in range(1, 5)]  # fmt: skip
    assert list(best_k.data[0].y) == pytest.approx(measured)


def test_every_command_prints_its_help():
    """argparse formats help with %: a stray one breaks `--help` of its command only."""
    parser = build_parser()
    commands = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict)).choices
    assert "train-head" in commands
    for name, sub in commands.items():
        assert sub.format_help().startswith("usage:"), name


def test_generate_bench_and_sweep_take_every_run_setting_the_same_way():
    """The flags come from RunConfig's fields: none is missing from a command, none lacks help."""

    assert all(
        f.metadata.get("help") for f in [*fields(RunConfig), *fields(Sampling)] if f.name != "sampling"
    )
    common = ["--target", "t", "--draft", "head", "--max-new-tokens", "9", "--no-chat", "--dtype", "bfloat16"]
    common += ["--temperature", "0.7", "--top-k", "5", "--top-p", "0.9", "--seed", "3"]
    for command, extra in (
        (
            "generate",
            [
                "--prompt",
                "x",
                "--k",
                "6",
                "--policy",
                "heuristic",
                "--confidence",
                "0.2",
                "--tree-nodes",
                "8",
            ],
        ),
        ("bench", ["--prompts", "p.jsonl", "--k", "6", "--policy", "heuristic", "--confidence", "0.2"]),
        ("sweep", ["--prompt", "x", "--k-from", "2", "--k-to", "5"]),
    ):
        cfg = run_config(build_parser().parse_args([command, *extra, *common]))
        assert cfg.sampling == Sampling(0.7, 5, 0.9, 3), command
        assert (cfg.target, cfg.draft, cfg.max_new_tokens, cfg.chat, cfg.dtype) == (
            "t",
            "head",
            9,
            False,
            "bfloat16",
        )
        if command != "sweep":
            assert (cfg.k, cfg.policy, cfg.confidence) == (6, "heuristic", 0.2)
        assert cfg.tree_nodes == (8 if command == "generate" else 0)


def test_sweep_prints_a_table_and_writes_it(tmp_path, capsys, smol):
    prompt = "Repeat exactly: the cat sat on the mat. the cat sat on the mat."
    out = tmp_path / "sweep.csv"
    argv = [
        "sweep",
        "--prompt",
        prompt,
        "--k-from",
        "3",
        "--k-to",
        "2",
        "--max-new-tokens",
        "8",
        "--repeats",
        "2",
    ]
    assert main([*argv, "--csv-out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert ("best k = " in printed or "no clear best k" in printed) and "tokens_per_round" in printed
    table = pd.read_csv(out)
    assert list(table["k"]) == [2, 3] and table["identical_to_baseline"].all()
    assert main(["sweep", "--prompt", prompt, "--k-from", "0", "--k-to", "3"]) == 2
    assert "sweep k values must lie in 1..16" in capsys.readouterr().err
    trees = [
        "sweep",
        "--prompt",
        prompt,
        "--tree-sizes",
        "4, 0",
        "--depth",
        "3",
        "--max-new-tokens",
        "8",
        "--repeats",
        "2",
    ]
    assert main([*trees, "--csv-out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "best N = " in printed or "no clear best N" in printed
    table = pd.read_csv(out)
    assert list(table["nodes"]) == [0, 4] and table["identical_to_baseline"].all()
    assert main(["sweep", "--prompt", prompt, "--tree-sizes", "four"]) == 2
    assert "tree sizes are whole numbers" in capsys.readouterr().err


def test_sweep_over_a_workload_names_the_best_k_per_category(tmp_path, capsys, smol):
    prompts = tmp_path / "work.jsonl"
    rows = [
        {"category": "copy", "prompt": "Repeat exactly: the cat sat on the mat. the cat sat on the mat."},
        {"category": "copy", "prompt": "Repeat exactly: one two three, one two three."},
        {"category": "copy", "prompt": "a third copy prompt, beyond --per-category 2"},
        {"category": "chat", "prompt": "Say hello."},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "workload.csv"
    argv = ["sweep", "--prompts", str(prompts), "--k-from", "1", "--k-to", "2", "--max-new-tokens", "6"]
    assert main([*argv, "--repeats", "1", "--csv-out", str(out)]) == 0
    printed = capsys.readouterr().out
    for category in ("copy", "chat", "all"):
        assert f"{category}: best k = " in printed or f"{category}: no clear best k" in printed
    table = pd.read_csv(out)
    assert list(table["category"]) == ["chat", "chat", "copy", "copy", "all", "all"]
    assert list(table["prompts"]) == [1, 1, 2, 2, 3, 3] and table["identical_to_baseline"].all()
    assert main([*argv, "--categories", "code"]) == 2
    assert "holds no prompts of the categories ['code']" in capsys.readouterr().err
    assert main([*argv, "--tree-sizes", "0,4"]) == 2
    assert "sweep --tree-sizes on one --prompt" in capsys.readouterr().err
