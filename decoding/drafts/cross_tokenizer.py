"""A draft model with another tokenizer (Universal Assisted Generation, arXiv 2502.05202).

The draft reads the target's text so far re-encoded in its own tokens, writes on in
its own tokens, and what it wrote goes back to the target as target tokens:

- greedy ("text"): the draft's new text is encoded with the target's tokenizer, so a
  word the two vocabularies cut differently still arrives whole. Any candidates are
  fine here: the target's check keeps the output exactly its own.
- sampling ("vocab"): only tokens whose text is the same in both vocabularies may be
  drafted, one target token per draft token, so the draft's distribution maps onto
  the target's vocabulary and the rejection rule stays exact.

Its KV cache is rolled back in draft tokens at the start of each round: to the
longest prefix of what it holds that the target's text, re-encoded, still begins with.
"""

from __future__ import annotations

import torch

from ..core.proposal import Draft, Proposal, fit_vocab
from ..core.verify import warp
from ..models.loading import LoadedModel
from ..runtime.forward import crop, forward, new_cache
from ..settings.policies import StopRule
from ..settings.sampling import Sampling
from ..trace import Translation

LOOK_BEHIND = 4  # draft tokens decoded before new ones, so a leading space decodes as it should
EXTRA_DRAFT_TOKENS = 2  # the vocabularies cut words differently: k target tokens may take a few more

_shared_cache: dict[tuple[int, int], tuple[object, object, torch.Tensor]] = {}


def shared_vocabulary(draft_tok, target_tok, target_width: int) -> torch.Tensor:
    """For each draft token id, the target token with exactly its text, or -1.

    Special tokens and pieces of a character (they decode to U+FFFD) are left out;
    the draft's end of text maps to the target's. Computed once per pair of
    tokenizers in a process (about 3 s for SmolLM2's 49k tokens).
    """
    key = (id(draft_tok), id(target_tok))
    if key not in _shared_cache:
        specials = set(draft_tok.all_special_ids)
        ids = [i for i in range(len(draft_tok)) if i not in specials]
        texts = draft_tok.batch_decode([[i] for i in ids])
        encoded = target_tok(texts, add_special_tokens=False)["input_ids"]
        table = torch.full((len(draft_tok),), -1, dtype=torch.long)
        for i, text, tids in zip(ids, texts, encoded):
            whole = text and "\ufffd" not in text  # not part of a character
            if whole and len(tids) == 1 and tids[0] < target_width and target_tok.decode(tids) == text:
                table[i] = tids[0]
        d_eos, t_eos = draft_tok.eos_token_id, target_tok.eos_token_id
        if d_eos is not None and t_eos is not None:
            table[d_eos] = t_eos
        _shared_cache[key] = (draft_tok, target_tok, table)  # the tokenizers held: ids stay theirs
    return _shared_cache[key][2]


