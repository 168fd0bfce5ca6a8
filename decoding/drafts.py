"""Things that propose tokens: one small interface, one class per draft source.

A draft sees the whole sequence so far (`seq`, [1, n] on the device) and
proposes up to k tokens. It keeps whatever state it likes (a KV cache) and
is told after each round how much of the sequence is still valid.
"""

from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass

import torch

from .errors import SpecLensError
from .forward import crop, forward, new_cache
from .models import LoadedModel, compile_forward, load_model, public_name, same_tokenizer
from .rowlinear import use_row_kernel
from .sampling import Sampling
from .trace import Match, Translation
from .tree import TokenTree, TreeShape, additive, grow_tree, level_mask
from .verify import warp

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
        min_confidence: float | None = None,
    ) -> Proposal:
        """Up to k tokens to follow `seq`; stop early below `min_confidence`."""

    def rollback(self, length: int, rows: list[int] | None = None) -> None:
        """Only the first `length` tokens of what was seen are still valid. After a tree
        round, `rows` are the rows of the target's pass that were kept (the root's and
        the accepted path's), in order."""

    def propose_tree(
        self, seq: torch.Tensor, depth: int, shape: TreeShape, stop_ids: Collection[int]
    ) -> TokenTree:
        """A tree of up to `shape.nodes` tokens, `depth` deep, to follow `seq` (see decoding/tree.py)."""
        raise SpecLensError(f"a {self.kind} draft cannot draft a token tree yet: use a chain (tree nodes 0)")

    def watching_target(self) -> contextlib.AbstractContextManager:
        """The loop runs each target pass inside this: a head draft reads the target's features there."""
        return contextlib.nullcontext()


def empty_proposal(device: torch.device) -> Proposal:
    return Proposal(torch.empty(0, dtype=torch.long, device=device), torch.empty(0, device=device), None)


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
        self.cache = new_cache(self.model)

    def propose(self, seq, k, sampling, generator, min_confidence=None):
        # Only the tokens the cache has not seen yet: after a round that
        # kept everything, the last draft token and the bonus token.
        fresh = seq[:, self.cache.get_seq_length() :]
        tokens, qs, dists, tops = [], [], [], []
        for _ in range(k):
            logits = fit_vocab(forward(self.model, fresh, self.cache, keep=1)[-1], self.vocab_size)
            if sampling.greedy:
                probs = logits.float().softmax(-1)
                token = probs.argmax()
            else:
                probs = warp(logits, sampling)
                token = torch.multinomial(probs, 1, generator=generator)[0]
                dists.append(probs)
            tokens.append(token)
            qs.append(probs[token])
            tops.append(torch.topk(probs, TOP_N))
            fresh = token.view(1, 1)
            if min_confidence is not None and probs.max().item() < min_confidence:
                break
        if not tokens:
            return empty_proposal(seq.device)
        top = (torch.stack([t.values for t in tops]), torch.stack([t.indices for t in tops]))
        return Proposal(torch.stack(tokens), torch.stack(qs), torch.stack(dists) if dists else None, top)

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


def fit_vocab(logits: torch.Tensor, width: int) -> torch.Tensor:
    # Same tokenizer, different padding of the embedding matrix (Qwen2.5
    # 0.5B vs 7B): ids past the target's width can never be proposed.
    n = logits.shape[-1]
    if n > width:
        return logits[..., :width]
    if n < width:
        return torch.nn.functional.pad(logits, (0, width - n), value=float("-inf"))
    return logits


class LayerDraft(ModelDraft):
    """The target's first N layers plus its final norm and head (a self-draft).

    The weights are the target's own modules, shared, not copied; only the
    KV cache is separate.
    """

    kind = "layers"

    def __init__(self, target: torch.nn.Module, n_layers: int, vocab_size: int) -> None:
        super().__init__(cut_layers(target, n_layers), vocab_size, f"layers:{n_layers}")


