"""A smoke run of the benchmark, so the command never rots (the full run is not part of CI)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import PROMPTS

from decoding import api
from decoding.api import RunConfig
from decoding.drafts.suffix import SuffixCorpus
from decoding.errors import SpecLensError
from decoding.tools.bench import CSV_COLUMNS, run_prompt
from decoding.tools.cli import main
from decoding.tools.prompts import read_prompts

pytestmark = pytest.mark.slow


@pytest.fixture
def two_prompts(tmp_path):
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    short = [
        next(r for r in rows if r["category"] == c and len(r["prompt"]) < 400) for c in ("qa", "translation")
    ]
    path = tmp_path / "two.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in short))
    return path


@pytest.mark.parametrize("draft", ["ngram", "layers:20"])
def test_bench_smoke(tmp_path, two_prompts, capsys, smol, draft):
    out = tmp_path / "out"
    code = main(
        [
            "bench",
            "--prompts",
            str(two_prompts),
            "--draft",
            draft,
            "--k",
            "3",
            "--max-new-tokens",
            "6",
            "--limit",
            "1",
            "--out",
            str(out),
            "--no-warmup",
        ]
    )
    assert code == 0, capsys.readouterr().err
    df = pd.read_csv(out / "results.csv")
    assert list(df.columns) == CSV_COLUMNS and len(df) == 2
    assert df["identical_plain"].all() and df["identical_hf"].all()
    assert (df["tps_speclens"] > 0).all() and (df["tps_hf"] > 0).all()
    summary = (out / "summary.md").read_text()
    assert "| all | 2 |" in summary and "python -m decoding bench" in summary
    meta = json.loads((out / "meta.json").read_text())
    assert meta["verify_cost_ratio"]["1"] == 1.0


def test_bench_runs_a_tree_beside_its_chain(tmp_path, two_prompts, capsys, smol):
    out = tmp_path / "out"
    args = ["bench", "--prompts", str(two_prompts), "--draft", "head", "--k", "3", "--tree-nodes", "6"]
    args += ["--max-new-tokens", "8", "--limit", "1", "--out", str(out), "--no-warmup"]
    assert main(args) == 0, capsys.readouterr().err
    df = pd.read_csv(out / "results.csv")
    assert df["identical_plain"].all() and df["tps_hf"].isna().all()  # HF has no trees
    assert (df["tps_chain"] > 0).all() and (df["tree_vs_chain"] > 0).all()
    summary = (out / "summary.md").read_text()
    assert "tree vs chain" in summary and "trees of 6 nodes (branch 2)" in summary
    meta = json.loads((out / "meta.json").read_text())
    assert "7" in meta["verify_cost_vs_plain_step"]  # the tree's pass: 6 nodes and the last verified token


def test_drafts_hugging_face_lacks_get_no_hf_column(tmp_path, two_prompts, capsys, smol):
    # Its generate() would quietly decode without a draft: a plain run timed as if it drafted.
    out = tmp_path / "out"
    args = ["bench", "--prompts", str(two_prompts), "--draft", "suffix", "--k", "3"]
    assert main([*args, "--max-new-tokens", "6", "--limit", "1", "--out", str(out), "--no-warmup"]) == 0
    df = pd.read_csv(out / "results.csv")
    assert df["identical_plain"].all() and df["tps_hf"].isna().all() and df["ratio_vs_hf"].isna().all()
    assert "Hugging Face has no suffix drafting: its column is empty." in (out / "summary.md").read_text()


def test_bad_prompt_files(tmp_path):
    with pytest.raises(SpecLensError, match="no prompts file"):
        read_prompts(tmp_path / "missing.jsonl", 1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "no category"}\n')
    with pytest.raises(SpecLensError, match="bad.jsonl:1"):
        read_prompts(bad, 1)


def test_the_reruns_of_a_suffix_bench_draft_from_what_the_first_run_saw(smol):
    # Otherwise the untraced rerun drafts the first run's output back, and "tracing overhead"
    # measures suffix decoding's memory instead.
    run = api.prepare(RunConfig(prompt="Name three colours.", draft="suffix", k=4, max_new_tokens=12))
    run.draft.corpus = SuffixCorpus()
    row = run_prompt(run)
    assert len(run.draft.corpus.snapshot()) == 1  # the first run alone
    assert row["new_tokens"] == 12
