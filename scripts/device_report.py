"""The README of a device check (scripts/device-check.sh): the issue's figures with CUDA graphs and
without, from the probe's JSON and the benchmark's results.csv in its output folder.

    python scripts/device_report.py OUT        # writes OUT/README.md and prints it

The folder then goes to benchmarks/gpu-<card>-graphs/ as it is.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from pathlib import Path

import pandas as pd

from decoding import costmodel

ALPHA, K = 0.7, 4  # the pair: acceptance 0.7, 135M drafting k = 4 for 1.7B
TARGET, DRAFT = "smollm2-1.7b-random", "smollm2-135m-random"
ROWS = ("1", "2", "3", "5", "9", "17")


def _probe(folder: Path, name: str) -> dict | None:
    path = folder / f"probe-{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _bench(folder: Path) -> pd.DataFrame | None:
    path = folder / "bench-model" / "results.csv"
    return pd.read_csv(path) if path.is_file() else None


def _fmt(value: float | None, spec: str, missing: str = "–") -> str:
    return missing if value is None or value != value else format(value, spec)


def figures(folder: Path) -> dict[str, float | None]:
    """One mode's figures (`folder`: with graphs, or its no-graphs/ part)."""
    target, draft, bench = _probe(folder, TARGET), _probe(folder, DRAFT), _bench(folder)
    c = float(bench["draft_cost"].mean()) if bench is not None else None
    v5 = target["5"]["verify_ratio"] if target else None
    return {
        "target_ms": target["1"]["step_ms"] if target else None,
        "target_over_limit": target["1"]["step_over_limit"] if target else None,
        "v5": v5,
        "draft_ms": draft["1"]["step_ms"] if draft else None,
        "c": c,
        # Leviathan's formula with the measured costs: E[tokens] / (k c + V(k+1)/V(1)).
        "predicted": costmodel.expected_tokens(ALPHA, K) / (K * c + v5) if c is not None and v5 else None,
        "measured": float(bench["speedup_vs_plain"].mean()) if bench is not None else None,
        "graphs": bool(target["graphs"]) if target and "graphs" in target else None,
    }


def goals_table(on: dict, off: dict) -> str:
    rows = [
        ("1.7B-shaped step at n = 1 (ms)", "target_ms", ".2f", ""),
        ("… against the memory limit", "target_over_limit", ".2f", "≤ 2×"),
        ("V(5)/V(1), 1.7B shape", "v5", ".3f", "≤ 1.15"),
        ("135M-shaped step at n = 1 (ms)", "draft_ms", ".3f", "≤ 0.5 ms"),
        ("c, 135M drafting for 1.7B (bench)", "c", ".3f", "≤ 0.2"),
        (f"predicted speedup at α = {ALPHA}, k = {K}, from c and V(5)", "predicted", ".2f", "≥ ×2"),
        ("measured speedup (random weights: nothing accepted)", "measured", ".2f", ""),
    ]
    lines = ["| figure | without graphs | with graphs | goal |", "|---|---|---|---|"]
    for label, key, spec, goal in rows:
        lines.append(f"| {label} | {_fmt(off[key], spec)} | {_fmt(on[key], spec)} | {goal} |")
    return "\n".join(lines)


def steps_table(folder: Path) -> str:
    lines = [f"| model, graphs | {' | '.join(ROWS)} tokens |", "|---|" + "---|" * len(ROWS)]
    for name in (TARGET, DRAFT):
        for mode, part in (("on", folder), ("off", folder / "no-graphs")):
            probe = _probe(part, name)
            if probe:
                steps = " | ".join(_fmt(probe.get(n, {}).get("step_ms"), ".3f") for n in ROWS)
                lines.append(f"| {name}, {mode} | {steps} |")
    return "\n".join(lines)


def batch_table(folder: Path) -> str:
    """`bench-batch/batch.csv`: plain and n-gram decoding of 18 prompts at each batch size."""
    path = folder / "bench-batch" / "batch.csv"
    if not path.is_file():
        return "Batched decoding (`bench-batch/`): not run."
    lines = [
        "Batched decoding over static slots (`bench-batch/`: the 135M shape, 18 dev prompts, 32 tokens, "
        "n-gram k = 2), tokens/s while decoding:",
        "",
        "| batch | plain | n-gram | speedup | predicted | identical |",
        "|---|---|---|---|---|---|",
    ]
    for row in pd.read_csv(path).itertuples():
        lines.append(
            f"| {row.batch} | {row.decode_tokens_per_s_plain:.1f} | {row.decode_tokens_per_s_speculative:.1f} "
            f"| ×{row.speedup:.2f} | ×{row.predicted_speedup:.2f} | {'✓' if row.identical else '✗'} |"
        )
    return "\n".join(lines)


def report(folder: Path) -> str:
    machine = (
        (folder / "machine.txt").read_text().strip().splitlines()
        if (folder / "machine.txt").is_file()
        else []
    )
    tests = (
        (folder / "cuda-tests.txt").read_text().strip().splitlines()
        if (folder / "cuda-tests.txt").is_file()
        else []
    )
    card = machine[0].split(",")[0] if machine else "(no machine.txt)"
    on, off = figures(folder), figures(folder / "no-graphs")
    return "\n".join(
        [
            f"# {card}: decode steps replayed from CUDA graphs, random-weight models of real shapes",
            "",
            f"`scripts/device-check.sh` on {', '.join(machine) or 'an unnamed machine'}, "
            f"{_dt.date.today().isoformat()}. SmolLM2-135M's and SmolLM2-1.7B's architectures with random "
            "weights (`scripts/device_models.py`), bfloat16: their steps cost what the real models' do, "
            "their outputs mean nothing (drafts are almost never accepted).",
            "",
            f"CUDA tests (`cuda-tests.txt`): {tests[-1] if tests else 'not run'}.",
            "",
            goals_table(on, off),
            "",
            "Step times from `python -m decoding probe` (ms, median of 15, 100 tokens cached):",
            "",
            steps_table(folder),
            "",
            batch_table(folder),
            "",
            "With graphs: `probe-*.json`, `bench-model/` (the 135M shape drafting k = 4 for the 1.7B "
            "shape); without (`--no-graphs`): `no-graphs/`. c is `draft_cost` in `results.csv`: the "
            "draft's time per token over a plain target step, each in its own mode.",
            "",
        ]
    )


if __name__ == "__main__":
    out = Path(sys.argv[1])
    text = report(out)
    (out / "README.md").write_text(text)
    print(text)