def cut_layers(model: torch.nn.Module, n_layers: int) -> torch.nn.Module:
    total = model.config.num_hidden_layers
    if not 1 <= n_layers < total:
        raise SpecLensError(f"layers:N needs 1 <= N < {total} (the target's layer count), got {n_layers}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:n_layers]
    with torch.device("meta"):
        cut = type(model)(config)
    for name, child in model.model.named_children():
        setattr(cut.model, name, child)
    cut.model.layers = torch.nn.ModuleList(model.model.layers[:n_layers])
    cut.lm_head = model.lm_head
    left = [n for n, t in [*cut.named_parameters(), *cut.named_buffers()] if t.is_meta]
    if left:
        raise SpecLensError(f"cannot cut layers from {type(model).__name__}: {left[0]} is not shared")
    return cut.eval()


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

    def continuations(self, ids: torch.Tensor) -> list[tuple[int, float]]:
        """What followed the earlier occurrences of the longest suffix (up to `max_ngram`) that recurs."""
        length = ids.shape[0]
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            windows = ids.unfold(0, n, 1)[: length - n]
            hits = (windows == ids[length - n :]).all(-1).nonzero().flatten()
            if hits.numel():
                following = ids[hits + n].tolist()  # in order of occurrence
                votes = {t: following.count(t) for t in dict.fromkeys(following)}
                ranked = sorted(votes, key=lambda t: -votes[t])  # stable: ties stay earliest first
                return [(t, votes[t] / len(following)) for t in ranked]
        return []

    def propose(self, seq, k, sampling, generator, min_confidence=None):
        ids = seq[0]
        length = ids.shape[0]
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            windows = ids.unfold(0, n, 1)[: length - n]  # every n-gram with a continuation
            hits = (windows == ids[length - n :]).all(-1).nonzero()
            if hits.numel():
                start = int(hits[0]) + n
                tokens = ids[start : start + k]
                ones = torch.ones(tokens.shape[0], device=ids.device)
                return Proposal(tokens, ones, None, match=Match(start, n))
        return empty_proposal(seq.device)


def build_draft(spec: str, target: LoadedModel) -> Draft | None:
    """`ngram`, `layers:N`, `head`, `head:PATH`, `none`, or a model name for a separate draft
    model (one with another tokenizer drafts through text: see decoding/crossdraft.py)."""
    spec = (spec or "").strip()
    if spec in ("", "none"):
        return None
    if spec == "ngram":
        return NGramDraft()
    if spec == "head" or spec.startswith("head:"):
        return _head_draft(spec, target)
    if spec.startswith("layers:"):
        try:
            n = int(spec.split(":", 1)[1])
        except ValueError:
            raise SpecLensError(f"layers:N needs a whole number N, got '{spec}'") from None
        draft = LayerDraft(target.model, n, target.vocab_size)
        if target.compiled:
            compile_forward(draft.model)
        return draft
    draft = load_model(spec, str(target.device), str(target.dtype).removeprefix("torch."), target.compiled)
    if same_tokenizer(target.tokenizer, draft.tokenizer):
        return ModelDraft(draft.model, target.vocab_size, public_name(spec))
    from .crossdraft import CrossTokenizerDraft  # crossdraft builds on this module

    return CrossTokenizerDraft(draft, target.tokenizer, target.vocab_size, public_name(spec))


def _head_draft(spec: str, target: LoadedModel) -> Draft:
    from .heads import HeadDraft, load_head, shipped_head  # heads builds on this module

    if target.compiled:
        raise SpecLensError("a head draft reads the target's layers as it runs: use it without --compile")
    folder = shipped_head(target.name) if spec == "head" else spec.split(":", 1)[1].strip()
    head = load_head(folder, target.model, target.device, target.dtype)
    if target.row_kernel:  # 1.1 ms a drafted token on 2 cores, 3.5 through F.linear
        # Over the weights' own rows: the head runs one row at a time, where panels
        # of its small matrices (576 outputs) took 1.3 ms, and packing costs memory.
        use_row_kernel(head, panels=False)
    return HeadDraft(head, target.model, "head" if spec == "head" else f"head:{public_name(str(folder))}")
