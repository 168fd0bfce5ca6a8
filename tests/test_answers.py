"""The target's answers kept as data: append-only shards with a manifest, resumed by prompt hash,
refused when of other weights or damaged, and read by train-head, with the tiny test target."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from conftest import ROOT, tiny_model_folder

from decoding.drafts.head import fingerprint
from decoding.errors import SpecLensError
from decoding.models.loading import load_model
from decoding.tools.answers import (
    MANIFEST,
    SOURCES,
    AnswerStore,
    ShardWriter,
    file_sha256,
    prompt_hash,
    shard_records,
)
from decoding.tools.cli import main
from decoding.tools.train_head import TrainConfig, answer_prompts, prompt_rows

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def word_prompt(i: int) -> str:
    """Prompt number i (below 26³) in the tiny tokenizer's words, of 3 to 6 words."""
    words = [LETTERS[(i // 26**k) % 26] for k in range(3)] + [
        LETTERS[(i * 7 + j * 3) % 26] for j in range(i % 4)
    ]
    return " ".join(words)


def prompts_file(path: Path, n: int, start: int = 0) -> Path:
    """Prompts `start` to `start + n` as a training file, every third one naming its source."""
    rows = [
        {"prompt": word_prompt(i)} | ({"source": "sharegpt"} if i % 3 == 0 else {})
        for i in range(start, start + n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tiny_model_folder(tmp_path_factory.mktemp("answers") / "tiny", seed=5)
    return folder, load_model(str(folder), "cpu", "float32")


CFG = TrainConfig(answer_tokens=12, batch_size=4)


def shard_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("answers-*.jsonl.gz"))}


def test_answers_go_to_shards_closed_at_their_answer_limit_with_a_manifest(tiny, tmp_path):
    _, target = tiny
    rows = prompt_rows(prompts_file(tmp_path / "train.jsonl", 12), 0)
    store = AnswerStore(tmp_path / "answers", shard_answers=5)
    done = answer_prompts(target, rows, CFG, store)
    assert done["answers"] == 12 and done["answer_tokens"] > 12
    manifest = json.loads((store.folder / MANIFEST).read_text())
    assert [s["file"] for s in manifest["shards"]] == [f"answers-0000{i}.jsonl.gz" for i in range(3)]
    assert [s["answers"] for s in manifest["shards"]] == [5, 5, 2]
    records = []
    for shard in manifest["shards"]:
        path = store.folder / shard["file"]
        assert shard["sha256"] == file_sha256(path) and shard["bytes"] == path.stat().st_size
        held = shard_records(path)
        assert shard["answer_tokens"] == sum(len(r["answer"]) for r in held)
        assert shard["prompt_tokens"] == sum(r["prompt_tokens"] for r in held) > 0
        assert shard["fingerprint"] == fingerprint(target.model) and shard["seconds"] > 0
        assert shard["decoding"] == {
            "path": "batched (decoding/core/batch.py)",
            "greedy": True,
            "sampled_per_prompt": 0,
            "max_new_tokens": 12,
            "dtype": "float32",
        }
        assert shard["prompts"] == {
            source: sorted(r["hash"] for r in held if r["source"] == source)
            for source in {r["source"] for r in held}
        }
        records += held
    assert sorted(r["prompt"] for r in records) == sorted(r["prompt"] for r in rows)
    assert all(r["hash"] == prompt_hash(r["prompt"]) and r["variant"] == 0 for r in records)
    assert {r["source"] for r in records} == {"sharegpt", "train"}  # a row without one: the file's name
    assert manifest["sources"] == {
        "sharegpt": SOURCES["sharegpt"],
        "train": {"origin": "train", "licence": "not recorded"},
    }
    assert manifest["totals"] == {
        "answers": 12,
        "shards": 3,
        "bytes": sum(s["bytes"] for s in manifest["shards"]),
    } | {key: sum(s[key] for s in manifest["shards"]) for key in ("prompt_tokens", "answer_tokens")}
    assert "open" not in manifest and not list(store.folder.glob("*.part"))
    # The answers are the target's greedy ones: the same prompt answered alone gives the same tokens.
    alone = AnswerStore(tmp_path / "alone")
    answer_prompts(target, [r for r in rows if r["hash"] == records[7]["hash"]], CFG, alone)
    assert shard_records(alone.folder / "answers-00000.jsonl.gz")[0]["answer"] == records[7]["answer"]


def test_a_shard_past_its_size_is_closed_and_the_next_batch_opens_a_new_one(tiny, tmp_path):
    _, target = tiny
    rows = prompt_rows(prompts_file(tmp_path / "train.jsonl", 7), 0)
    store = AnswerStore(tmp_path / "answers", shard_bytes=1)
    answer_prompts(target, rows, TrainConfig(answer_tokens=12, batch_size=3), store)
    assert [s["answers"] for s in store.manifest()["shards"]] == [3, 3, 1]


def test_shards_are_append_only_and_a_resumed_stage_answers_only_new_prompts(tiny, tmp_path):
    _, target = tiny
    store = AnswerStore(tmp_path / "answers", shard_answers=4)
    first = prompt_rows(prompts_file(tmp_path / "first.jsonl", 6), 0)
    assert answer_prompts(target, first, CFG, store)["answers"] == 6
    before = shard_bytes(store.folder)
    rows = prompt_rows(prompts_file(tmp_path / "all.jsonl", 10), 0)  # the first 6 and 4 more
    assert answer_prompts(target, rows, CFG, store)["answers"] == 4
    after = shard_bytes(store.folder)
    assert {name: after[name] for name in before} == before  # not a byte of a closed shard changed
    new = [r for name in sorted(set(after) - set(before)) for r in shard_records(store.folder / name)]
    assert sorted(r["prompt"] for r in new) == sorted(r["prompt"] for r in rows[6:])
    assert answer_prompts(target, rows, CFG, store)["answers"] == 0
    assert shard_bytes(store.folder) == after  # nothing to answer: no shard at all


def test_sampled_answers_come_after_every_greedy_one_and_are_answered_once(tiny, tmp_path):
    _, target = tiny
    store = AnswerStore(tmp_path / "answers")
    rows = prompt_rows(prompts_file(tmp_path / "train.jsonl", 8), 0)
    answer_prompts(target, rows[:5], CFG, store)  # greedy answers to the first five
    sampled = TrainConfig(answer_tokens=12, batch_size=4, sampled=1)
    assert answer_prompts(target, rows, sampled, store)["answers"] == 3 + 8
    second = store.manifest()["shards"][1]
    assert second["decoding"]["sampled_per_prompt"] == 1
    new = shard_records(store.folder / second["file"])
    assert [r["variant"] for r in new] == [0] * 3 + [1] * 8  # the greedy ones first
    greedy = {r["hash"]: r["answer"] for r in store.read(fingerprint(target.model)) if r["variant"] == 0}
    drawn = {r["hash"]: r["answer"] for r in new if r["variant"] == 1}
    assert greedy.keys() == drawn.keys() == {r["hash"] for r in rows}
    assert sum(drawn[h] != greedy[h] for h in greedy) >= 4  # drawn at temperature 0.7, not the argmax
    assert answer_prompts(target, rows, sampled, store)["answers"] == 0


def test_no_shard_opens_past_the_total_size(tiny, tmp_path, capsys):
    _, target = tiny
    rows = prompt_rows(prompts_file(tmp_path / "train.jsonl", 12), 0)
    store = AnswerStore(tmp_path / "answers", shard_answers=2, shard_bytes=10_000, total_bytes=12_500)
    done = answer_prompts(target, rows, CFG, store)
    assert done["answers"] == 2 == store.manifest()["totals"]["answers"]  # a second shard could pass it
    assert "no new shard fits in 12,500 bytes" in capsys.readouterr().out


def test_shards_of_other_weights_are_refused_in_one_line(tiny, tmp_path, capsys):
    folder, target = tiny
    store = AnswerStore(tmp_path / "answers")
    answer_prompts(target, prompt_rows(prompts_file(tmp_path / "train.jsonl", 3), 0), CFG, store)
    other = tiny_model_folder(tmp_path / "other", seed=6)
    argv = [
        "train-head",
        "--target",
        str(other),
        "--prompts",
        str(tmp_path / "train.jsonl"),
        "--answers-only",
    ]
    capsys.readouterr()
    assert main([*argv, "--answers", str(store.folder), "--work", str(tmp_path / "work")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "answers-00000.jsonl.gz: answers of weights fingerprint" in err, err
    assert fingerprint(target.model) in err


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _garbage_listed_as_is(path: Path) -> None:
    """Bytes that are no gzip, with the manifest's sha256 made to match: unreadable, not altered."""
    path.write_bytes(b"not a shard at all")
    manifest_path = path.parent / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["shards"][0]["sha256"] = file_sha256(path)
    manifest_path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (_flip_a_byte, "its sha256 is not the manifest's"),
        (_garbage_listed_as_is, "not a readable answers shard"),
        (Path.unlink, "listed in the manifest but missing"),
    ],
)
def test_a_damaged_shard_is_refused_in_one_line(tiny, tmp_path, damage, said):
    _, target = tiny
    store = AnswerStore(tmp_path / "answers")
    answer_prompts(target, prompt_rows(prompts_file(tmp_path / "train.jsonl", 3), 0), CFG, store)
    damage(store.folder / "answers-00000.jsonl.gz")
    with pytest.raises(SpecLensError, match=said) as refused:
        store.read(fingerprint(target.model))
    assert "\n" not in str(refused.value)


def test_a_shard_left_open_by_a_killed_run_is_closed_with_its_whole_lines(tiny, tmp_path):
    """A run killed outright leaves `NAME.part` with its flushed batches and maybe half a line; the
    next stage closes it as a shard of that run's own weights and settings, then goes on."""
    _, target = tiny
    store = AnswerStore(tmp_path / "answers")
    rows = prompt_rows(prompts_file(tmp_path / "train.jsonl", 6), 0)
    records = [
        {
            "hash": r["hash"],
            "source": r["source"],
            "prompt": r["prompt"],
            "prompt_tokens": 1,
            "variant": 0,
            "answer": [2],
        }
        for r in rows[:2]
    ]
    store.folder.mkdir()
    killed = ShardWriter(store, "tiny", "an-older-mark", {"greedy": True}, "a machine")
    assert killed.add(records, 1.0) == 2  # flushed after the batch
    killed.gz.write(b'{"hash":"the next batch, cut off where')  # and the process is gone: no close
    killed.gz.flush(zlib.Z_SYNC_FLUSH)
    assert answer_prompts(target, rows, CFG, store)["answers"] == 6  # the older mark's answers do not count
    first, second = store.manifest()["shards"]
    assert (first["fingerprint"], first["answers"], first["machine"]) == ("an-older-mark", 2, "a machine")
    assert first["seconds"] is None and second["seconds"] > 0  # the killed run's time was never written
    assert shard_records(store.folder / first["file"]) == records
    assert second["fingerprint"] == fingerprint(target.model) and second["answers"] == 6
    assert not list(store.folder.glob("*.part")) and "open" not in store.manifest()


def test_a_stage_stopped_by_sigterm_closes_its_shard_and_the_next_run_resumes(tiny, tmp_path):
    folder, target = tiny
    prompts = prompts_file(tmp_path / "train.jsonl", 3000)
    answers = tmp_path / "answers"
    argv = ["train-head", "--target", str(folder), "--prompts", str(prompts), "--answers-only"]
    argv += [
        "--answers",
        str(answers),
        "--work",
        str(tmp_path / "work"),
        "--batch-size",
        "2",
        "--answer-tokens",
        "16",
    ]
    run = subprocess.Popen([sys.executable, "-m", "decoding", *argv], cwd=ROOT, stderr=subprocess.DEVNULL)
    part = answers / "answers-00000.jsonl.gz.part"
    deadline = time.monotonic() + 120
    while not (part.exists() and part.stat().st_size > 200) and time.monotonic() < deadline:
        time.sleep(0.05)
    run.terminate()
    assert run.wait(timeout=60) == 143
    store = AnswerStore(answers)
    (shard,) = store.manifest()["shards"]
    assert 0 < shard["answers"] < 3000 and "open" not in store.manifest() and not part.exists()
    with gzip.open(answers / shard["file"], "rt") as f:  # a whole gzip file, as any reader takes it
        assert len(f.read().splitlines()) == shard["answers"]
    rows = prompt_rows(prompts, 0)
    answered = {r["hash"] for r in store.read(fingerprint(target.model))}
    assert answer_prompts(target, rows[:40], CFG, store)["answers"] == len(
        {r["hash"] for r in rows[:40]} - answered
    )


def test_train_head_trains_on_every_shard_and_adds_a_shard_for_new_prompts(tiny, tmp_path):
    folder, target = tiny
    store = AnswerStore(tmp_path / "answers")
    answer_prompts(target, prompt_rows(prompts_file(tmp_path / "earlier.jsonl", 10), 0), CFG, store)
    later = prompts_file(tmp_path / "later.jsonl", 4, start=10)
    argv = ["train-head", "--target", str(folder), "--prompts", str(later), "--out", str(tmp_path / "head")]
    argv += ["--answers", str(store.folder), "--work", str(tmp_path / "work"), "--answer-tokens", "12"]
    assert main([*argv, "--epochs", "1", "--draft-vocab", "20", "--holdout", "0", "--steps", "2"]) == 0
    card = json.loads((tmp_path / "head" / "config.json").read_text())["speclens"]
    assert card["sequences_trained"] == 14  # the 10 earlier answers and the 4 new ones
    assert "14 prompts with the target's own answers" in card["data"]
    assert card["answers"] | {"folder": ""} == {"folder": "", **store.manifest()["totals"]}
    assert [s["answers"] for s in store.manifest()["shards"]] == [10, 4]


def test_train_head_without_prompts_trains_on_the_stored_answers_alone(tiny, tmp_path):
    folder, target = tiny
    store = AnswerStore(tmp_path / "answers")
    answer_prompts(target, prompt_rows(prompts_file(tmp_path / "earlier.jsonl", 6), 0), CFG, store)
    before = shard_bytes(store.folder)
    argv = [
        "train-head",
        "--target",
        str(folder),
        "--out",
        str(tmp_path / "head"),
        "--answers",
        str(store.folder),
    ]
    argv += ["--work", str(tmp_path / "work"), "--epochs", "1", "--draft-vocab", "20", "--holdout", "0"]
    assert main([*argv, "--steps", "2"]) == 0
    card = json.loads((tmp_path / "head" / "config.json").read_text())["speclens"]
    assert card["sequences_trained"] == 6
    assert card["data"].startswith("answers: 6 prompts with the target's own answers")
    assert shard_bytes(store.folder) == before  # nothing answered, nothing written


def test_train_head_flags_that_make_no_sense_are_refused_in_one_line(tiny, tmp_path, capsys):
    folder, _ = tiny
    argv = ["train-head", "--target", str(folder), "--prompts", str(prompts_file(tmp_path / "t.jsonl", 2))]
    assert main(argv) == 2
    assert main([*argv, "--answers-only", "--shard-mb", "5"]) == 2
    assert main([*argv, "--answers-only", "--shard-answers", "0"]) == 2
    assert main(["train-head", "--target", str(folder), "--answers-only"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "error: --out is needed unless --answers-only",
        "error: --shard-answers must be at least 1 and --shard-mb within 0..4",
        "error: --shard-answers must be at least 1 and --shard-mb within 0..4",
        "error: --answers-only needs --prompts: the prompts to answer",
    ]
