"""A trace flattened into token events: one row per drafted or emitted token, for CSV and charts."""

from __future__ import annotations

from typing import Any

import pandas as pd

from .schema import Trace

EVENT_COLUMNS = [
    "round",
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

    `round` and `position` (the draft position within the round; the emitted
    token sits after the accepted ones) count from 1, as the timeline and the
    acceptance chart do; `output_index` numbers the tokens of the output from 0
    and is None for rejected and discarded drafts. Prompt tokens are
    not repeated here (the trace stores the prompt text and count in `meta`).
    """
    rows: list[dict[str, Any]] = []
    out = 0
    for i, r in enumerate(trace.rounds):
        for j, (tok, v) in enumerate(zip(r.draft, r.verdicts)):
            kept = v.kind == "accepted"
            rows.append(
                {
                    "round": i + 1,
                    "position": j + 1,
                    "kind": v.kind,
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
        if r.emitted is not None:
            e = r.emitted
            rows.append(
                {
                    "round": i + 1,
                    "position": r.n_accepted + 1,
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


def token_frame(trace: Trace) -> pd.DataFrame:
    """One row per token event, in timeline order (see `token_events`)."""
    return pd.DataFrame(token_events(trace), columns=EVENT_COLUMNS)
