"""The Trace: one run of the decoder, every proposal and every verdict.

Pure Python (plus pandas for the flat view) so that `visualize/` and a
classroom laptop can load and chart a saved trace without torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TOKEN_KINDS = ("prompt", "accepted", "rejected", "correction", "bonus")


@dataclass
class DraftToken:
    id: int
    text: str
    q: float  # the draft's probability of this token; 1.0 for a deterministic draft


@dataclass
class Verdict:
    p: float  # the target's probability of the drafted token
    accept_prob: float  # min(1, p/q) when sampling; 1 or 0 when greedy
    u: float | None  # the uniform draw; None when greedy
    accepted: bool


@dataclass
class Emitted:
    id: int
    text: str
    kind: str  # "correction" or "bonus"
    p: float  # the target's probability of this token


@dataclass
class Step:
    k: int
    draft: list[DraftToken]
    verdicts: list[Verdict]
    n_accepted: int
    # None only when the round's last accepted draft token ended the text (EOS).
    emitted: Emitted | None
    draft_ms: float
    verify_ms: float
    step_ms: float

    @property
    def new_tokens(self) -> int:
        return self.n_accepted + (self.emitted is not None)


@dataclass
class Output:
    text: str
    token_ids: list[int]


@dataclass
class Baseline:
    text: str
    token_ids: list[int]
    wall_s: float
    tokens_per_s: float
    token_times_s: list[float] = field(default_factory=list)  # when each token was ready


@dataclass
class Trace:
    meta: dict[str, Any]
    steps: list[Step] = field(default_factory=list)
    totals: dict[str, Any] = field(default_factory=dict)
    output: Output = field(default_factory=lambda: Output("", []))
    baseline: Baseline | None = None

    # -- derived views -------------------------------------------------------

    def emitted_ids(self) -> list[int]:
        """The output token ids, rebuilt from the steps (accepted, then emitted)."""
        ids: list[int] = []
        for step in self.steps:
            ids.extend(t.id for t in step.draft[: step.n_accepted])
            if step.emitted is not None:
                ids.append(step.emitted.id)
        return ids

    def token_times_s(self) -> list[float]:
        """When each output token was ready, in seconds from the start (prefill included)."""
        t = self.totals.get("prefill_ms", 0.0) / 1e3
        times: list[float] = []
        for step in self.steps:
            t += step.step_ms / 1e3
            times.extend([t] * step.new_tokens)
        return times

    def compute_totals(self, wall_s: float) -> dict[str, Any]:
        self.totals = totals_from_counts(
            steps=len(self.steps),
            new_tokens=sum(s.new_tokens for s in self.steps),
            proposed=sum(s.k for s in self.steps),
            accepted=sum(s.n_accepted for s in self.steps),
            wall_s=wall_s,
        )
        self.totals["draft_s"] = sum(s.draft_ms for s in self.steps) / 1000
        self.totals["verify_s"] = sum(s.verify_ms for s in self.steps) / 1000
        return self.totals

    def attach_baseline(self, baseline: Baseline) -> None:
        self.baseline = baseline
        tps = self.totals.get("tokens_per_s", 0.0)
        self.totals["baseline_tokens_per_s"] = baseline.tokens_per_s
        self.totals["speedup"] = tps / baseline.tokens_per_s if baseline.tokens_per_s else 0.0
        self.totals["identical_to_baseline"] = baseline.token_ids == self.output.token_ids

    # -- serialisation -------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(indent=1), encoding="utf-8")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trace:
        try:
            steps = [_step_from_dict(s) for s in data["steps"]]
            baseline = data.get("baseline")
            return cls(
                meta=dict(data["meta"]),
                steps=steps,
                totals=dict(data.get("totals", {})),
                output=Output(**data["output"]),
                baseline=Baseline(**baseline) if baseline else None,
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a SpecLens trace: missing or malformed field {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> Trace:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a SpecLens trace: invalid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise ValueError("not a SpecLens trace: the top level must be an object")
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))

    def to_dataframe(self):  # -> pandas.DataFrame
        """One row per token event, in timeline order (see `token_events`)."""
        import pandas as pd

        return pd.DataFrame(token_events(self), columns=EVENT_COLUMNS)


def totals_from_counts(
    steps: int, new_tokens: int, proposed: int, accepted: int, wall_s: float
) -> dict[str, Any]:
    return {
        "steps": steps,
        "new_tokens": new_tokens,
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "tokens_per_step": new_tokens / steps if steps else 0.0,
        "wall_s": wall_s,
        "tokens_per_s": new_tokens / wall_s if wall_s > 0 else 0.0,
    }


def _step_from_dict(s: dict[str, Any]) -> Step:
    emitted = s.get("emitted")
    return Step(
        k=s["k"],
        draft=[DraftToken(**t) for t in s["draft"]],
        verdicts=[Verdict(**v) for v in s["verdicts"]],
        n_accepted=s["n_accepted"],
        emitted=Emitted(**emitted) if emitted else None,
        draft_ms=s["draft_ms"],
        verify_ms=s["verify_ms"],
        step_ms=s["step_ms"],
    )


EVENT_COLUMNS = [
    "step",
    "position",
    "kind",
    "token_id",
    "text",
    "q",
    "p",
    "accept_prob",
    "u",
    "output_index",
]


def token_events(trace: Trace) -> list[dict[str, Any]]:
    """Flatten a trace into token events.

    `position` is the draft position within the round (0-based; the emitted
    token sits at `n_accepted`); `output_index` numbers the tokens of the
    output and is None for rejected drafts. Prompt tokens are not repeated
    here (the trace stores the prompt text and count in `meta`).
    """
    rows: list[dict[str, Any]] = []
    out = 0
    for i, step in enumerate(trace.steps):
        for j, (tok, v) in enumerate(zip(step.draft, step.verdicts)):
            kept = j < step.n_accepted
            rows.append(
                {
                    "step": i,
                    "position": j,
                    "kind": "accepted" if kept else "rejected",
                    "token_id": tok.id,
                    "text": tok.text,
                    "q": tok.q,
                    "p": v.p,
                    "accept_prob": v.accept_prob,
                    "u": v.u,
                    "output_index": out if kept else None,
                }
            )
            out += kept
        if step.emitted is not None:
            e = step.emitted
            rows.append(
                {
                    "step": i,
                    "position": step.n_accepted,
                    "kind": e.kind,
                    "token_id": e.id,
                    "text": e.text,
                    "q": None,
                    "p": e.p,
                    "accept_prob": None,
                    "u": None,
                    "output_index": out,
                }
            )
            out += 1
    return rows


def check_invariants(trace: Trace) -> None:
    """Raise AssertionError when the trace contradicts itself."""
    for i, s in enumerate(trace.steps):
        assert s.k == len(s.draft) == len(s.verdicts), f"step {i}: k/draft/verdicts differ"
        flags = [v.accepted for v in s.verdicts]
        assert flags == [True] * s.n_accepted + [False] * (s.k - s.n_accepted), (
            f"step {i}: accepted flags are not a prefix of length n_accepted"
        )
        if s.emitted is not None:
            expected = "bonus" if s.n_accepted == s.k else "correction"
            assert s.emitted.kind == expected, f"step {i}: emitted kind {s.emitted.kind}"
        else:
            assert s.n_accepted > 0, f"step {i}: nothing emitted and nothing accepted"
            assert i == len(trace.steps) - 1, f"step {i}: only the last round may end on EOS"
    assert trace.emitted_ids() == trace.output.token_ids, "steps do not rebuild the output"
    t = trace.totals
    if t:
        assert t["steps"] == len(trace.steps)
        assert t["new_tokens"] == len(trace.output.token_ids)
        assert t["proposed"] == sum(s.k for s in trace.steps)
        assert t["accepted"] == sum(s.n_accepted for s in trace.steps)
