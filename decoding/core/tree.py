"""Token trees: several continuations drafted per round, all checked in one target pass.

A tree's nodes are listed parents first. Node i holds a token, its parent
(-1: a child of the root, the last verified token), the draft's probability
of the token after its parent's path (`q`) and of the whole path (`score`).
The draft grows it best first (EAGLE-2's dynamic tree): each level expands
the `branch` best nodes of the level before into their `branch` likeliest
tokens, and the `nodes` best of everything drafted are kept.

The target reads the root and every node in one pass, each node seeing the
cache, the root and its own ancestors only (a 4D mask and position ids by
depth). Verification walks from the root: at each node the children are
tried best first. Greedy keeps the child equal to the target's argmax.
Sampling treats the children as fixed candidates: a child x is kept with the
probability the current distribution gives it, and after a refusal x's mass
is removed and the rest renormalised, so whichever token ends up chosen
follows the target's distribution exactly (recursive rejection sampling
with one-hot drafts).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch

from ..errors import SpecLensError

MAX_TREE_NODES, MAX_BRANCH = 64, 8


@dataclass(frozen=True)
class TreeShape:
    nodes: int  # how many draft tokens the target checks per round
    branch: int = 2  # candidates per expansion, and nodes expanded per level

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_TREE_NODES:
            raise SpecLensError(f"a tree has 1 to {MAX_TREE_NODES} nodes, got {self.nodes}")
        if not 1 <= self.branch <= MAX_BRANCH:
            raise SpecLensError(f"the branch factor must be from 1 to {MAX_BRANCH}, got {self.branch}")


@dataclass
class TokenTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    q: list[float] = field(default_factory=list)
    score: list[float] = field(default_factory=list)
    source: str | None = None  # a draft of several sources (hybrid): the one that drafted this tree

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int, q: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.q.append(q)
        self.score.append(q * (self.score[parent] if parent >= 0 else 1.0))
        return len(self.tokens) - 1

    def depth(self, node: int) -> int:
        return 0 if node < 0 else 1 + self.depth(self.parents[node])

    def children(self, node: int) -> list[int]:
        """Best first: the draft adds a node's children in that order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node`."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def best(self, n: int) -> TokenTree:
        """The n nodes of highest score. A child never scores above its parent,
        and ties go to the earlier node, so every kept node keeps its parent."""
        keep = sorted(sorted(range(len(self)), key=lambda i: (-self.score[i], i))[:n])
        index = {old: new for new, old in enumerate(keep)}
        return TokenTree(
            [self.tokens[i] for i in keep],
            [index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep],
            [self.q[i] for i in keep],
            [self.score[i] for i in keep],
        )


# For each node to expand (-1: the root), its candidates as (token, q), best first.
Expand = Callable[[TokenTree, list[int]], list[list[tuple[int, float]]]]


def grow_tree(expand: Expand, depth: int, shape: TreeShape, stop_ids: Collection[int] = ()) -> TokenTree:
    """Best first, level by level, then the `shape.nodes` best nodes. Nothing grows after a stop token."""
    tree, frontier = TokenTree(), [-1]
    for _ in range(depth):
        level = []
        for node, candidates in zip(frontier, expand(tree, frontier)):
            level += [tree.add(t, node, q) for t, q in candidates[: shape.branch]]
        frontier = sorted((i for i in level if tree.tokens[i] not in stop_ids), key=lambda i: -tree.score[i])
        frontier = frontier[: shape.branch]
        if not frontier:
            break
    return tree.best(shape.nodes)


# -- the target's pass over a tree ----------------------------------------------


def ancestry(parents: Sequence[int]) -> torch.Tensor:
    """[n+1, n+1] bool: row r may attend to column c (the root is row 0, node i is row i+1)."""
    n = len(parents)
    allowed = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    allowed[:, 0] = True
    for i, parent in enumerate(parents):
        allowed[i + 1] = allowed[parent + 1]
        allowed[i + 1, i + 1] = True
    return allowed


def level_mask(
    tree: TokenTree, frontier: list[int], slots: dict[int, int], seen: int, past: int
) -> torch.Tensor:
    """A draft's pass over one level, [len(frontier), past + len(frontier)] bool: each node
    sees the first `seen` cached rows (the sequence), its ancestors' rows (`slots`) and itself."""
    allowed = torch.zeros(len(frontier), past + len(frontier), dtype=torch.bool)
    allowed[:, :seen] = True
    for j, node in enumerate(frontier):
        allowed[j, [slots[a] for a in tree.path(node)[:-1]] + [past + j]] = True
    return allowed


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as transformers adds it to attention scores: 0 where allowed, the dtype's minimum elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min
    )


