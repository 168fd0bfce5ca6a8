"""A run's time split at its first token, for the speculative run and its plain comparison.

The stat cards show these figures and the sentence that says why a run was slower is made
from them, so the two tell the same story: a run's time is its time to the first token (the
prompt's prefill and the first round, or the first plain step) plus the decoding after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import Trace


@dataclass(frozen=True)
class Timing:
    """One run's tokens and times, in seconds from the start of its prefill."""

    tokens: int
    wall_s: float
    first_token_s: float  # when the first token was ready
    tokens_at_first: int  # how many were ready then: a speculative round may make several at once

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def decode_s(self) -> float:
        """The time after the first token."""
        return max(0.0, self.wall_s - self.first_token_s)

    @property
    def decode_tokens(self) -> int:
        return self.tokens - self.tokens_at_first

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over the time after it; None where nothing came after it."""
        return self.decode_tokens / self.decode_s if self.decode_tokens > 0 and self.decode_s > 0 else None


def speculative_timing(trace: Trace) -> Timing | None:
    """The run's own: its first token is ready when its first round ends; None without rounds."""
    if not trace.rounds:
        return None
    t = trace.totals
    first = (t.prefill_ms + trace.rounds[0].round_ms) / 1e3
    return Timing(t.new_tokens, t.wall_s, first, trace.rounds[0].new_tokens)


def plain_timing(trace: Trace) -> Timing | None:
    """Its plain comparison's; None without one, or where it kept no token times (older traces)."""
    b = trace.baseline
    if b is None or not b.token_times_s:
        return None
    return Timing(len(b.token_ids), b.wall_s, b.token_times_s[0], 1)


def decode_ratio(trace: Trace) -> float | None:
    """The speculative run's decoding pace after its first token, as a multiple of plain decoding's."""
    ours, plain = speculative_timing(trace), plain_timing(trace)
    if ours is None or plain is None or not ours.decode_tokens_per_s or not plain.decode_tokens_per_s:
        return None
    return ours.decode_tokens_per_s / plain.decode_tokens_per_s
