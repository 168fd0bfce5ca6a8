"""A separate, smaller causal LM with the target's tokenizer, drafting with its own KV cache."""

from __future__ import annotations

import torch

from ..core.proposal import TOP_N, Draft, Proposal, fit_vocab
from ..core.tree import TokenTree, additive, grow_tree, level_mask
from ..core.verify import warp
from ..runtime.forward import crop, forward, forward_batch, new_cache
from ..settings.sampling import Sampling


class ModelDraft(Draft):
    """A smaller causal LM with the target's tokenizer, with its own KV cache."""

    kind = "model"
    drafts_trees = True

    def __init__(self, model: torch.nn.Module, vocab_size: int, name: str) -> None:
        self.model = model
        self.vocab_size = vocab_size  # the target's logits width
        self.name = name
        self.reset()

    def reset(self) -> None:
        self.cache = None  # first: a static cache holds its model's buffers (runtime/static.py)
        self.cache = new_cache(self.model)

    def propose(self, seq, k, sampling, generator, stop=None):
        # Only the tokens the cache has not seen yet: after a round that
        # kept everything, the last draft token and the bonus token.
        fresh = seq[:, self.cache.get_seq_length() :]
        chain = _Chain()
        for _ in range(k):
            probs = chain.add(
                forward(self.model, fresh, self.cache, keep=1)[-1], self.vocab_size, sampling, generator
            )
            fresh = chain.tokens[-1].view(1, 1)
            if stop is not None and stop.stops(probs):
                break
        return chain.proposal(seq.device)

    def drafts_together(self) -> bool:
        return True

    @torch.inference_mode()
    def propose_together(self, drafts, seqs, ks, sampling, generators, stops):
        """Each step of every sequence's chain in one pass of the draft model over all their caches
        (`forward_batch`: on the CPU its weights stream once a step for the whole batch). Each
        sequence drafts the tokens its own `propose` would: a row's sums do not depend on the batch."""
        chains = [_Chain() for _ in drafts]
        live = [i for i, k in enumerate(ks) if k > 0]
        fresh = {i: seqs[i][:, drafts[i].cache.get_seq_length() :] for i in live}
        while live:
            logits = forward_batch(self.model, [fresh[i] for i in live], [drafts[i].cache for i in live])
            going = []
            for i, rows in zip(live, logits, strict=True):
                probs = chains[i].add(rows[-1], self.vocab_size, sampling, generators[i])
                fresh[i] = chains[i].tokens[-1].view(1, 1)
                if len(chains[i].tokens) < ks[i] and not (stops[i] is not None and stops[i].stops(probs)):
                    going.append(i)
            live = going
        return [chain.proposal(seq.device) for chain, seq in zip(chains, seqs, strict=True)]

    def rollback(self, length: int, rows: list[int] | None = None) -> None:
        crop(self.cache, length)

    def propose_tree(self, seq, depth, shape, stop_ids):
        """Each level is one pass of the draft over the nodes it expands, each node
        seeing `seq` and its own ancestors; the cache is back at `seq` afterwards."""
        start = seq.shape[1]
        slots: dict[int, int] = {}  # node -> its position in the draft's cache

        def expand(tree: TokenTree, frontier: list[int]) -> list[list[tuple[int, float]]]:
            past = self.cache.get_seq_length()
            if frontier == [-1]:
                logits = forward(self.model, seq[:, past:], self.cache, keep=1)
            else:
                ids = torch.tensor([[tree.tokens[i] for i in frontier]], device=seq.device)
                positions = torch.tensor([[start - 1 + tree.depth(i) for i in frontier]], device=seq.device)
                allowed = level_mask(tree, frontier, slots, start, past).to(seq.device)
                mask = additive(allowed, self.model.dtype)[None, None]
                logits = forward(self.model, ids, self.cache, position_ids=positions, mask=mask)
                slots.update({node: past + j for j, node in enumerate(frontier)})
            top = torch.topk(fit_vocab(logits, self.vocab_size).float().softmax(-1), shape.branch)
            return [list(zip(i.tolist(), p.tolist())) for p, i in zip(top.values, top.indices)]

        try:
            return grow_tree(expand, depth, shape, stop_ids)
        finally:
            crop(self.cache, start)


class _Chain:
    """A chain drafted one token at a time, each from the draft's logits at the chain's end."""

    def __init__(self) -> None:
        self.tokens, self.qs, self.dists, self.tops = [], [], [], []

    def add(
        self, logits: torch.Tensor, vocab_size: int, sampling: Sampling, generator: torch.Generator
    ) -> torch.Tensor:
        """Picks the next token from `logits` (greedy, or drawn from the warped distribution) and
        returns the distribution it was picked from."""
        logits = fit_vocab(logits, vocab_size)
        if sampling.greedy:
            probs = logits.float().softmax(-1)
            token = probs.argmax()
        else:
            probs = warp(logits, sampling)
            token = torch.multinomial(probs, 1, generator=generator)[0]
            self.dists.append(probs)
        self.tokens.append(token)
        self.qs.append(probs[token])
        self.tops.append(torch.topk(probs, TOP_N))
        return probs

    def proposal(self, device: torch.device) -> Proposal:
        return Proposal.from_steps(self.tokens, self.qs, self.dists, self.tops, device)
