"""Draft-length policies: how many tokens to draft in the next round, and when to stop within one.

`confidence` and `entropy` stop a round's drafting once the draft's own distribution predicts
a refusal: the token at that position is still proposed, the next is not drafted.

- confidence: the draft's top probability below the threshold (the draft's q of its own token is
  its acceptance chance were it right about itself).
- entropy: AdaEDL's lower bound on the chance that the target accepts the token, 1 − √(γ·H) with
  H the entropy of the draft's distribution in nats (Agrawal et al., "AdaEDL: Early Draft Stopping
  for Speculative Decoding of Large Language Models via an Entropy-based Lower Bound on Token
  Acceptance Probability", 2024), below the threshold. It needs no training and looks at the whole
  distribution, so a draft torn between two near-synonyms stops sooner than its top probability
  alone would say. SVIP (Zhang et al. 2024) stops on the same quantity, √H.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import SpecLensError

if TYPE_CHECKING:  # only tensors' own methods are used: the trace and visualize/ load without torch
    import torch

K_MIN, K_MAX = 1, 16
POLICIES = ("fixed", "heuristic", "confidence", "entropy")
ENTROPY_GAMMA = 1.0  # γ in AdaEDL's bound 1 − √(γ·H)


@dataclass(frozen=True)
class StopRule:
    """When a draft stops drafting within a round, judged on its distribution at a position."""

    kind: str  # "confidence" or "entropy"
    threshold: float

    def stops(self, probs: torch.Tensor) -> bool:
        return self.predicted_acceptance(probs) < self.threshold

    def predicted_acceptance(self, probs: torch.Tensor) -> float:
        probs = probs.float()
        if self.kind == "confidence":
            return float(probs.max())
        entropy = float(-(probs * probs.clamp_min(1e-30).log()).sum())
        return 1.0 - math.sqrt(ENTROPY_GAMMA * max(entropy, 0.0))


@dataclass
class Policy:
    name: str
    k: int  # the current draft length (the cap, for the confidence policy)
    # Stop drafting where the predicted acceptance falls below this (confidence and entropy).
    min_confidence: float | None = None

    @property
    def stop(self) -> StopRule | None:
        if self.min_confidence is None:
            return None
        return StopRule("entropy" if self.name == "entropy" else "confidence", self.min_confidence)

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
    if name in ("confidence", "entropy"):
        if not 0.0 < threshold < 1.0:
            raise SpecLensError(f"the {name} policy's threshold must be in (0, 1), got {threshold}")
        return Policy(name, k, threshold)
    return Policy(name, k)
