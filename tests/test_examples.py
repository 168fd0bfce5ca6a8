"""The classroom examples carry the lessons their buttons name. Greedy rounds come out the same on
any machine, so what a lesson rests on (how many of the default pair's guesses the target keeps) is
checked here; the speedups measured on a 2-core CPU are in docs/app.md."""

from __future__ import annotations

import pytest

from app.examples import OUTCOMES, classroom_examples, example_labels, example_prompts
from app.ui import OFFLINE_PAIRS
from decoding.api import RunConfig, generate

DEFAULT_TARGET, DEFAULT_DRAFT = next(iter(OFFLINE_PAIRS.values()))  # the pair the page opens on
# What the page's sidebar runs by default: k = 4, 64 new tokens, greedy.
SETTINGS = {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT, "k": 4, "max_new_tokens": 64}


def test_every_classroom_example_names_what_it_shows():
    examples = classroom_examples()
    assert [e.outcome for e in examples].count("wins") == 1 and "loses" in {e.outcome for e in examples}
    labels = example_labels()
    assert len(labels) == len(example_prompts())
    for example, label in zip(examples, labels):
        assert label.startswith(f"{OUTCOMES[example.outcome]}, {example.lesson}: ")


@pytest.mark.parametrize("example", classroom_examples(), ids=lambda e: e.outcome)
def test_each_classroom_example_keeps_the_guesses_its_lesson_rests_on(smol, example):
    """Where speculation wins, the answer copies the prompt and the target keeps most guesses (over
    2.5 tokens a round); where it loses, it keeps few (under 1.5); where it wins a little, it keeps
    many, but the answer is short, so the start (the same for both) is most of the run."""
    trace = generate(RunConfig(prompt=example.prompt, **SETTINGS))
    made, per_round = len(trace.output.token_ids), trace.totals.tokens_per_round
    if example.outcome == "wins":
        assert per_round > 2.5 and made == SETTINGS["max_new_tokens"], (per_round, made)
    elif example.outcome == "loses":
        assert per_round < 1.5 and made == SETTINGS["max_new_tokens"], (per_round, made)
    else:
        assert per_round > 2 and made < 24, (per_round, made)
