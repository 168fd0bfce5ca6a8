"""promote-head: a new head against the shipped one in one run, the shipped one replaced only when beaten."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_heads import random_head, trained_tiny  # noqa: F401 - trained_tiny is a fixture

from decoding.api import RunConfig
from decoding.drafts.head import load_head, save_head
from decoding.errors import SpecLensError
from decoding.models.loading import load_model
from decoding.tools.cli import main
from decoding.tools.promote_head import HeadScore, PromoteConfig, beats, install_head, promote_head

LETTERS = "abcdefghijklmnopqrstuvwxyz"


@pytest.fixture(scope="module")
def heads(trained_tiny, tmp_path_factory):  # noqa: F811 - the fixture imported above
    """The tiny target, its trained head, an untrained head for it over the same vocabulary, and
    measurement prompts in two categories."""
    folder, trained, _, _ = trained_tiny
    root = tmp_path_factory.mktemp("promote")
    target = load_model(str(folder), "cpu", "float32")
    draft_ids = load_head(trained, target.model, torch.device("cpu"), torch.float32).draft_ids.tolist()
    untrained = root / "untrained"
    save_head(random_head(target.model, draft_ids, seed=3), untrained, {})
    prompts = root / "dev.jsonl"
    rows = [
        {
            "category": c,
            "question_id": i,
            "prompt": " ".join(LETTERS[(i * 5 + j * 3 + n) % 26] for j in range(7)),
        }
        for n, c in enumerate(("one", "two"))
        for i in range(2)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder, trained, untrained, prompts


def config(heads, candidate, shipped, install=False) -> PromoteConfig:
    folder, _, _, prompts = heads
    run = RunConfig(target=str(folder), draft="head", k=3, max_new_tokens=24)
    return PromoteConfig(candidate, prompts, run, shipped, limit=2, install=install)


def files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_the_trained_head_drafts_more_and_replaces_the_untrained_one_only_when_it_wins_and_is_asked(
    heads, tmp_path
):
    _, trained, untrained, _ = heads
    shipped = tmp_path / "shipped"
    shutil.copytree(untrained, shipped)
    lines = []
    verdict = promote_head(config(heads, trained, shipped), lines.append)
    assert len(lines) == 4 and lines[0].startswith("[1/4] shipped ×")  # one line a prompt
    assert verdict.candidate.tokens_per_round > verdict.shipped.tokens_per_round + 0.3
    assert verdict.candidate.identical and verdict.shipped.identical
    # The speedups are timings of tiny models on a shared machine: which wins is measured, not known.
    assert verdict.promoted == (verdict.candidate.speedup > verdict.shipped.speedup)
    assert not verdict.installed and files(shipped) == files(untrained)  # not without --install
    verdict = promote_head(config(heads, trained, shipped, install=True), lines.append)
    assert verdict.installed == verdict.promoted
    assert files(shipped) == files(trained if verdict.installed else untrained)


def test_installing_swaps_the_whole_folder_and_leaves_nothing_staged(heads, tmp_path):
    _, trained, untrained, _ = heads
    shipped = tmp_path / "shipped"
    shutil.copytree(untrained, shipped)
    (shipped / "stale.txt").write_text("a file the new head does not have")
    install_head(trained, shipped)
    assert files(shipped) == files(trained)
    assert [p.name for p in tmp_path.iterdir()] == ["shipped"]


def test_a_head_does_not_beat_itself_and_an_untrained_one_does_not_replace_the_trained(heads, tmp_path):
    _, trained, untrained, _ = heads
    shipped = tmp_path / "shipped"
    shutil.copytree(trained, shipped)
    same = promote_head(config(heads, trained, shipped, install=True), lambda _: None)
    assert same.candidate.tokens_per_round == same.shipped.tokens_per_round
    assert not same.promoted and "tokens a round" in same.reason and not same.installed
    worse = promote_head(config(heads, untrained, shipped, install=True), lambda _: None)
    assert not worse.promoted and not worse.installed and files(shipped) == files(trained)


def test_a_head_that_changes_the_output_never_beats_one_that_does_not():
    better = HeadScore(3.0, 2.0, identical=False)
    promoted, reason = beats(better, HeadScore(1.5, 1.1, identical=True))
    assert not promoted and "not lossless" in reason
    promoted, reason = beats(HeadScore(2.0, 1.0, True), HeadScore(1.5, 1.1, True))
    assert not promoted and reason.startswith("the candidate does not beat the shipped head on speedup")


def test_a_head_file_too_large_for_git_is_refused_before_anything_changes(heads, tmp_path):
    _, trained, untrained, _ = heads
    candidate, shipped = tmp_path / "candidate", tmp_path / "shipped"
    shutil.copytree(trained, candidate)
    shutil.copytree(untrained, shipped)
    with (candidate / "model-00001-of-00001.safetensors").open("r+b") as f:
        f.truncate(10 * 2**20)  # sparse: a 10 MB file on no disk space
    with pytest.raises(SpecLensError, match="under 10 MB"):
        install_head(candidate, shipped)
    assert files(shipped) == files(untrained)


def test_promote_head_on_the_command_line(heads, tmp_path, capsys):
    folder, trained, untrained, prompts = heads
    shipped = tmp_path / "shipped"
    shutil.copytree(untrained, shipped)
    argv = ["promote-head", str(trained), "--target", str(folder), "--prompts", str(prompts)]
    argv += ["--max-new-tokens", "16", "--shipped", str(shipped)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "candidate " in out and "not installed (--install replaces the shipped head)" in out
    assert (
        main(["promote-head", str(tmp_path / "nothing"), "--target", str(folder), "--shipped", str(shipped)])
        == 2
    )
    assert capsys.readouterr().err.startswith("error: no head in")
    assert main(["promote-head", str(trained), "--target", str(folder)]) == 2
    assert "name the head to beat with --shipped" in capsys.readouterr().err
