"""A round as the loop saw it (`RoundResult`, tensors on the device) and as the Trace keeps it."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..trace import DraftToken, Emitted, Round, TopToken, TreeNode, Verdict, verdict_kind
from .proposal import TOP_N, Proposal
from .tree import TokenTree, TreeVerdict
from .verify import Verification


class RoundResult(NamedTuple):
    """One round as the loop saw it; the verdict's tensors are still on the device."""

    proposal: Proposal
    verdict: Verification
    new_tokens: list[int]  # what the round added to the output
    emitted: int | None  # the target's own token; None when an accepted EOS ended the text
    finished: bool  # the text ended (EOS) in this round
    draft_s: float
    verify_s: float
    round_s: float
    elapsed_s: float = 0.0  # decoding time since the start, prefill included; the consumer's is not
    # A tree round: the tree and its verdict. `proposal` and `verdict` are then its main
    # line: the accepted path and the best child refused after it.
    tree: tuple[TokenTree, TreeVerdict] | None = None


def record_round(r: RoundResult, token_text: Callable[[int], str]) -> Round:
    """The Trace's view of a round: every draft token, its verdict, and where the round turned."""
    proposal, v, emitted = r.proposal, r.verdict, r.emitted
    ids = proposal.tokens.tolist()
    n = v.n_accepted
    # Past the first refused token nothing was judged: the target scored those
    # after a prefix it had refused, so their numbers are not recorded.
    p = v.p.tolist()[: n + 1]
    accept_prob = v.accept_prob.tolist()[: n + 1]
    u = v.u.tolist()[: n + 1] if v.u is not None else []
    judged = range(min(n + 1, len(ids)))
    h = [round(x, 4) for x in v.entropy.tolist()] if v.entropy is not None else [None] * (n + 1)
    verdicts = [
        Verdict(p[j], accept_prob[j], u[j] if u else None, j < n, verdict_kind(j, n), h[j]) for j in judged
    ]
    verdicts += [Verdict(None, None, None, False, "discarded") for _ in range(n + 1, len(ids))]
    return Round(
        drafted=len(ids),
        draft=[DraftToken(t, token_text(t), qi) for t, qi in zip(ids, proposal.q.tolist())],
        verdicts=verdicts,
        n_accepted=n,
        emitted=None
        if emitted is None
        else Emitted(emitted, token_text(emitted), _emitted_kind(n, len(ids)), float(v.p_emitted), h[n]),
        draft_ms=0.0,
        verify_ms=0.0,
        round_ms=0.0,
        target_top=_top_of(v.dist, token_text),
        # The draft's favourites at the refused position; a bonus position has none.
        draft_top=None
        if n >= len(ids) or proposal.top is None
        else _top(proposal.top[0][n], proposal.top[1][n], token_text),
        residual_top=None if v.residual is None else _top_of(v.residual, token_text),
        match=proposal.match,
        tree=None if r.tree is None else _tree_nodes(*r.tree, token_text),
        translation=proposal.translation,
        source=proposal.source,
    )


def _tree_nodes(tree: TokenTree, v: TreeVerdict, token_text: Callable[[int], str]) -> list[TreeNode]:
    path = set(v.path)
    return [
        TreeNode(
            id=t,
            text=token_text(t),
            q=tree.q[i],
            parent=tree.parents[i],
            depth=tree.depth(i),
            p=v.judged[i].p if i in v.judged else None,
            accepted=i in path,
        )
        for i, t in enumerate(tree.tokens)
    ]


def _top(probs: torch.Tensor, ids: torch.Tensor, token_text: Callable[[int], str]) -> list[TopToken]:
    return [TopToken(i, token_text(i), p) for i, p in zip(ids.tolist(), probs.tolist())]


def _top_of(dist: torch.Tensor, token_text: Callable[[int], str]) -> list[TopToken]:
    """The TOP_N most likely tokens of a distribution."""
    return _top(*torch.topk(dist.float(), min(TOP_N, dist.shape[-1])), token_text)


def _emitted_kind(n_accepted: int, k: int) -> str:
    """The target's own token: alone when nothing was drafted, a bonus after a fully kept draft,
    else a correction."""
    if k == 0:
        return "target"
    return "bonus" if n_accepted == k else "correction"
