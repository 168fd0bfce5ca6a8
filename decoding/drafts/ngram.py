"""Prompt lookup: drafts copied from where the sequence's last few tokens occurred before. No model."""

from __future__ import annotations

import torch

from ..core.proposal import Draft, Proposal, empty_proposal
from ..core.tree import TokenTree, grow_tree
from ..settings.policies import StopRule
from ..trace import Match


class NGramDraft(Draft):
    """Prompt lookup: find the earliest occurrence of the last n tokens (n from
    `max_ngram` down to 1) and propose what followed it. No model.

    Earliest, as Hugging Face's prompt lookup does: for summaries and
    retrieval answers the best continuations are in the prompt, and the
    benchmark then compares the two loops with the very same drafts.
    """

    kind = "ngram"
    name = "ngram"
    drafts_trees = True

    def __init__(self, max_ngram: int = 3) -> None:
        self.max_ngram = max_ngram

    def propose_tree(self, seq, depth, shape, stop_ids):
        """Every earlier occurrence of the suffix votes for what followed it: a node's
        children are those tokens, most votes first, with their share of the votes as q."""

        def expand(tree: TokenTree, frontier: list[int]) -> list[list[tuple[int, float]]]:
            paths = [[tree.tokens[i] for i in tree.path(n)] for n in frontier]
            return [self.continuations(torch.cat([seq[0], seq.new_tensor(path)])) for path in paths]

        return grow_tree(expand, depth, shape, stop_ids)

    def suffix_matches(self, ids: torch.Tensor) -> tuple[int, torch.Tensor]:
        """The longest suffix of `ids` (up to `max_ngram` tokens) that occurred before, and where
        each earlier occurrence's continuation starts, earliest first; (0, empty) when none recurs."""
        length = ids.shape[0]
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            windows = ids.unfold(0, n, 1)[: length - n]  # every n-gram with a continuation
            hits = (windows == ids[length - n :]).all(-1).nonzero().flatten()
            if hits.numel():
                return n, hits + n
        return 0, ids.new_empty(0)

    def continuations(self, ids: torch.Tensor) -> list[tuple[int, float]]:
        """What followed the earlier occurrences of the longest suffix that recurs, most votes first."""
        _, starts = self.suffix_matches(ids)
        following = ids[starts].tolist()  # in order of occurrence
        votes = {t: following.count(t) for t in dict.fromkeys(following)}
        ranked = sorted(votes, key=lambda t: -votes[t])  # stable: ties stay earliest first
        return [(t, votes[t] / len(following)) for t in ranked]

    def propose(self, seq, k, sampling, generator, stop=None):
        ids = seq[0]
        n, starts = self.suffix_matches(ids)
        if not n:
            return empty_proposal(seq.device)
        if stop is not None:
            return self._propose_by_support(ids, k, stop)
        start = int(starts[0])
        tokens = ids[start : start + k]
        ones = torch.ones(tokens.shape[0], device=ids.device)
        return Proposal(tokens, ones, None, match=Match(start, n))

    def _propose_by_support(self, ids: torch.Tensor, k: int, stop: StopRule) -> Proposal:
        """A draft whose length follows the match's support, as suffix decoding's does: each token
        is the one most earlier occurrences of the suffix went on with, its share of them as q,
        and drafting stops once the shares predict a refusal (`stop` judges them as it judges a
        model's distribution). q is not a distribution the tokens were drawn from, so sampling
        verifies them as it verifies any deterministic draft."""
        tokens: list[int] = []
        for _ in range(k):
            votes = self.continuations(torch.cat([ids, ids.new_tensor(tokens)]))
            if not votes:
                break
            tokens.append(votes[0][0])
            if stop.stops(torch.tensor([share for _, share in votes])):
                break
        ones = torch.ones(len(tokens), device=ids.device)
        return Proposal(ids.new_tensor(tokens), ones, None)