def tree_inputs(
    tree: TokenTree, root: torch.Tensor, past: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input ids, position ids and the additive 4D mask for the root and every node after `past` cached tokens."""
    device = root.device
    ids = torch.cat([root.view(1, 1), torch.tensor([tree.tokens], device=device, dtype=root.dtype)], dim=1)
    depths = torch.tensor([[0] + [tree.depth(i) for i in range(len(tree))]], device=device)
    allowed = torch.ones(len(tree) + 1, past + len(tree) + 1, dtype=torch.bool, device=device)
    allowed[:, past:] = ancestry(tree.parents)
    return ids, past + depths, additive(allowed, dtype)[None, None]


@torch.inference_mode()  # the cache's tensors were made in inference mode
def keep_path(cache, start: int, slots: Sequence[int]) -> None:
    """Keep the cache's first `start` positions and then only `slots` (ascending), in that order."""
    if slots:
        index = torch.tensor(list(slots), device=cache.layers[0].keys.device)
        for layer in cache.layers:
            # Each slot moves down or stays (slots[j] >= start + j), and the
            # gather copies before the write, so no slot is overwritten early.
            layer.keys[..., start : start + len(slots), :] = layer.keys.index_select(-2, index)
            layer.values[..., start : start + len(slots), :] = layer.values.index_select(-2, index)
    extra = cache.get_seq_length() - start - len(slots)
    if extra > 0:
        cache.crop(-extra)


# -- verification -----------------------------------------------------------------


@dataclass
class Judged:
    p: float  # the target's probability of the node's token, before any refusal
    accept_prob: float  # greedy: 1 or 0; sampling: what the remaining distribution gave it
    u: float | None
    accepted: bool


@dataclass
class TreeVerdict:
    path: list[int]  # the accepted nodes, root's child first
    judged: dict[int, Judged]  # every node the target tried
    emitted: int  # the target's own token after the path
    p_emitted: float
    dist: torch.Tensor  # the target's distribution after the path
    residual: torch.Tensor | None  # sampling, after a refusal: what `emitted` was drawn from


def verify_tree(
    logits: torch.Tensor, tree: TokenTree, probs: torch.Tensor, generator: torch.Generator | None
) -> TreeVerdict:
    """Walk the tree from the root. `logits` and `probs` have one row per node plus the root's (row 0);
    `probs` are the (warped) probabilities, `generator` is None when greedy."""
    node, path, judged = -1, [], {}
    while True:
        row, dist, residual = node + 1, probs[node + 1], None
        kids = tree.children(node)
        if generator is None:
            best = int(logits[row].argmax())  # as plain decoding picks it
            kept = next((c for c in kids if tree.tokens[c] == best), None)
            for c in kids[: kids.index(kept) + 1 if kept is not None else len(kids)]:
                judged[c] = Judged(float(dist[tree.tokens[c]]), float(c == kept), None, c == kept)
        else:
            kept, residual = _sample_children(dist, kids, tree, generator, judged)
        if kept is None:
            break
        path.append(kept)
        node = kept
    if generator is None:
        emitted = best
    else:
        emitted = int(
            torch.multinomial(residual if residual is not None else dist, 1, generator=generator)[0]
        )
    return TreeVerdict(path, judged, emitted, float(dist[emitted]), dist, residual if kids else None)


def _sample_children(
    dist: torch.Tensor,
    kids: list[int],
    tree: TokenTree,
    generator: torch.Generator,
    judged: dict[int, Judged],
) -> tuple[int | None, torch.Tensor]:
    """Try each child against what is left of `dist`; the accepted child, or None and the residual."""
    left = dist
    for c in kids:
        x = tree.tokens[c]
        a = float(left[x])
        u = float(torch.rand(1, generator=generator, device=dist.device))
        judged[c] = Judged(float(dist[x]), a, u, u < a)
        if u < a:
            return c, left
        left = left.clone()
        left[x] = 0.0
        mass = left.sum()
        # All mass on drafted tokens, every one refused: only rounding gets here.
        left = left / mass if mass > 0 else dist
    return None, left
