"""Draft sources compared on one prompt: a row each, each against plain runs of its own."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import tiny_model_folder

from decoding import api
from decoding.api import RunConfig
from decoding.errors import SpecLensError
from decoding.runtime import rowlinear
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


def test_a_comparisons_one_time_work_is_done_before_either_measured_run(tmp_path, monkeypatch):
    """The first compared run of a model just loaded: its first calls (here, the row kernel packing
    each layer's weights into panels) all come before the speculative run and the plain run that
    are measured, so neither carries them."""
    if rowlinear.library() is None:
        pytest.skip("no C++ compiler: the row kernel, whose first calls this watches, is not built")
    folder = tiny_model_folder(tmp_path / "fresh", seed=5)  # loaded afresh: nothing has run it yet
    config = RunConfig(
        target=str(folder), prompt="a b c a b c a", chat=False, max_new_tokens=16, baseline=True
    )
    measuring, packed = [False], []

    def pack(weight):
        packed.append(measuring[0])
        return pack_panels(weight)

    def speculative(run, should_stop=None):
        measuring[0] = run.config is config  # the measured run, not a shorter one before it
        yield from iter_speculative(run, should_stop)
        measuring[0] = False

    def plain(run_config, should_stop=None):
        measuring[0] = True
        try:
            return plain_baseline(run_config, should_stop)
        finally:
            measuring[0] = False

    pack_panels, iter_speculative, plain_baseline = (
        rowlinear.pack_panels,
        api.iter_speculative,
        api.plain_baseline,
    )
    monkeypatch.setattr(rowlinear, "pack_panels", pack)
    monkeypatch.setattr(api, "iter_speculative", speculative)
    monkeypatch.setattr(api, "plain_baseline", plain)
    trace = api.generate(config)
    assert trace.baseline is not None and trace.totals.identical_to_baseline
    assert packed and not any(packed), f"{packed.count(True)} of {len(packed)} packed while measured"
