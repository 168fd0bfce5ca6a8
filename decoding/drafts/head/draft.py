"""The head as a draft source: k tokens from one target pass's features."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn

from ...core.proposal import TOP_N, Draft, Proposal, empty_proposal
from ...core.tree import TokenTree, grow_tree, level_mask
from ...core.verify import warp
from ...settings.sampling import Sampling
from .kernel import HeadKernel, kernel_step
from .model import EagleHead, HeadCache
from .tap import FeatureTap


@dataclass
class _Pick:
    token: torch.Tensor
    q: torch.Tensor
    dist: torch.Tensor | None  # the target-width distribution it was drawn from (sampling only)
    top: tuple[torch.Tensor, torch.Tensor]  # the favourites' probabilities and ids
    probs: torch.Tensor  # over the draft vocabulary, for the stop rule


@dataclass
class _Chain:
    """A chain drafted one token at a time."""

    tokens: list[torch.Tensor] = field(default_factory=list)
    qs: list[torch.Tensor] = field(default_factory=list)
    dists: list[torch.Tensor] = field(default_factory=list)
    tops: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def add(self, pick: _Pick) -> None:
        self.tokens.append(pick.token)
        self.qs.append(pick.q)
        self.tops.append(pick.top)
        if pick.dist is not None:
            self.dists.append(pick.dist)

    def proposal(self, device: torch.device) -> Proposal:
        return Proposal.from_steps(self.tokens, self.qs, self.dists, self.tops, device)


class HeadDraft(Draft):
    """Drafts with a trained head reading the target's features; `kind` "head".

    Its steps run through the layer kernel where the head's linear layers are the
    row kernel's (the default CPU mode, `kernel.py`), else through its own modules;
    `kernel=False` keeps the modules."""

    kind = "head"
    drafts_trees = True

    def __init__(self, head: EagleHead, target: nn.Module, name: str, kernel: bool = True) -> None:
        self.head = head
        self.stepper: EagleHead | HeadKernel = (kernel and kernel_step(head)) or head
        self.embed = target.get_input_embeddings()
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        self.tap = FeatureTap.on(target, head.c.aux_layers)
        self.name = name
        self.cache = HeadCache()
        self.fed = 0  # target positions the head has read (its cache's real rows)
        self.rows: dict[int, list[torch.Tensor]] = {}  # tapped from the target, not yet read

    def reset(self) -> None:
        self.cache = HeadCache()
        self.fed = 0
        self.rows = {}

    def watching_target(self) -> contextlib.AbstractContextManager:
        return self.tap.recording(self.rows)

    def watching_together(self, drafts, rows) -> contextlib.AbstractContextManager:
        return self.tap.recording_split([d.rows for d in drafts], rows)

    def _unread(self, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The target's features the head has not read and the embeddings of the tokens after
        them: a step's input, or None when the features do not line up with `seq`."""
        feats = self.tap.take(self.rows)
        n = feats.shape[0]
        if n == 0 or self.fed + n != seq.shape[1] - 1:
            return None
        # Feature of position t, embedding of token t+1: the last row predicts the next token.
        return self.embed(seq[0, self.fed + 1 :]).to(self.head.fc.weight.dtype), feats

    def _read_target(self, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Feed the head the target's new features: the output row that predicts the
        token after `seq` and its logits, or None when the features do not line up with `seq`."""
        unread = self._unread(seq)
        if unread is None:
            return None
        emb, feats = unread
        out, logits = self.stepper.step_logits(emb, self.head.fc(feats.to(emb.dtype)), self.cache)
        self.fed += emb.shape[0]
        return out[-1:], logits

    def _pick(self, logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> _Pick:
        """The drafted token from one row of the head's logits, its q, the distribution it was drawn
        from (sampling only), the draft's favourites and the probabilities over the draft vocabulary."""
        draft_ids = self.head.draft_ids
        logits, full = logits.float(), None
        if sampling.greedy:
            # Over the draft vocabulary only: the rest of the target's has probability 0.
            probs = logits.softmax(-1)
            top = torch.topk(probs, min(TOP_N, probs.shape[0]))
            pick = top.indices[0]  # the trace's favourites give the greedy pick: no argmax to run
        else:
            full = self._full_width(logits, draft_ids, sampling)
            probs = full[draft_ids]
            pick = torch.multinomial(probs, 1, generator=generator)[0]
            top = torch.topk(probs, min(TOP_N, probs.shape[0]))
        return _Pick(draft_ids[pick], probs[pick], full, (top.values, draft_ids[top.indices]), probs)

    @torch.inference_mode()
    def propose(self, seq, k, sampling, generator, stop=None):
        read = self._read_target(seq)
        if read is None or k < 1:
            return empty_proposal(seq.device)  # draft nothing
        out, logits = read
        chain = _Chain()
        while True:
            pick = self._pick(logits[0], sampling, generator)
            chain.add(pick)
            if len(chain.tokens) == k or (stop is not None and stop.stops(pick.probs)):
                return chain.proposal(seq.device)
            emb = self.embed(pick.token.view(1)).to(self.head.fc.weight.dtype)
            out, logits = self.stepper.step_logits(emb, out, self.cache)

    def drafts_together(self) -> bool:
        return isinstance(self.stepper, HeadKernel)

    @torch.inference_mode()
    def propose_together(self, drafts, seqs, ks, sampling, generators, stops):
        """Each step of every sequence's chain in one kernel call (`HeadKernel.step_together`):
        the head's weights stream once a step for the whole batch, not once per sequence. Each
        sequence drafts the tokens its own `propose` would."""
        if not self.drafts_together():
            return super().propose_together(drafts, seqs, ks, sampling, generators, stops)
        unread = [d._unread(seq) if k > 0 else None for d, seq, k in zip(drafts, seqs, ks, strict=True)]
        live = [i for i, u in enumerate(unread) if u is not None]
        chains = [_Chain() for _ in drafts]
        if not live:
            return [chain.proposal(seq.device) for chain, seq in zip(chains, seqs, strict=True)]
        dtype = self.head.fc.weight.dtype
        emb = [unread[i][0] for i in live]
        feature = self.head.fc(torch.cat([unread[i][1] for i in live]).to(dtype))
        for i, e in zip(live, emb):
            drafts[i].fed += e.shape[0]
        while live:
            counts = [e.shape[0] for e in emb]
            out, logits = self.stepper.step_together(
                torch.cat(emb), feature, [drafts[i].cache for i in live], counts
            )
            ends = torch.tensor(counts).cumsum(0) - 1
            going = []  # (sequence, its last output row, its token) of the chains that go on
            for j, i in enumerate(live):
                pick = drafts[i]._pick(logits[j], sampling, generators[i])
                chains[i].add(pick)
                if len(chains[i].tokens) < ks[i] and not (
                    stops[i] is not None and stops[i].stops(pick.probs)
                ):
                    going.append((i, out[ends[j]], pick.token))
            live = [i for i, _, _ in going]
            emb = [self.embed(token.view(1)).to(dtype) for _, _, token in going]
            feature = torch.stack([row for _, row, _ in going]) if going else None
        return [chain.proposal(seq.device) for chain, seq in zip(chains, seqs, strict=True)]

    def _full_width(
        self, draft_logits: torch.Tensor, draft_ids: torch.Tensor, sampling: Sampling
    ) -> torch.Tensor:
        # Sampling is verified against the target's whole vocabulary, so the draft's
        # distribution is spread over it, with 0 outside the draft vocabulary.
        logits = torch.full((self.vocab_size,), float("-inf"), device=draft_logits.device)
        logits[draft_ids] = draft_logits
        return warp(logits, sampling)

    @torch.inference_mode()
    def propose_tree(self, seq, depth, shape, stop_ids):
        """Each level is one head step over the nodes it expands: a node reads its own
        token's embedding and, as its feature, the output row that proposed it (EAGLE's
        draft-time input), seeing the real rows and its ancestors only."""
        read = self._read_target(seq)
        if read is None:
            return TokenTree()
        head, dtype = self.head, self.head.fc.weight.dtype
        outputs: dict[int, torch.Tensor] = {-1: read[0][0]}  # node -> the output row after it
        logits: dict[int, torch.Tensor] = {-1: read[1][0]}  # node -> the logits of that row
        slots: dict[int, int] = {}

        def expand(tree: TokenTree, frontier: list[int]) -> list[list[tuple[int, float]]]:
            if frontier != [-1]:
                past = len(self.cache)
                ids = torch.tensor([tree.tokens[i] for i in frontier], device=seq.device)
                rows, level = self.stepper.step_logits(
                    self.embed(ids).to(dtype),
                    torch.stack([outputs[tree.parents[i]] for i in frontier]),
                    self.cache,
                    positions=torch.tensor(
                        [self.fed - 1 + tree.depth(i) for i in frontier], device=seq.device
                    ),
                    mask=level_mask(tree, frontier, slots, self.fed, past).to(seq.device),
                    keep=len(frontier),
                )
                slots.update({node: past + j for j, node in enumerate(frontier)})
                outputs.update(zip(frontier, rows))
                logits.update(zip(frontier, level))
            probs = torch.stack([logits[i] for i in frontier]).float().softmax(-1)
            top = torch.topk(probs, min(shape.branch, probs.shape[-1]))
            ids = head.draft_ids[top.indices]
            return [list(zip(i.tolist(), p.tolist())) for p, i in zip(top.values, ids)]

        try:
            return grow_tree(expand, depth, shape, stop_ids)
        finally:
            self.cache.crop(self.fed)

    def rollback(self, length: int, rows: list[int] | None = None) -> None:
        # Only the rows the target read from its own features are real; the
        # drafted rows go. Of the tapped rows, those past `length` (or, after a
        # tree round, those of its pass not in `rows`) were refused. Rows of
        # earlier passes the head has not read yet (a hybrid's n-gram rounds) stay.
        self.cache.crop(self.fed)
        keep = length - self.fed
        for i, parts in self.rows.items():
            if rows is None:
                self.rows[i] = [torch.cat(parts, dim=0)[:keep]]
            else:
                self.rows[i] = [*parts[:-1], parts[-1][rows]]
