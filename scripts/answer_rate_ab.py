"""Side by side on one machine: the head's answer stage on the batched path against Hugging Face's
padded `generate`, which the stage used before.

The same training prompts (`specbench_train.jsonl`, never the dev set), greedy, the same number of new
tokens, in batches of the same size, shortest prompts first (as the stage orders them), in turns:

- `hf-bf16`: `generate` over left-padded batches in bfloat16 (the stage's former setting);
- `hf-f32`: the same in float32;
- `batched`: `train_head.answer_batch`, SpecLens's batched path in the default CPU mode (float32,
  the layer kernel).

Answers/s and answer tokens/s, each way's total over its turns. Run from the repository root:
`.venv/bin/python -m scripts.answer_rate_ab [--prompts 64 --batch 32 --tokens 128 --turns 1]`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from decoding.models.loading import load_model
from decoding.models.text import chat_text, eos_ids
from decoding.settings.sampling import Sampling
from decoding.tools.bench import machine
from decoding.tools.train_head import answer_batch

TRAIN = Path(__file__).resolve().parents[2] / "shared" / "data" / "specbench_train.jsonl"


def hf_answers(model, prompts: list[str], tokens: int) -> list[list[int]]:
    """Hugging Face's `generate` over the prompts left-padded, greedy; each answer up to its EOS."""
    tok = model.tokenizer
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    texts = [chat_text(tok, p) for p in prompts]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids = model.model.generate(**enc, max_new_tokens=tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    stops = eos_ids(model.model, tok)
    out = []
    for row in ids[:, enc.input_ids.shape[1] :].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        out.append(row[:end])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--train", type=Path, default=TRAIN)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.train.read_text().splitlines() if line.strip()]
    prompts = sorted((r["prompt"] for r in rows), key=len)[: args.prompts]
    f32, bf16 = load_model("smollm2-135m"), load_model("smollm2-135m", dtype="bfloat16")
    ways = {
        "hf-bf16": lambda batch: hf_answers(bf16, batch, args.tokens),
        "hf-f32": lambda batch: hf_answers(f32, batch, args.tokens),
        "batched": lambda batch: [a for _, a in answer_batch(f32, batch, args.tokens, Sampling())],
    }
    totals = {name: [0, 0, 0.0] for name in ways}  # answers, tokens, seconds
    with torch.inference_mode():
        for way in ways.values():  # first calls: kernel panels, buffers
            way(prompts[:2])
        for _ in range(args.turns):
            for name, way in ways.items():
                for b in range(0, len(prompts), args.batch):
                    t = time.perf_counter()
                    answers = way(prompts[b : b + args.batch])
                    totals[name][2] += time.perf_counter() - t
                    totals[name][0] += len(answers)
                    totals[name][1] += sum(len(a) for a in answers)
    print(f"{machine()}: {len(prompts)} prompts, batches of {args.batch}, {args.tokens} new tokens, greedy")
    for name, (answers, tokens, seconds) in totals.items():
        print(
            f"{name:8s} {answers / seconds:6.2f} answers/s  {tokens / seconds:7.1f} answer tokens/s  ({seconds:.1f} s)"
        )


if __name__ == "__main__":
    main()
