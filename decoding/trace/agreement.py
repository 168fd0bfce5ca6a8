"""What a comparison with plain decoding may promise, given how the run was made."""

from __future__ import annotations

from dataclasses import dataclass

from .schema import Trace


@dataclass
class Agreement:
    """How a run's output relates to plain decoding's, and what that means."""

    label: str  # a card's label
    value: str  # a card's value: ✓, ✗, ≈ ...
    good: bool | None  # green, red, or neither (nothing was promised)
    sentence: str  # one line for the CLI and captions
    first_difference: int | None = None  # the first output position that differs


def agreement(trace: Trace) -> Agreement | None:
    """What a comparison with plain decoding shows, by what the run promises.

    Greedy in float32 or float64 promises the same tokens. Sampling promises
    only the same distribution, so two runs differ by design. Greedy in 16-bit
    floats rounds a k-token pass differently from a one-token one, so a
    near-tie may flip: a difference there is expected, and where it starts
    is worth showing.
    """
    if trace.baseline is None:
        return None
    ours, plain = trace.output.token_ids, trace.baseline.token_ids
    first = next((i for i, (a, b) in enumerate(zip(ours, plain)) if a != b), None)
    if first is None and len(ours) != len(plain):
        first = min(len(ours), len(plain))
    if not trace.meta.sampling.greedy:
        return Agreement(
            "same distribution as plain sampling",
            "≈",
            None,
            "same distribution as plain sampling (not token-identical by design)",
            first,
        )
    if first is None:
        return Agreement("identical to plain decoding", "✓", True, "output identical to plain decoding")
    where = f"first difference at output token {first + 1}"
    if trace.meta.dtype in ("bfloat16", "float16"):
        return Agreement(
            f"may differ at near-ties ({trace.meta.dtype})",
            f"≠ from token {first + 1}",
            None,
            f"output differs from plain decoding, {where}: expected in {trace.meta.dtype}, "
            "whose k-token and one-token passes round near-ties differently",
            first,
        )
    return Agreement(
        "identical to plain decoding", "✗", False, f"output DIFFERENT from plain decoding, {where}", first
    )
