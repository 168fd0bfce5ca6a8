"""The two verification rules, and `warp`: logits to the probabilities the sampling settings draw from.

Everything here works on a handful of rows (the k+1 positions of one round)
and stays on the model's device; the loop reads the results back once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..settings.sampling import Sampling


def warp(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Temperature, then top-k, then top-p; returns probabilities (rows of `logits`)."""
    logits = logits.float() / s.temperature
    if s.top_k and s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens above it already hold top_p of the mass;
        # the most likely token always stays.
        drop = (sorted_probs.cumsum(-1) - sorted_probs) >= s.top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits.softmax(-1)


@dataclass
class Verification:
    """One round's verdicts, still on the device."""

    n_accepted: int
    p: torch.Tensor  # [k] target probability of each drafted token
    accept_prob: torch.Tensor  # [k]
    u: torch.Tensor | None  # [k] uniform draws; None when greedy
    emitted: torch.Tensor  # [] the token the target adds
    p_emitted: torch.Tensor  # []
    dist: torch.Tensor  # [vocab] the target's distribution where it added its token
    # [vocab] sampling after a rejection: max(0, p - q) normalised, what the token was drawn from
    residual: torch.Tensor | None = None
    # [n+1] the entropy (nats) of the target's distribution at each judged position, the
    # emitted token's last: how unsure the target itself was where a draft was judged
    entropy: torch.Tensor | None = None


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each row of probabilities."""
    return -(probs * probs.clamp_min(1e-30).log()).sum(-1)


def _prefix_len(ok: torch.Tensor) -> int:
    return int(ok.long().cumprod(0).sum()) if ok.numel() else 0


def verify_greedy(target_logits: torch.Tensor, draft_ids: torch.Tensor) -> Verification:
    """Keep drafted tokens while they equal the target's argmax.

    `target_logits` has k+1 rows: row i scores the token after draft i-1
    (row 0 follows the last verified token, row k is the bonus position).
    """
    k = draft_ids.shape[0]
    best = target_logits.argmax(-1)
    n = _prefix_len(best[:k] == draft_ids)
    probs = target_logits.float().softmax(-1)
    p = probs[torch.arange(k, device=probs.device), draft_ids]
    emitted = best[n]
    kept = (best[:k] == draft_ids).float()
    return Verification(n, p, kept, None, emitted, probs[n, emitted], probs[n], None, entropy(probs[: n + 1]))


def verify_sampling(
    target_probs: torch.Tensor,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator,
) -> Verification:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    Draft token x_i is kept with probability min(1, p_i(x)/q_i(x)); at the
    first rejection the target resamples from max(0, p_i - q_i), normalised,
    which makes the output follow p exactly. `draft_probs` is None for a
    deterministic draft: q is then one-hot on the drafted token.
    """
    k = draft_ids.shape[0]
    rows = torch.arange(k, device=target_probs.device)
    p = target_probs[rows, draft_ids]
    q = torch.ones_like(p) if draft_probs is None else draft_probs[rows, draft_ids]
    accept_prob = (p / q).clamp(max=1.0)
    u = torch.rand(k, generator=generator, device=target_probs.device)
    n = _prefix_len(u < accept_prob)
    residual = None
    if n < k:
        if draft_probs is None:
            q_row = torch.zeros_like(target_probs[n])
            q_row[draft_ids[n]] = 1.0
        else:
            q_row = draft_probs[n]
        residual = (target_probs[n] - q_row).clamp(min=0.0)
        # p == q leaves no residual mass, but then rejection had probability 0
        # and only rounding brought us here: fall back to p.
        mass = residual.sum()
        residual = residual / mass if mass > 0 else target_probs[n]
        dist = residual
    else:
        dist = target_probs[k]
    emitted = torch.multinomial(dist, 1, generator=generator)[0]
    return Verification(
        n,
        p,
        accept_prob,
        u,
        emitted,
        target_probs[n, emitted],
        target_probs[n],
        residual,
        entropy(target_probs[: n + 1]),
    )
