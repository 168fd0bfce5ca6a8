"""The contract between the loop and the things that propose tokens: `Draft` and its `Proposal`.

A draft sees the whole sequence so far (`seq`, [1, n] on the device) and
proposes up to k tokens. It keeps whatever state it likes (a KV cache) and
is told after each round how much of the sequence is still valid.
"""

from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from ..errors import SpecLensError
from ..settings.policies import StopRule
from ..settings.sampling import Sampling
from ..trace import Match, Translation
from .tree import TokenTree, TreeShape

TOP_N = 5  # how many alternatives a trace keeps where a round turned


@dataclass
class Proposal:
    tokens: torch.Tensor  # [k] token ids
    q: torch.Tensor  # [k] the draft's probability of each token
    # [k, vocab] the distributions the tokens were drawn from; None for a
    # deterministic draft (q is one-hot on the proposed token).
    dists: torch.Tensor | None
    # ([k, TOP_N] probabilities, [k, TOP_N] ids): the draft's favourites at each
    # position, for the trace; None for a draft without a distribution.
    top: tuple[torch.Tensor, torch.Tensor] | None = None
    match: Match | None = None  # n-gram drafts: where the tokens were copied from
    translation: Translation | None = None  # a draft with another tokenizer: its own tokens
    source: str | None = None  # a draft of several sources (hybrid): the one that drafted this

    @classmethod
    def from_steps(
        cls,
        tokens: list[torch.Tensor],
        qs: list[torch.Tensor],
        dists: list[torch.Tensor],
        tops: list[tuple[torch.Tensor, torch.Tensor]],
        device: torch.device,
    ) -> Proposal:
        """A proposal drafted one token at a time: per step the token, its q, the distribution it
        was drawn from (when sampling) and the (probabilities, ids) of the draft's favourites."""
        if not tokens:
            return empty_proposal(device)
        top = (torch.stack([values for values, _ in tops]), torch.stack([ids for _, ids in tops]))
        return cls(torch.stack(tokens), torch.stack(qs), torch.stack(dists) if dists else None, top)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def truncate(self, n: int) -> Proposal:
        return Proposal(
            self.tokens[:n],
            self.q[:n],
            None if self.dists is None else self.dists[:n],
            None if self.top is None else (self.top[0][:n], self.top[1][:n]),
            self.match,
            None if self.translation is None else self.translation.cut(n),
            self.source,
        )


class Draft(ABC):
    kind: str = ""
    name: str = ""
    drafts_trees: bool = False  # whether `propose_tree` is implemented

    def reset(self) -> None:
        """Forget everything: a new sequence starts."""

    @abstractmethod
    def propose(
        self,
        seq: torch.Tensor,
        k: int,
        sampling: Sampling,
        generator: torch.Generator,
        stop: StopRule | None = None,
    ) -> Proposal:
        """Up to k tokens to follow `seq`; stop early below `stop`."""

    def rollback(self, length: int, rows: list[int] | None = None) -> None:
        """Only the first `length` tokens of what was seen are still valid. After a tree
        round, `rows` are the rows of the target's pass that were kept (the root's and
        the accepted path's), in order."""

    def propose_tree(
        self, seq: torch.Tensor, depth: int, shape: TreeShape, stop_ids: Collection[int]
    ) -> TokenTree:
        """A tree of up to `shape.nodes` tokens, `depth` deep, to follow `seq` (see decoding/core/tree.py)."""
        raise SpecLensError(f"a {self.kind} draft cannot draft a token tree yet: use a chain (tree nodes 0)")

    def watching_target(self) -> contextlib.AbstractContextManager:
        """The loop runs each target pass inside this: a head draft reads the target's features there."""
        return contextlib.nullcontext()

    def fork(self) -> Draft:
        """A draft for another sequence decoded beside this one (a batch): what it shares (weights,
        a corpus) shared, what a sequence owns (a KV cache, tapped rows, its place in a corpus) its
        own. A copy, reset: `reset` rebinds what a sequence owns, never changes it in place."""
        twin = copy.copy(self)
        twin.reset()
        return twin

    def watching_together(
        self, drafts: Sequence[Draft], rows: Sequence[int]
    ) -> contextlib.AbstractContextManager:
        """One target pass over several sequences runs inside this: `rows[i]` rows of `drafts[i]`'s
        sequence (this draft's forks), one sequence after another. A head draft hands each its own
        features there."""
        return contextlib.nullcontext()

    def drafts_together(self) -> bool:
        """Whether `propose_together` drafts for its sequences in shared steps (not one after another)."""
        return False

    def propose_together(
        self,
        drafts: Sequence[Draft],
        seqs: Sequence[torch.Tensor],
        ks: Sequence[int],
        sampling: Sampling,
        generators: Sequence[torch.Generator],
        stops: Sequence[StopRule | None],
    ) -> list[Proposal]:
        """Each of `drafts` (this draft's forks) proposes up to `ks[i]` tokens after `seqs[i]`, as its
        own `propose` would (none where k is 0). Here one after another; a draft that runs a
        model runs its steps for all of them at once (the batched cost model charges drafting
        as one batched step)."""
        return [
            d.propose(seq, k, sampling, g, stop) if k > 0 else empty_proposal(seq.device)
            for d, seq, k, g, stop in zip(drafts, seqs, ks, generators, stops, strict=True)
        ]

    def leaving_no_memory(self) -> contextlib.AbstractContextManager:
        """A run made inside this (a warm-up) leaves nothing the draft keeps across runs: suffix
        decoding's corpus is as it was before."""
        return contextlib.nullcontext()


def empty_proposal(device: torch.device) -> Proposal:
    return Proposal(torch.empty(0, dtype=torch.long, device=device), torch.empty(0, device=device), None)


def fit_vocab(logits: torch.Tensor, width: int) -> torch.Tensor:
    # Same tokenizer, different padding of the embedding matrix (Qwen2.5
    # 0.5B vs 7B): ids past the target's width can never be proposed.
    n = logits.shape[-1]
    if n > width:
        return logits[..., :width]
    if n < width:
        return torch.nn.functional.pad(logits, (0, width - n), value=float("-inf"))
    return logits
