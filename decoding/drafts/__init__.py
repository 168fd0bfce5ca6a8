"""The draft sources, one module each, and `build_draft`, the factory that names them.

`ngram` (prompt lookup), `suffix` (suffix decoding over this and earlier runs), `model` (a smaller model with the target's
tokenizer), `layers` (the target's first N layers), `cross_tokenizer` (a model
with another tokenizer, through text), `head` (a trained EAGLE-3 head) and
`hybrid` (n-gram where the text repeats itself, the head elsewhere). Each
implements `decoding.core.proposal.Draft`; this module is the only one that
imports them all.
"""

from __future__ import annotations

from ..core.proposal import Draft
from ..errors import SpecLensError
from ..models.loading import LoadedModel, compile_forward, load_model
from ..models.paths import public_name
from ..runtime.rowlinear import use_row_kernel
from ..settings.policies import K_MAX
from .cross_tokenizer import CrossTokenizerDraft
from .head import HeadDraft, head_folder, load_head, shipped_head
from .hybrid import HYBRID_HEAD_K, HYBRID_MIN_MATCH, HybridDraft
from .layers import LayerDraft
from .model import ModelDraft
from .ngram import NGramDraft
from .suffix import SuffixDraft

__all__ = [
    "CrossTokenizerDraft",
    "HeadDraft",
    "HybridDraft",
    "LayerDraft",
    "ModelDraft",
    "NGramDraft",
    "SuffixDraft",
    "build_draft",
]


def build_draft(spec: str, target: LoadedModel) -> Draft | None:
    """`ngram`, `suffix`, `layers:N`, `head`, `head:PATH`, `ngram+head[@M][:PATH]`, `none`, or a model name for a separate draft
    model (one with another tokenizer drafts through text: see cross_tokenizer.py)."""
    spec = (spec or "").strip()
    if spec in ("", "none"):
        return None
    if spec == "ngram":
        return NGramDraft()
    if spec == "suffix":
        return SuffixDraft()
    if spec == "head" or spec.startswith("head:"):
        return _head_draft(spec, target)
    if spec.startswith("ngram+head"):
        return _hybrid_draft(spec, target)
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
    return CrossTokenizerDraft(draft, target.tokenizer, target.vocab_size, public_name(spec))


def _head_draft(spec: str, target: LoadedModel) -> Draft:
    if target.compiled:
        raise SpecLensError("a head draft reads the target's layers as it runs: use it without --compile")
    name = None if spec == "head" else spec.split(":", 1)[1].strip()
    folder = shipped_head(target.name) if name is None else head_folder(name, target.model.config)
    head = load_head(folder, target.model, target.device, target.dtype)
    if target.row_kernel:
        # Over the weights' own rows, not panels: the head runs one row at a time, where
        # the row kernel beat both F.linear and panels (docs/trained-head.md), and panels cost memory.
        use_row_kernel(head, panels=False)
    # A hub id as typed, a local folder by its last part: a trace names no folder of this machine.
    return HeadDraft(head, target.model, "head" if name is None else f"head:{public_name(name)}")


def _hybrid_draft(spec: str, target: LoadedModel) -> Draft:
    """`ngram+head`, `ngram+head@M` (n-gram where the last M or more tokens recur), `ngram+head@M/H`
    (the head drafting at most H tokens a round, 0 for the round's k), `…:PATH` (that head)."""
    rest = spec.removeprefix("ngram+head")
    settings, _, path = rest.partition(":")
    threshold, slash, cap = settings.removeprefix("@").partition("/")
    try:
        min_match = int(threshold) if threshold else HYBRID_MIN_MATCH
        head_k = int(cap) if slash else HYBRID_HEAD_K
    except ValueError:
        min_match = head_k = -1
    if (
        rest
        and not rest.startswith(("@", ":"))
        or not 1 <= min_match <= NGramDraft().max_ngram
        or not 0 <= head_k <= K_MAX
    ):
        raise SpecLensError(
            f"'{spec}': write ngram+head, ngram+head@M (M from 1 to 3), ngram+head@M/H "
            f"(the head drafting at most H tokens, 0 to {K_MAX}) or ngram+head:PATH"
        )
    head = _head_draft(f"head:{path}" if path else "head", target)
    return HybridDraft(NGramDraft(), head, min_match, head_k)


def same_tokenizer(target_tok, draft_tok) -> bool:
    """Whether a draft speaks the target's vocabulary token for token (else it drafts through text)."""
    return target_tok.get_vocab() == draft_tok.get_vocab()
