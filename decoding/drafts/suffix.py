"""Suffix decoding (Oliaro et al., SuffixDecoding): drafts from every text this process has seen.

The corpus holds the prompt and output of this run and of earlier runs (bounded: the oldest runs
are dropped first). Each round finds where the sequence's longest recent suffix (up to
`max_match` tokens) occurred in the corpus, counts what followed each occurrence, and follows the
most frequent continuation while its share of the occurrences stays above `min_share`; the draft
is at most `alpha` × the match length long, so a long match earns a long draft. Trees branch into
the runner-up continuations. No model: like n-gram drafting, but across requests, and scored.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator

import torch

from ..core.proposal import Draft, Proposal, empty_proposal
from ..core.tree import TokenTree, grow_tree

MAX_CORPUS_TOKENS = 200_000  # about 1.6 MB of int64 ids; the oldest runs go first beyond it


class SuffixCorpus:
    """Token sequences by run, oldest first, within `max_tokens` in all; safe across threads.

    Each run is kept with a -1 after it, so that no match spans two runs. Only the newest run
    changes from one round to the next, so the older runs stay flattened in one tensor and a
    round joins just the newest to them, one copy, instead of walking every run it holds."""

    def __init__(self, max_tokens: int = MAX_CORPUS_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._runs: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self._older: torch.Tensor | None = None  # every run but the newest, flattened
        self._flat: torch.Tensor | None = None
        self._tokens = 0  # kept as runs come and go: summing every run each round costs O(runs)

    def update(self, run: int, tokens: torch.Tensor) -> None:
        """Set run `run`'s sequence (it grows each round), then drop the oldest runs over the bound."""
        with self._lock:
            if not self._runs or next(reversed(self._runs)) != run:
                self._older = None  # a different run becomes the newest
            ids = tokens.detach().to("cpu", torch.long).flatten()
            if run in self._runs:
                self._tokens -= self._runs[run].numel() - 1
            self._runs[run] = torch.cat([ids, ids.new_full((1,), -1)])
            self._tokens += ids.numel()
            self._runs.move_to_end(run)
            while len(self._runs) > 1 and self._tokens > self.max_tokens:
                self._tokens -= self._runs.popitem(last=False)[1].numel() - 1
                self._older = None
            self._flat = None

    def snapshot(self) -> OrderedDict[int, torch.Tensor]:
        """The runs it holds now, for `restore` (an update replaces a run's tensor, never changes it)."""
        with self._lock:
            return OrderedDict(self._runs)

    def restore(self, runs: OrderedDict[int, torch.Tensor]) -> None:
        with self._lock:
            self._runs = OrderedDict(runs)
            self._tokens = sum(t.numel() - 1 for t in self._runs.values())
            self._older = self._flat = None

    def tokens(self) -> int:
        return self._tokens

    def flat(self) -> torch.Tensor:
        """Every run's tokens in one row, each followed by -1."""
        with self._lock:
            if self._flat is None:
                runs = list(self._runs.values())
                if self._older is None:
                    self._older = torch.cat(runs[:-1]) if len(runs) > 1 else torch.empty(0, dtype=torch.long)
                self._flat = torch.cat([self._older, *runs[-1:]])
            return self._flat


# Earlier runs in this process: what makes a repeated request cheap. Drafts show their tokens, so a
# server shared by several people must not hand one person's text to another's drafts: the app
# gives each visitor a corpus of their own (the command line and the API run one person's requests).
SHARED = SuffixCorpus()
_run_ids = itertools.count()


class SuffixDraft(Draft):
    kind = "suffix"
    name = "suffix"
    drafts_trees = True

    def __init__(
        self,
        corpus: SuffixCorpus = SHARED,
        max_match: int = 16,
        alpha: float = 2.0,
        min_share: float = 0.1,
        max_draft: int = 16,
    ) -> None:
        self.corpus, self.max_match, self.alpha = corpus, max_match, alpha
        self.min_share, self.max_draft = min_share, max_draft
        self.reset()

    def reset(self) -> None:
        self.run = next(_run_ids)  # a new sequence is a new entry: earlier ones stay in the corpus

    @contextlib.contextmanager
    def leaving_no_memory(self) -> Iterator[None]:
        runs = self.corpus.snapshot()
        try:
            yield
        finally:
            self.corpus.restore(runs)

    def longest_match(self, ids: torch.Tensor) -> tuple[int, torch.Tensor]:
        """The longest suffix of `ids` (up to `max_match`) found earlier in the corpus, and where each
        occurrence's continuation starts; (0, empty) when not even the last token recurs."""
        corpus = self.corpus.flat()
        ends = (corpus[:-1] == ids[-1]).nonzero().flatten()  # an occurrence needs a continuation
        ends = ends[corpus[ends + 1] >= 0]
        n = 0
        for length in range(1, min(self.max_match, ids.shape[0]) + 1):
            if length > 1:
                ok = ends - length + 1 >= 0
                ends = ends[ok]
                ends = ends[corpus[ends - length + 1] == ids[-length]]
            if ends.numel() == 0:
                break
            n, starts = length, ends + 1
        return (n, starts) if n else (0, corpus.new_empty(0))

    def continuations(
        self, corpus: torch.Tensor, starts: torch.Tensor, path: list[int]
    ) -> list[tuple[int, float]]:
        """What followed `path` after the matched occurrences, most frequent first, with its share."""
        offset = len(path)
        follow = starts[starts + offset < corpus.shape[0]]
        for i, token in enumerate(path):
            follow = follow[corpus[follow + i] == token]
        nxt = corpus[follow + offset] if follow.numel() else follow
        counts = Counter(t for t in nxt.tolist() if t >= 0)
        total = sum(counts.values())
        return [(t, c / total) for t, c in counts.most_common()]

    def propose(self, seq, k, sampling, generator, stop=None):
        ids = seq[0].cpu()  # the corpus lives in host memory
        self.corpus.update(self.run, ids)
        n, starts = self.longest_match(ids)
        if not n:
            return empty_proposal(seq.device)
        corpus = self.corpus.flat()
        budget = min(k, self.max_draft, max(1, int(self.alpha * n)))
        path: list[int] = []
        share = 1.0
        while len(path) < budget:
            options = self.continuations(corpus, starts, path)
            if not options or share * options[0][1] < self.min_share:
                break
            share *= options[0][1]
            path.append(options[0][0])
        if not path:
            return empty_proposal(seq.device)
        tokens = torch.tensor(path, device=seq.device)
        return Proposal(tokens, torch.ones(len(path), device=seq.device), None)

    def propose_tree(self, seq, depth, shape, stop_ids):
        """Children of a node: what followed the matched occurrences after the node's path, by share."""
        ids = seq[0].cpu()
        self.corpus.update(self.run, ids)
        n, starts = self.longest_match(ids)
        corpus = self.corpus.flat()

        def expand(tree: TokenTree, frontier: list[int]) -> list[list[tuple[int, float]]]:
            if not n:
                return [[] for _ in frontier]
            paths = [[tree.tokens[i] for i in tree.path(node)] for node in frontier]  # the root's is []
            return [self.continuations(corpus, starts, path) for path in paths]

        return grow_tree(expand, depth, shape, stop_ids)
