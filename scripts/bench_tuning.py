"""The kernel's measured choices against its defaults: the probe, run in turns with each.

Runs `python -m decoding probe --target smollm2-135m` with the choices this
machine's first use measured (runtime/tuning.py) and with SPECLENS_KERNEL_TUNE=0
(the defaults), in turns, and writes the median step ÷ machine limit and
V(n)/V(1) of each to benchmarks/cpu-kernel-tuning/{summary.md, results.csv, meta.json}.

    .venv/bin/python -m scripts.bench_tuning [--turns 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from decoding.runtime.tuning import DEFAULTS, TUNED
from decoding.tools.bench import machine

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "cpu-kernel-tuning"
SIZES = ("1", "2", "3", "5", "9", "17")
COMMAND = [sys.executable, "-m", "decoding", "probe", "--target", "smollm2-135m"]


def probe(tuned: bool) -> dict:
    env = os.environ | {"SPECLENS_KERNEL_TUNE": "1" if tuned else "0"}
    done = subprocess.run(COMMAND, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def rows(report: dict, setting: str, turn: int) -> list[dict]:
    return [
        {
            "setting": setting,
            "turn": turn,
            "n": int(n),
            "step_ms": report[n]["step_ms"],
            "step_over_limit": report[n]["step_over_limit"],
            "verify_ratio": report[n]["verify_ratio"],
        }
        for n in SIZES
    ]


def summary(table: pd.DataFrame, choices: dict, command: str) -> str:
    medians = table.groupby(["setting", "n"])[["step_over_limit", "verify_ratio"]].median()
    lines = [
        f"The kernel's measured choices against its defaults, {machine()}, {dt.date.today()}",
        "",
        f"`{command}`",
        "",
        "Measured choices: "
        + ", ".join(f"{k} {v}" for k, v in choices.items())
        + (" (the defaults: no candidate beat them by the margin twice)." if choices == DEFAULTS else "."),
        "",
        "| setting | " + " | ".join(f"n={n}" for n in SIZES) + " | V(5)/V(1) |",
        "|---|" + "---|" * (len(SIZES) + 1),
    ]
    for setting in ("defaults", "measured"):
        part = medians.loc[setting]
        cells = " | ".join(f"{part.loc[int(n), 'step_over_limit']:.2f}" for n in SIZES)
        lines.append(f"| {setting} | {cells} | {part.loc[5, 'verify_ratio']:.2f} |")
    lines += [
        "",
        "Each cell: the target's step for n tokens ÷ the machine's limit for it (its weights at the "
        "measured bandwidth, its FLOPs at the measured peak), the median of the turns; V(5)/V(1): "
        "checking 5 tokens against 1.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    records, choices = [], {}
    for turn in range(args.turns):
        for setting, tuned in (("defaults", False), ("measured", True)):
            report = probe(tuned)
            if tuned:
                choices = {name: report["kernel"][name] for name in TUNED}
            records += rows(report, setting, turn)
            print(f"turn {turn + 1} of {args.turns}: {setting} done", flush=True)
    table = pd.DataFrame(records)
    OUT.mkdir(parents=True, exist_ok=True)
    table.to_csv(OUT / "results.csv", index=False)
    command = f"python -m scripts.bench_tuning --turns {args.turns}"
    meta = {"machine": machine(), "date": str(dt.date.today()), "command": command, "choices": choices}
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (OUT / "summary.md").write_text(summary(table, choices, command))
    print((OUT / "summary.md").read_text())


if __name__ == "__main__":
    main()
