"""One round's token tree as a Plotly figure: the accepted path in green, the
nodes the target tried and refused in red, the ones it never reached in grey,
and the token it wrote itself at the end of the path. Each node is sized by the
draft's probability of its token."""

from __future__ import annotations

from collections import defaultdict
from html import escape

import plotly.graph_objects as go

from decoding.trace import Round, TreeNode

from .charts import COLORS, _layout
from .explain import SOURCE_LABELS


def _label(text: str, width: int = 10) -> str:
    text = text.replace("\n", "↵")
    return escape(text if len(text) <= width else text[: width - 1] + "…")


def _rows(nodes: list[TreeNode]) -> dict[int, float]:
    """A row for every node (the root is -1): leaves one below another in
    depth-first order, a parent level with the middle of its children."""
    children: dict[int, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        children[node.parent].append(i)
    rows: dict[int, float] = {}
    leaf = 0

    def place(i: int) -> float:
        nonlocal leaf
        if not children[i]:
            rows[i] = leaf
            leaf += 1
        else:
            below = [place(c) for c in children[i]]
            rows[i] = (below[0] + below[-1]) / 2
        return rows[i]

    place(-1)
    return rows


def _state(node: TreeNode) -> str:
    if node.accepted:
        return "accepted"
    return "rejected" if node.p is not None else "discarded"


STATE_NAMES = {"accepted": "accepted path", "rejected": "tried, refused", "discarded": "never tried"}


def tree_figure(rnd: Round | None, index: int = 0) -> go.Figure:
    """The tree of round `index`; a chain round says it has none."""
    fig = go.Figure()
    if rnd is None or not rnd.tree:
        fig.add_annotation(text="This round drafted a chain, not a tree (tree nodes 0).", showarrow=False)
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        return _layout(fig, f"Round {index + 1}: no tree", "", "")
    nodes, rows = rnd.tree, _rows(rnd.tree)
    for i, node in enumerate(nodes):  # edges first, so the markers sit on top
        kept = node.accepted
        fig.add_scatter(
            x=[node.depth - 1, node.depth],
            y=[rows[node.parent], rows[i]],
            mode="lines",
            line={"color": COLORS["accepted"] if kept else "#cccccc", "width": 3 if kept else 1},
            hoverinfo="skip",
            showlegend=False,
        )
    for state, name in STATE_NAMES.items():
        chosen = [i for i, node in enumerate(nodes) if _state(node) == state]
        fig.add_scatter(
            x=[nodes[i].depth for i in chosen],
            y=[rows[i] for i in chosen],
            mode="markers+text",
            text=[_label(nodes[i].text) for i in chosen],
            textposition="top center",
            marker={
                "size": [node_size(nodes[i]) for i in chosen],
                "color": COLORS[state],
                "line": {"width": 1, "color": "white"},
            },  # fmt: skip
            hovertext=[_hover(nodes[i]) for i in chosen],
            hoverinfo="text",
            name=name,
        )
    fig.add_scatter(
        x=[0],
        y=[rows[-1]],
        mode="markers",
        marker={"size": 11, "color": "#555", "symbol": "diamond"},
        hovertext=["the last verified token: every node extends it"],
        hoverinfo="text",
        name="last verified",
    )
    _add_emitted(fig, rnd, rows)
    # Room above the first row and below the last for the labels (the target's token sits one row lower).
    bottom = max(rows.values()) + (rnd.emitted is not None) + 0.8
    fig.update_yaxes(visible=False, range=[bottom, -0.8])
    kept = sum(n.accepted for n in nodes)
    by = f" by {SOURCE_LABELS.get(rnd.source, rnd.source)}" if rnd.source else ""  # a hybrid's source
    return _layout(
        fig,
        f"Round {index + 1}: a tree of {len(nodes)} drafted tokens{by}, {kept} kept (size: the draft's q)",
        "depth (tokens after the last verified one)",
        "",
        whole_x=True,
    )


def node_size(node: TreeNode) -> float:
    """A node's marker grows with the draft's probability of its token (q, given its parent):
    the branches the draft was sure of stand out from its long shots."""
    return 7 + 18 * node.q


def _hover(node: TreeNode) -> str:
    p = "not tried by the target" if node.p is None else f"p = {node.p:.3f} (target)"
    return f"{_label(node.text, 40)}<br>q = {node.q:.3f} (draft)<br>{p}"


def _add_emitted(fig: go.Figure, rnd: Round, rows: dict[int, float]) -> None:
    """The target's own token, one step after the last accepted node (or the root),
    in a row of its own below the tree so that it never covers a drafted one."""
    e = rnd.emitted
    if e is None:
        return
    path = [i for i, node in enumerate(rnd.tree) if node.accepted]
    end, row = (path[-1] if path else -1), max(rows.values()) + 1
    fig.add_scatter(
        x=[len(path), len(path) + 1],
        y=[rows[end], row],
        mode="lines",
        line={"color": COLORS[e.kind], "width": 2, "dash": "dot"},
        hoverinfo="skip",
        showlegend=False,
    )
    fig.add_scatter(
        x=[len(path) + 1],
        y=[row],
        mode="markers+text",
        text=[_label(e.text)],
        textposition="bottom center",
        marker={"size": 13, "color": COLORS[e.kind], "symbol": "square"},
        hovertext=[f"{_label(e.text, 40)}<br>the target's own token ({e.kind}), p = {e.p:.3f}"],
        hoverinfo="text",
        name=f"written by the target ({e.kind})",
    )
