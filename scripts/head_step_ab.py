"""Side by side on one machine: the trained head's step through the layer kernel and through its modules.

Three ways to run the same head: the layer kernel reading its float16 weights
as float16 (`kernel`, the default), the layer kernel reading float32 copies
(`kernel-float32`), and the head's own torch modules (`eager`). Two figures,
both against plain target steps measured in the same process:

- `step_ms`: medians of one-row steps after 100 cached rows, interleaved
  (target, then each way in turn): a plain target step (`forward`, one
  token) and a head drafting step (`step_logits`: its layer, norm and
  output layer over one row);
- `c`: the bench's draft cost (`costmodel.draft_ms_per_token` over
  `costmodel.target_ms_per_token`) of greedy k = 3 runs on the first dev
  prompt of each of `--prompts` categories, in turns (plain, then each way),
  medians over prompts and turns.

SmolLM2-135M and its shipped head in the default CPU mode. Run from the
repository root: `.venv/bin/python -m scripts.head_step_ab [--prompts 2 --tokens 64 --turns 2]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from decoding import costmodel
from decoding.api import encode_prompt
from decoding.core.plain import autoregressive_generate
from decoding.core.speculative import speculative_generate
from decoding.drafts import HeadDraft, build_draft
from decoding.drafts.head import HeadCache, HeadKernel
from decoding.models.loading import load_model
from decoding.runtime.forward import crop, forward, new_cache
from decoding.settings.policies import make_policy
from decoding.tools.bench import machine
from decoding.tools.prompts import read_prompts

TARGET = "smollm2-135m"
DEV = Path(__file__).resolve().parents[1] / "assets" / "prompts" / "specbench_dev.jsonl"
CONTEXT = 100


@torch.inference_mode()
def step_times(target, drafts: dict[str, HeadDraft], ids: torch.Tensor, reps: int = 30) -> dict:
    """Median ms of a plain target step and of each draft's one-row head step, after CONTEXT cached rows."""
    model, one = target.model, ids[:, CONTEXT : CONTEXT + 1]
    cache = new_cache(model)
    rows: dict = {}
    any_draft = next(iter(drafts.values()))
    with any_draft.tap.recording(rows):
        forward(model, ids[:, :CONTEXT], cache, keep=1)
    head = any_draft.head
    emb = any_draft.embed(ids[0, 1 : CONTEXT + 1])
    feature = head.fc(any_draft.tap.take(rows))
    caches, outs = {}, {}
    for name, d in drafts.items():
        caches[name] = HeadCache()
        outs[name] = d.stepper.step_logits(emb, feature, caches[name])[0][-1:]
    times: dict[str, list[float]] = {"target": [], **{name: [] for name in drafts}}
    for _ in range(reps):
        start = time.perf_counter()
        forward(model, one, cache, keep=1)
        times["target"].append(time.perf_counter() - start)
        crop(cache, CONTEXT)
        for name, d in drafts.items():
            start = time.perf_counter()
            d.stepper.step_logits(emb[-1:], outs[name], caches[name])
            times[name].append(time.perf_counter() - start)
            caches[name].crop(CONTEXT)
    return {name: round(statistics.median(t[3:]) * 1e3, 2) for name, t in times.items()}


def draft_costs(
    target, drafts: dict[str, HeadDraft], prompts: list[torch.Tensor], tokens: int, turns: int
) -> dict:
    """The bench's c of each draft, per prompt and turn, with its plain run just before."""
    costs: dict[str, list[float]] = {name: [] for name in drafts}
    for _ in range(turns):
        for ids in prompts:
            plain = autoregressive_generate(target.model, ids, max_new_tokens=tokens)
            t_target = costmodel.target_ms_per_token(plain.token_times_s)
            for name, d in drafts.items():
                trace = speculative_generate(
                    target.model, ids, d, make_policy("fixed", 3), max_new_tokens=tokens
                )
                costs[name].append(costmodel.draft_ms_per_token(trace) / t_target)
    return {
        name: {"median": round(statistics.median(c), 3), "runs": [round(x, 3) for x in c]}
        for name, c in costs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2, help="dev categories, the first prompt of each")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--turns", type=int, default=2)
    args = parser.parse_args()
    target = load_model(TARGET, "cpu")
    kernel = build_draft("head", target)
    assert isinstance(kernel.stepper, HeadKernel), "the default CPU mode is not in use here"
    assert kernel.stepper.half, "the shipped head is not float16 here"
    float32 = HeadDraft(kernel.head, target.model, "head", kernel=False)
    float32.stepper = HeadKernel(kernel.head, half=False)
    drafts = {
        "kernel": kernel,
        "kernel-float32": float32,
        "eager": HeadDraft(kernel.head, target.model, "head", kernel=False),
    }
    rows = [encode_prompt(target, r["prompt"], chat=True) for r in read_prompts(DEV, limit=1)[: args.prompts]]
    long_ids = torch.cat([rows[0]] * (CONTEXT // rows[0].shape[1] + 2), dim=1)
    steps = step_times(target, drafts, long_ids)
    result = {
        "machine": machine(),
        "step_ms": steps,
        "step_c": {name: round(steps[name] / steps["target"], 3) for name in drafts},
        "c": draft_costs(target, drafts, rows, args.tokens, args.turns),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
