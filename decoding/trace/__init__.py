"""The Trace: one run of the decoder, every proposal and every verdict.

Pure Python (plus pandas for the flat view) so that `visualize/` and a
classroom laptop can load and chart a saved trace without torch.
`schema` holds the records and their JSON, `migrate` reads older files,
`validate` checks a file from outside, `events` flattens a run into token
events, `agreement` says what a comparison with plain decoding may promise and `timing` splits
a run's time at its first token.
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
from .timing import Timing, decode_ratio, plain_timing, speculative_timing
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
    "Timing",
    "TopToken",
    "Totals",
    "Trace",
    "Translation",
    "TreeNode",
    "Verdict",
    "agreement",
    "decode_ratio",
    "plain_timing",
    "speculative_timing",
    "token_events",
    "token_frame",
    "validate",
    "verdict_kind",
]
