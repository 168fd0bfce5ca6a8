"""Example prompts for the UI: a few classroom prompts and Spec-Bench samples."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "prompts"


@cache
def example_prompts(per_category: int = 1) -> list[str]:
    classroom = json.loads((PROMPTS / "classroom.json").read_text())
    seen: dict[str, int] = {}
    bench = []
    for line in (PROMPTS / "specbench_dev.jsonl").read_text().splitlines():
        row = json.loads(line)
        # Some Spec-Bench prompts start mid-sentence (a passage cut from a longer text): skip those.
        starts_well = row["prompt"][:1].isupper() or row["prompt"][:1] in "\"'“"
        if seen.get(row["category"], 0) < per_category and len(row["prompt"]) < 3000 and starts_well:
            seen[row["category"]] = seen.get(row["category"], 0) + 1
            bench.append(row["prompt"])
    return classroom + bench
