"""Example prompts for the UI: a few classroom prompts, each with the lesson it shows (measured:
docs/app.md), and Spec-Bench samples."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "prompts"


OUTCOMES = {"wins": "Speculation wins", "little": "Wins a little", "loses": "Speculation loses"}
# Where the outcomes on the classroom buttons were measured (docs/app.md's table).
MEASURED_ON = "with the default pair (k = 4, 64 new tokens, greedy) on a 2-core AMD EPYC under load"


@dataclass(frozen=True)
class ClassroomExample:
    """A prompt and what a run of it with the default pair shows on a 2-core CPU (docs/app.md)."""

    prompt: str
    outcome: str  # one of OUTCOMES
    lesson: str  # why, in a few words

    @property
    def label(self) -> str:
        return f"{OUTCOMES[self.outcome]}, {self.lesson}: {self.prompt.splitlines()[0]}"


@cache
def classroom_examples() -> list[ClassroomExample]:
    return [ClassroomExample(**row) for row in json.loads((PROMPTS / "classroom.json").read_text())]


@cache
def _specbench(per_category: int) -> list[tuple[str, str]]:
    """(category, prompt): the first `per_category` of each category that reads well on its own."""
    seen: dict[str, int] = {}
    bench = []
    for line in (PROMPTS / "specbench_dev.jsonl").read_text().splitlines():
        row = json.loads(line)
        # Some Spec-Bench prompts start mid-sentence (a passage cut from a longer text): skip those.
        starts_well = row["prompt"][:1].isupper() or row["prompt"][:1] in "\"'“"
        if seen.get(row["category"], 0) < per_category and len(row["prompt"]) < 3000 and starts_well:
            seen[row["category"]] = seen.get(row["category"], 0) + 1
            bench.append((row["category"], row["prompt"]))
    return bench


def example_prompts(per_category: int = 1) -> list[str]:
    return [e.prompt for e in classroom_examples()] + [p for _, p in _specbench(per_category)]


def example_labels(per_category: int = 1) -> list[str]:
    """What each of `example_prompts` shows on its button: a classroom example's lesson, a
    Spec-Bench prompt's category."""
    classroom = [e.label for e in classroom_examples()]
    return classroom + [f"Spec-Bench, {c.replace('_', ' ')}: {p}" for c, p in _specbench(per_category)]


def chosen_line(prompt: str) -> str:
    """The status line once an example is chosen: what it is and, for a classroom example, where what
    its button says was measured (not on this machine); what to press to run it here."""
    run_here = "Press **Run** to decode it here with the sidebar's settings."
    for e in classroom_examples():
        if e.prompt == prompt:
            return (
                f"**Classroom example: {OUTCOMES[e.outcome].lower()}, {e.lesson}.** Runs of it {MEASURED_ON} "
                f"showed this (docs/app.md), not runs on this machine. {run_here}"
            )
    category = next((c for c, p in _specbench(1) if p == prompt), None)
    return f"**Spec-Bench example** ({category.replace('_', ' ')}). {run_here}" if category else run_here
