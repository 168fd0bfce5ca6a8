"""Draft sources compared on one prompt: a row each, each against plain runs of its own."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import tiny_model_folder

from decoding.api import RunConfig
from decoding.errors import SpecLensError
from decoding.tools.cli import main
from decoding.tools.compare import compare, parse_drafts


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_model_folder(tmp_path_factory.mktemp("compare") / "tiny", seed=4)


def test_three_sources_each_get_a_row_and_their_own_plain_runs(folder):
    config = RunConfig(target=str(folder), prompt="a b c a b c a b", chat=False, max_new_tokens=12)
    traces, table = compare(config, ["ngram", "suffix", str(folder)], repeats=2)
    assert list(table["draft"]) == ["ngram", "suffix", folder.name]
    assert (table["repeats"] == 2).all() and table["identical_to_baseline"].all()
    assert len({id(t.baseline) for t in traces}) == 3
    assert (table["speedup_low"] <= table["speedup"]).all() and (
        table["speedup"] <= table["speedup_high"]
    ).all()
    assert table["best"].sum() <= 1


def test_the_command_prints_and_writes_the_table(folder, tmp_path, capsys):
    out = tmp_path / "compare.csv"
    argv = ["compare", "--target", str(folder), "--drafts", "ngram, suffix", "--prompt", "a b c a b c"]
    argv += ["--no-chat", "--max-new-tokens", "8", "--repeats", "1", "--csv-out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "draft_cost" in printed and ("best draft = " in printed or "no clear best draft" in printed)
    assert list(pd.read_csv(out)["draft"]) == ["ngram", "suffix"]
    with pytest.raises(SpecLensError, match="name the draft sources"):
        parse_drafts(" , ")
