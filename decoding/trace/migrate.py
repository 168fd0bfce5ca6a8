"""Older trace files in today's words, as plain dicts, before the schema reads them."""

from __future__ import annotations

from typing import Any


def rounds_not_steps(data: dict[str, Any]) -> dict[str, Any]:
    """A version 1 or 2 trace in today's words: its steps were rounds."""

    def renamed(d: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
        return {names.get(key, key): value for key, value in d.items()}

    if "steps" not in data:  # nothing to rename: the reader names what is missing, in today's words
        return data
    data = dict(data)
    data["rounds"] = [renamed(r, {"step_ms": "round_ms"}) for r in data.pop("steps")]
    data["totals"] = renamed(
        data.get("totals") or {}, {"steps": "rounds", "tokens_per_step": "tokens_per_round"}
    )
    return data


def target_alone(data: dict[str, Any]) -> dict[str, Any]:
    """A version 1 to 3 trace called the token of a round that drafted nothing a bonus; it is the
    target's own token, with no draft to be a bonus to."""
    if not isinstance(data.get("rounds"), list):
        return data  # malformed: the schema's reader says so
    rounds = []
    for r in data["rounds"]:
        emitted = r.get("emitted") if isinstance(r, dict) else None
        if isinstance(emitted, dict) and r.get("k") == 0 and emitted.get("kind") == "bonus":
            r = r | {"emitted": emitted | {"kind": "target"}}
        rounds.append(r)
    return data | {"rounds": rounds}


def drafted_not_k(data: dict[str, Any]) -> dict[str, Any]:
    """A version 1 to 4 trace called the tokens a round drafted its `k`, the name of what was
    asked for."""
    if not isinstance(data.get("rounds"), list):
        return data  # malformed: the schema's reader says so
    rounds = [
        {("drafted" if key == "k" else key): value for key, value in r.items()} if isinstance(r, dict) else r
        for r in data["rounds"]
    ]
    return data | {"rounds": rounds}
