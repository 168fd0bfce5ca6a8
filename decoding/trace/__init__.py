"""The Trace: one run of the decoder, every proposal and every verdict.

Pure Python (plus pandas for the flat view) so that `visualize/` and a
classroom laptop can load and chart a saved trace without torch.
`schema` holds the records and their JSON, `migrate` reads older files,
`validate` checks a file from outside, `events` flattens a run into token
events and `agreement` says what a comparison with plain decoding may promise.
"""

from .agreement import Agreement, agreement
from .events import EVENT_COLUMNS, token_events, token_frame
from .schema import (
    TOKEN_KINDS,
    TRACE_VERSION,
    Baseline,
    DraftToken,
    Emitted,
    Match,
    Output,
    Round,
    RunMeta,
    TopToken,
    Totals,
    Trace,
    Translation,
    TreeNode,
    Verdict,
    verdict_kind,
)
from .validate import validate

__all__ = [
    "EVENT_COLUMNS",
    "TOKEN_KINDS",
    "TRACE_VERSION",
    "Agreement",
    "Baseline",
    "DraftToken",
    "Emitted",
    "Match",
    "Output",
    "Round",
    "RunMeta",
    "TopToken",
    "Totals",
    "Trace",
    "Translation",
    "TreeNode",
    "Verdict",
    "agreement",
    "token_events",
    "token_frame",
    "validate",
    "verdict_kind",
]