class CrossTokenizerDraft(Draft):
    """A smaller causal LM whose tokenizer is not the target's."""

    kind = "cross"

    def __init__(self, draft: LoadedModel, target_tok, target_width: int, name: str) -> None:
        self.model = draft.model
        self.tok = draft.tokenizer
        self.target_tok = target_tok
        self.width = target_width
        self.name = name
        self.device = draft.device
        self.eos = {draft.tokenizer.eos_token_id} - {None}
        self.target_eos = target_tok.eos_token_id
        # The target's BOS and padding are markers, not text: the draft puts its own BOS, once.
        self.target_markers = {target_tok.bos_token_id, target_tok.pad_token_id} - {None}
        probe = self.tok("a")["input_ids"]
        self.bos = probe[0] if len(probe) > 1 and probe[0] == self.tok.bos_token_id else None
        self.reset()

    def reset(self) -> None:
        self.cache = new_cache(self.model)
        self.seen: list[int] = []  # the draft tokens the cache holds, in order

    # -- the two vocabularies ------------------------------------------------------

    def context(self, seq: torch.Tensor) -> list[int]:
        """The target's sequence as text, in the draft's own tokens."""
        ids = [t for t in seq[0].tolist() if t not in self.target_markers]
        text = self.target_tok.decode(ids, skip_special_tokens=False).rstrip("\ufffd")
        out = self.tok(text, add_special_tokens=False)["input_ids"]
        if self.bos is not None and out[:1] != [self.bos]:
            out = [self.bos, *out]
        return out

    def text_after(self, context: list[int], drafted: list[int]) -> str:
        """The text `drafted` adds after `context` (a character still incomplete left out)."""
        tail = context[-LOOK_BEHIND:]
        before = self.tok.decode(tail, skip_special_tokens=True)
        after = self.tok.decode(tail + drafted, skip_special_tokens=True)
        text = after[len(before) :] if after.startswith(before) else self.tok.decode(drafted)
        return text.rstrip("\ufffd")

    def to_target(self, text: str) -> list[int]:
        return self.target_tok(text, add_special_tokens=False)["input_ids"] if text else []

    # -- drafting --------------------------------------------------------------------

    def propose(self, seq, k, sampling, generator, stop=None):
        context = self.context(seq)
        fresh = self._roll_back_to(context)
        if sampling.greedy:
            return self._propose_text(context, fresh, k, stop)
        return self._propose_vocab(context, fresh, k, sampling, generator, stop)

    def _roll_back_to(self, context: list[int]) -> list[int]:
        """Keep the cache's longest prefix that `context` still begins with; the rest of
        `context` is what the next pass must read (at least its last token)."""
        same = 0
        for a, b in zip(self.seen, context[:-1]):
            if a != b:
                break
            same += 1
        crop(self.cache, same)
        self.seen = self.seen[:same]
        return context[same:]

    def _step(self, fresh: list[int]) -> torch.Tensor:
        logits = forward(self.model, torch.tensor([fresh], device=self.device), self.cache, keep=1)[-1]
        self.seen += fresh
        return logits.float()

    def _propose_text(self, context: list[int], fresh: list[int], k: int, stop: StopRule | None) -> Proposal:
        drafted, probs = [], []
        for _ in range(k + EXTRA_DRAFT_TOKENS):
            p = self._step(fresh).softmax(-1)
            token = int(p.argmax())
            drafted.append(token)
            probs.append(float(p[token]))
            if token in self.eos or (stop is not None and stop.stops(p)):
                break
            # k target tokens are enough, even when the k-th is a word's first piece: another
            # draft step to finish the word would cost most of a target step on a CPU.
            if len(self.to_target(self.text_after(context, drafted))) >= k:
                break
            fresh = [token]
        ended = drafted[-1] in self.eos
        words = drafted[:-1] if ended else drafted
        targets = self.to_target(self.text_after(context, words))[:k]
        if ended and len(targets) < k and self.target_eos is not None:
            targets.append(self.target_eos)
        translation = self._translation(context, drafted, targets)
        # A target token's q: the draft's probability of the first draft token it came from.
        q = [probs[src[0]] if src else 1.0 for src in translation.sources]
        tokens = torch.tensor(targets, dtype=torch.long, device=self.device)
        return Proposal(tokens, torch.tensor(q, device=self.device), None, translation=translation)

    def _propose_vocab(
        self,
        context: list[int],
        fresh: list[int],
        k: int,
        sampling: Sampling,
        generator: torch.Generator,
        stop: StopRule | None,
    ) -> Proposal:
        table = shared_vocabulary(self.tok, self.target_tok, self.width).to(self.device)
        allowed = table >= 0
        drafted, tokens, qs, dists = [], [], [], []
        for _ in range(k):
            logits = fit_vocab(self._step(fresh), table.shape[0]).masked_fill(~allowed, float("-inf"))
            p = warp(logits, sampling)
            x = torch.multinomial(p, 1, generator=generator)[0]
            dist = torch.zeros(self.width, device=self.device).index_add_(0, table[allowed], p[allowed])
            tokens.append(table[x])
            qs.append(dist[table[x]])
            dists.append(dist)
            drafted.append(int(x))
            if drafted[-1] in self.eos or (stop is not None and stop.stops(p)):
                break
            fresh = [drafted[-1]]
        targets = [int(t) for t in tokens]
        translation = self._translation(context, drafted, targets, one_to_one=True)
        return Proposal(torch.stack(tokens), torch.stack(qs), torch.stack(dists), translation=translation)

    def _translation(
        self, context: list[int], drafted: list[int], targets: list[int], one_to_one: bool = False
    ) -> Translation:
        """The draft's own tokens this round, and which of them each target token came from."""
        ends, texts = [], []
        for i in range(len(drafted)):
            ends.append(len(self.text_after(context, drafted[: i + 1])))
            texts.append(self.tok.decode(drafted[i : i + 1], skip_special_tokens=False))
        if one_to_one:
            sources = [[j] for j in range(len(targets))]
        else:
            sources = _overlaps(ends, self._target_ends(targets))
            if targets and targets[-1] == self.target_eos and drafted[-1] in self.eos:
                sources[-1] = [len(drafted) - 1]
        return Translation(drafted, texts, sources, "vocab" if one_to_one else "text")

    def _target_ends(self, targets: list[int]) -> list[int]:
        return [
            len(self.target_tok.decode(targets[: j + 1], skip_special_tokens=True))
            for j in range(len(targets))
        ]


def _overlaps(draft_ends: list[int], target_ends: list[int]) -> list[list[int]]:
    """For each target character span, the draft tokens whose spans overlap it."""
    out, start = [], 0
    for end in target_ends:
        out.append([i for i, e in enumerate(draft_ends) if e > start and (i == 0 or draft_ends[i - 1] < end)])
        start = end
    return out
