"""A model-free simulation of speculative rounds, for the Theory tab.

Each drafted token is accepted with probability alpha until the first
rejection, exactly the i.i.d. model behind the cost-model formulas. The
words are a fixed sentence so a class can read along; the result is an
ordinary Trace, labelled as a simulation in its meta.
"""

from __future__ import annotations

import random

from decoding.settings.sampling import Sampling
from decoding.trace import DraftToken, Emitted, Output, Round, RunMeta, Trace, Verdict, verdict_kind

TEXT = [
    "Speculative",
    "decoding",
    "lets",
    "a",
    "small",
    "draft",
    "model",
    "guess",
    "the",
    "next",
    "few",
    "words",
    "while",
    "the",
    "large",
    "model",
    "checks",
    "all",
    "of",
    "the",
    "guesses",
    "at",
    "once",
    "and",
    "keeps",
    "every",
    "guess",
    "that",
    "matches",
    "what",
    "it",
    "would",
    "have",
    "written",
    "itself",
    "so",
    "the",
    "answer",
    "is",
    "exactly",
    "the",
    "same",
    "only",
    "faster",
]
WRONG = ["banana", "purple", "seven", "cloud", "quietly", "engine", "river", "maybe"]


def simulate_trace(alpha: float, gamma: int, rounds: int, seed: int = 0) -> Trace:
    rng = random.Random(seed)
    trace = Trace(
        meta=RunMeta(
            target="simulation", draft=f"accepts with α={alpha:.2f}", sampling=Sampling(temperature=1.0)
        ),
    )
    pos = 0
    ids: list[int] = []

    def word(i: int) -> str:
        return " " + TEXT[i % len(TEXT)]

    for _ in range(rounds):
        draft, verdicts, n = [], [], 0
        for j in range(gamma):
            judged = n == j  # every earlier token of the round was accepted
            u = rng.random() if judged else None
            ok = judged and u < alpha
            n += ok
            text = word(pos + j) if ok else " " + rng.choice(WRONG)
            draft.append(DraftToken(pos + j, text, 1.0))
            # n has stopped growing at a rejection, so the kind follows from it.
            kind = verdict_kind(j, n)
            verdicts.append(
                Verdict(alpha, alpha, u, ok, kind) if judged else Verdict(None, None, None, False, kind)
            )
        kind = "bonus" if n == gamma else "correction"
        emitted = Emitted(pos + n, word(pos + n), kind, 1.0)
        ids += [t.id for t in draft[:n]] + [emitted.id]
        trace.rounds.append(Round(gamma, draft, verdicts, n, emitted, 0.0, 0.0, 0.0))
        pos += n + 1
    trace.output = Output("".join(word(i) for i in range(pos)).strip(), ids)
    trace.finish(0.0)
    return trace
