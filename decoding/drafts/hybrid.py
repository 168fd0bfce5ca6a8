"""N-gram lookup where the text repeats itself, the trained head elsewhere: one draft, two sources."""

from __future__ import annotations

import contextlib

from ..core.proposal import Draft, Proposal
from .head import HeadDraft
from .ngram import NGramDraft

# The defaults, measured on the dev prompts (docs/trained-head.md): threshold 1 was as fast as
# any of 1, 2 and 3; capping the head's rounds at 2 tokens (or 1) was faster than none (0).
HYBRID_MIN_MATCH = 1
HYBRID_HEAD_K = 2


class HybridDraft(Draft):
    """Each round drafts with n-gram lookup when the last `min_match` tokens or more occurred
    before (a copy that long is usually right: summaries, quotes, code), and with the head
    otherwise, drafting at most `head_k` tokens (0: the round's k) where the head is right
    less often than a copy. The round's trace names which of the two drafted it (`Round.source`).

    The head reads the target's features only in the rounds it drafts: the rows of the
    rounds in between stay tapped (cut to what was kept, a tree round's to its kept path)
    and are read all at once, in one head step, the next time it drafts. A tree round is
    the same choice: n-gram lookup's tree, or the head's (not capped: a tree's nodes
    are what the round pays for).
    """

    kind = "hybrid"
    drafts_trees = True

    def __init__(
        self,
        ngram: NGramDraft,
        head: HeadDraft,
        min_match: int = HYBRID_MIN_MATCH,
        head_k: int = HYBRID_HEAD_K,
    ) -> None:
        self.ngram, self.head = ngram, head
        self.min_match, self.head_k = min_match, head_k
        at = "" if (min_match, head_k) == (HYBRID_MIN_MATCH, HYBRID_HEAD_K) else f"@{min_match}"
        at += "" if head_k == HYBRID_HEAD_K else f"/{head_k}"
        self.name = f"ngram+head{at}{head.name.removeprefix('head')}"  # as build_draft spells it

    def reset(self) -> None:
        self.ngram.reset()
        self.head.reset()

    def watching_target(self) -> contextlib.AbstractContextManager:
        return self.head.watching_target()

    def fork(self) -> HybridDraft:
        return HybridDraft(self.ngram.fork(), self.head.fork(), self.min_match, self.head_k)

    def watching_together(self, drafts, rows) -> contextlib.AbstractContextManager:
        return self.head.watching_together([d.head for d in drafts], rows)

    def _copies(self, seq) -> bool:
        matched, _ = self.ngram.suffix_matches(seq[0])
        return matched >= self.min_match

    def propose(self, seq, k, sampling, generator, stop=None) -> Proposal:
        if self._copies(seq):
            proposal = self.ngram.propose(seq, k, sampling, generator, stop)
            proposal.source = "ngram"
        else:
            proposal = self.head.propose(seq, min(k, self.head_k or k), sampling, generator, stop)
            proposal.source = "head"
        return proposal

    def drafts_together(self) -> bool:
        return self.head.drafts_together()

    def propose_together(self, drafts, seqs, ks, sampling, generators, stops) -> list[Proposal]:
        """The sequences that copy draft one by one with n-gram lookup; the others with the head,
        in its shared steps: each sequence drafts what its own `propose` would."""
        copies = [k > 0 and d._copies(seq) for d, seq, k in zip(drafts, seqs, ks, strict=True)]
        head_ks = [0 if c else min(k, d.head_k or k) for d, k, c in zip(drafts, ks, copies, strict=True)]
        heads = self.head.propose_together(
            [d.head for d in drafts], seqs, head_ks, sampling, generators, stops
        )
        proposals = []
        for d, seq, k, g, stop, c, from_head in zip(
            drafts, seqs, ks, generators, stops, copies, heads, strict=True
        ):
            proposal = d.ngram.propose(seq, k, sampling, g, stop) if c else from_head
            if k > 0:
                proposal.source = "ngram" if c else "head"
            proposals.append(proposal)
        return proposals

    def propose_tree(self, seq, depth, shape, stop_ids):
        source = "ngram" if self._copies(seq) else "head"
        tree = getattr(self, source).propose_tree(seq, depth, shape, stop_ids)
        tree.source = source
        return tree

    def rollback(self, length: int, rows: list[int] | None = None) -> None:
        self.head.rollback(length, rows)
