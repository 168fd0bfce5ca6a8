"""How much of what the target writes a head's draft vocabulary can propose.

    .venv/bin/python -m scripts.vocab_coverage --training FILE [--out benchmarks/cpu-head-vocab]

Decodes the dev prompts (2 per category, 128 tokens, greedy) with the target alone, and counts the
share of the tokens it wrote that lie inside: the shipped head's draft vocabulary, and the 8k and
16k tokens most frequent in the assistant turns of a training file (chosen as `train-head` chooses
them). An EAGLE-3 head can propose only tokens of its vocabulary; below 95% a larger one is due.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from pathlib import Path

import torch

from decoding.api import RunConfig, plain_baseline
from decoding.drafts.head import load_head, shipped_head
from decoding.models.loading import load_model
from decoding.tools.bench import machine
from decoding.tools.prompts import read_prompts
from decoding.tools.train_head import draft_vocabulary
from decoding.tools.training_data import read_training_rows

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT / "assets" / "prompts" / "specbench_dev.jsonl"
SIZES = (8192, 16384)


def answer_counts(tokenizer, training: Path) -> list[dict]:
    """The training file's assistant turns as `draft_vocabulary` reads sequences."""
    answers = [
        m["content"]
        for row in read_training_rows(training)
        for m in row.get("messages", [])
        if m["role"] == "assistant"
    ]
    ids = tokenizer(answers, add_special_tokens=False)["input_ids"]
    return [
        {"ids": torch.tensor(x), "answer": torch.ones(len(x), dtype=torch.bool), "variant": 0}
        for x in ids
        if x
    ]


def written_tokens(target: str, tokens: int) -> dict[str, list[int]]:
    """The target's greedy tokens for the dev prompts, by category."""
    out: dict[str, list[int]] = {}
    for row in read_prompts(DEV, 2):
        run = plain_baseline(RunConfig(target=target, prompt=row["prompt"], max_new_tokens=tokens))
        out.setdefault(row["category"], []).extend(run.token_ids)
    return out


def coverage(vocab: torch.Tensor, written: dict[str, list[int]]) -> dict[str, float]:
    inside = torch.zeros(int(vocab.max()) + 1, dtype=torch.bool)
    inside[vocab] = True

    def share(ids: list[int]) -> float:
        return sum(i < len(inside) and bool(inside[i]) for i in ids) / max(len(ids), 1)

    every = [t for ids in written.values() for t in ids]
    return {category: round(share(ids), 4) for category, ids in written.items()} | {
        "all": round(share(every), 4)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--training", type=Path, required=True, help="a train-head file with conversations")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "cpu-head-vocab")
    args = parser.parse_args()
    target = load_model(args.target)
    written = written_tokens(args.target, args.tokens)
    head = load_head(shipped_head(args.target), target.model, torch.device("cpu"), torch.float32)
    data = answer_counts(target.tokenizer, args.training)
    vocabularies = {f"shipped head ({len(head.draft_ids)})": head.draft_ids}
    for size in SIZES:
        vocabularies[f"{args.training.name}, top {size}"] = draft_vocabulary(data, target.vocab_size, size)[0]
    table = {name: coverage(vocab, written) for name, vocab in vocabularies.items()}
    result = {
        "command": f"python -m scripts.vocab_coverage --training {args.training.name} --tokens {args.tokens}",
        "machine": machine(),
        "date": _dt.date.today().isoformat(),
        "target": args.target,
        "tokens_written": {c: len(ids) for c, ids in written.items()},
        "coverage": table,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
