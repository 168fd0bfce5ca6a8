"""The adaptive draft length against the best fixed k of each category, on the dev prompts.

For each draft (n-gram, the trained head): a workload sweep of fixed k, then the same prompts under
the entropy policy with k as its cap, every run against a plain run of its own (decoding/tools/
workload.py). Per category, the entropy policy's speedup over the best fixed k's. Writes
benchmarks/cpu-adaptive/{summary.md, DRAFT-fixed.csv, DRAFT-entropy.csv, meta.json}.

    .venv/bin/python -m scripts.bench_adaptive [--repeats 1] [--threshold 0.4]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import pandas as pd

from decoding.api import RunConfig
from decoding.tools.bench import machine
from decoding.tools.prompts import read_prompts
from decoding.tools.workload import workload_sweep

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "cpu-adaptive"
DEV = ROOT / "assets" / "prompts" / "specbench_dev.jsonl"
DRAFTS = {"ngram": range(1, 7), "head": range(1, 6)}  # fixed k swept; the policy's cap is the largest


def measure(draft: str, ks: range, threshold: float, repeats: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    prompts = read_prompts(DEV, 2)
    fixed = RunConfig(draft=draft, max_new_tokens=128)
    adaptive = RunConfig(draft=draft, max_new_tokens=128, policy="entropy", confidence=threshold)

    def progress(done: int, total: int) -> None:  # called before each run, then once at the end
        if done < total:
            print(f"{draft}: run {done + 1} of {total}", flush=True)

    fixed_table, _ = workload_sweep(fixed, prompts, list(ks), progress, repeats=repeats)
    adaptive_table, _ = workload_sweep(adaptive, prompts, [ks[-1]], progress, repeats=repeats)
    return fixed_table, adaptive_table


def compare(draft: str, fixed: pd.DataFrame, adaptive: pd.DataFrame) -> list[str]:
    """A row per category: the best fixed k and its speedup, the policy's, and the gain."""
    lines = []
    for category, part in fixed.groupby("category", sort=False):
        top = part.loc[part["speedup"].idxmax()]
        mine = adaptive[adaptive["category"] == category].iloc[0]
        gain = mine["speedup"] / top["speedup"] - 1
        lines.append(
            f"| {draft} | {category} | {int(top['k'])} | ×{top['speedup']:.2f} | ×{mine['speedup']:.2f} "
            f"| {mine['tokens_per_round']:.2f} | {gain:+.1%} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threshold", type=float, default=0.4)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for draft, ks in DRAFTS.items():
        fixed, adaptive = measure(draft, ks, args.threshold, args.repeats)
        fixed.to_csv(OUT / f"{draft}-fixed.csv", index=False)
        adaptive.to_csv(OUT / f"{draft}-entropy.csv", index=False)
        rows += compare(draft, fixed, adaptive)
    meta = {"machine": machine(), "date": dt.date.today().isoformat(), "repeats": args.repeats,
            "threshold": args.threshold, "command": f"python -m scripts.bench_adaptive --repeats {args.repeats} "
            f"--threshold {args.threshold}"}  # fmt: skip
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1))
    table = [
        "| draft | category | best fixed k | its speedup | entropy policy | its tokens/round | gain |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]
    (OUT / "summary.md").write_text(
        f"The entropy policy (AdaEDL's bound 1 − √H, threshold {args.threshold}, k capped at the sweep's "
        f"largest) against the best fixed k of each category: dev prompts, 2 per category, 128 new tokens, "
        f"greedy; a category's speedup is its prompts' plain time over their speculative time, "
        f"{args.repeats} repeat(s), each run against a plain run of its own. "
        f"{meta['machine']}, {meta['date']}; `{meta['command']}`.\n\n" + "\n".join(table) + "\n"
    )
    print((OUT / "summary.md").read_text())


if __name__ == "__main__":
    main()
