"""Draft-length policies: how many tokens to draft in the next round."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecLensError

K_MIN, K_MAX = 1, 16
POLICIES = ("fixed", "heuristic", "confidence")


@dataclass
class Policy:
    name: str
    k: int  # the current draft length (the cap, for the confidence policy)
    min_confidence: float | None = None  # stop drafting below this top probability

    def next_k(self) -> int:
        return self.k

    def update(self, n_accepted: int, k: int) -> None:
        # Hugging Face's heuristic schedule: grow after a fully accepted round.
        if self.name == "heuristic" and k > 0:
            self.k = min(K_MAX, self.k + 2) if n_accepted == k else max(K_MIN, self.k - 1)

    def describe(self) -> dict:
        return {"name": self.name, "k": self.k, "min_confidence": self.min_confidence}


def make_policy(name: str, k: int, threshold: float = 0.4) -> Policy:
    if name not in POLICIES:
        raise SpecLensError(f"unknown policy '{name}'; choose one of {', '.join(POLICIES)}")
    if not isinstance(k, int) or not K_MIN <= k <= K_MAX:
        raise SpecLensError(f"k must be a whole number from {K_MIN} to {K_MAX}, got {k}")
    if name == "confidence":
        if not 0.0 < threshold < 1.0:
            raise SpecLensError(f"the confidence threshold must be in (0, 1), got {threshold}")
        return Policy(name, k, threshold)
    return Policy(name, k)
