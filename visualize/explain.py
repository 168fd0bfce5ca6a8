"""One plain sentence per round, for a class to follow.

`explain_step` gives plain text (the timeline escapes it as HTML);
`explain_round_markdown` gives the same sentence with every token's text
escaped for Markdown, for the Markdown components: a token is model output,
and `<img src=x>` or `**bold**` in it must show as written.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

from decoding.trace import Round

# Everything Markdown (and Gradio's $$ LaTeX) would read as syntax; HTML's <, > and & become entities.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~$])")

SOURCE_LABELS = {"ngram": "n-gram", "head": "head"}  # which source of a hybrid draft drafted a round


def md_escape(text: str) -> str:
    """Text that Markdown shows as written, and in which no HTML tag survives."""
    return html.escape(_MD_SPECIAL.sub(r"\\\1", text), quote=False)


def _quote(text: str) -> str:
    return "“" + text.replace("\n", "↵") + "”"


def explain_round(rnd: Round, index: int, greedy: bool | None = None, at_limit: bool = False) -> str:
    """What the draft proposed, what the target kept, what it rejected and why, what it wrote.
    `at_limit`: the token limit left room for the target's own token only (Trace.left_to_the_target)."""
    return _explain(rnd, index, greedy, _quote, at_limit)


def explain_round_markdown(rnd: Round, index: int, greedy: bool | None = None, at_limit: bool = False) -> str:
    """`explain_step` with token text escaped for a Markdown component."""
    return _explain(rnd, index, greedy, lambda t: md_escape(_quote(t)), at_limit)


def _explain(rnd: Round, index: int, greedy: bool | None, q: Callable[[str], str], at_limit: bool) -> str:
    if greedy is None:
        greedy = all(v.u is None for v in rnd.verdicts)
    if rnd.tree:
        return _explain_tree(rnd, index, greedy, q)
    if at_limit:
        return (
            f"Round {index + 1}: the token limit left room for one token only, so nothing was drafted "
            f"and the target wrote {q(rnd.emitted.text)} itself."
        )
    return _explain_chain(rnd, index, greedy, q) + _explain_translation(rnd, q)


def _explain_translation(rnd: Round, q: Callable[[str], str]) -> str:
    """A draft with another tokenizer: what it wrote in its own tokens, and how the target read it."""
    t = rnd.translation
    if t is None or not t.ids:
        return ""
    n = len(t.ids)
    own = f"{', '.join(map(q, t.texts))} ({n} token{'s' * (n != 1)} of its own)"
    if t.mode == "vocab":
        return (
            f" The draft has another tokenizer: it drew {own}, only from tokens whose text the "
            "target's vocabulary holds too, so each is one target token."
        )
    checked = f"the {rnd.drafted} token{'s' * (rnd.drafted != 1)} checked"
    return (
        f" The draft has another tokenizer: it wrote {own}, which the target's tokenizer reads as {checked}."
    )


def _explain_chain(rnd: Round, index: int, greedy: bool, q: Callable[[str], str]) -> str:
    head = f"Round {index + 1}: "
    drafted = [t.text for t in rnd.draft]
    e = rnd.emitted
    if rnd.drafted == 0:
        return head + f"the draft had nothing to propose, so the target wrote {q(e.text)} itself."
    proposed = (
        f"the draft proposed {len(drafted)} token{'s' * (len(drafted) != 1)} ({', '.join(map(q, drafted))})"
    )
    n = rnd.n_accepted
    if n == rnd.drafted:
        if e is None:
            ended = "kept it, and it" if n == 1 else "kept all of them, and the last one"
            return head + f"{proposed}; the target {ended} ended the text."
        kept = "kept it" if n == 1 else "kept all of them"
        return head + f"{proposed}; the target {kept} and added {q(e.text)} for free (a bonus token)."
    # One token proposed and refused: "kept none of them" would speak of several.
    kept = (
        f"kept {', '.join(map(q, drafted[:n]))}, " if n else "kept none of them, " if rnd.drafted > 1 else ""
    )
    bad, v = rnd.draft[n], rnd.verdicts[n]
    if greedy:
        why = (
            f"rejected {q(bad.text)}, because its own top choice was {q(e.text)} "
            f"(p={e.p:.2f}), while it gave {q(bad.text)} only p={v.p:.2f}"
        )
    else:
        why = (
            f"rejected {q(bad.text)}: the chance to keep it was min(1, p/q) = "
            f"min(1, {v.p:.2f}/{bad.q:.2f}) = {v.accept_prob:.2f}, and the draw u={v.u:.2f} was above it"
        )
    wrote = (
        f"so it wrote {q(e.text)} instead"
        if greedy
        else f"so it drew {q(e.text)} from what p has left over q"
    )
    after = rnd.drafted - n - 1
    tail = (
        "; the draft token after it was discarded without being judged, since it followed a refused token"
        if after == 1
        else f"; the {after} draft tokens after it were discarded without being judged, since they "
        "followed a refused token"
        if after
        else ""
    )
    return head + f"{proposed}; the target {kept}{why}, {wrote}{tail}."


def _by(rnd: Round) -> str:
    """ " (n-gram)" or " (head)" for a round a hybrid draft gave to one of its sources; else nothing."""
    return f" ({SOURCE_LABELS.get(rnd.source, rnd.source)})" if rnd.source else ""


def _explain_tree(rnd: Round, index: int, greedy: bool, q: Callable[[str], str]) -> str:
    nodes, e = rnd.tree, rnd.emitted
    path = [i for i, n in enumerate(nodes) if n.accepted]
    first = [n.text for n in nodes if n.parent == -1]
    depth = max(n.depth for n in nodes)
    proposed = (
        f"Round {index + 1}: the draft{_by(rnd)} proposed a tree of {len(nodes)} tokens, up to {depth} deep "
        f"(first guesses {', '.join(map(q, first))})"
    )
    kept = (
        f"the target kept the path {', '.join(q(nodes[i].text) for i in path)}"
        if path
        else "the target kept none"
    )
    if e is None:
        return f"{proposed}; {kept}, and the last one ended the text."
    end = path[-1] if path else -1
    tried = [n.text for n in nodes if n.parent == end and n.p is not None]
    if not tried:
        return f"{proposed}; {kept} to the end of its branch and added {q(e.text)} for free (a bonus token)."
    after = "after it" if path else "first"
    if greedy:
        why = f"its own top choice was {q(e.text)} (p={e.p:.2f})"
    else:
        why = "each was kept only with the chance the target had left for it, and none was drawn"
    refused = f"tried {', '.join(map(q, tried))} {after} and refused {'it' if len(tried) == 1 else 'them'}"
    return f"{proposed}; {kept}, {refused}: {why}, so it wrote {q(e.text)}."
