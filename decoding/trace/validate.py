"""Checking a trace that comes from outside (an upload, a file) before any view reads it."""

from __future__ import annotations

from ..errors import TraceError
from .fields import is_ids, is_int, is_num, is_prob, is_texts, meta_problem
from .schema import DraftToken, Round, Trace, Verdict, verdict_kind


def validate(trace: Trace) -> None:
    """Raise TraceError naming the first way the trace contradicts itself.

    Run on every trace that comes from outside (an upload, a file), so a
    corrupt one is refused with one line instead of breaking a view: every
    field a view reads is checked for its type here, then the rounds for
    their logic.
    """
    problem = meta_problem(trace.meta.to_dict()) or _parts_problem(trace)
    if problem:
        raise TraceError(problem)
    sampled = not trace.meta.sampling.greedy
    for i, s in enumerate(trace.rounds):
        problem = _round_problem(s, i == len(trace.rounds) - 1, sampled)
        if problem:
            raise TraceError(f"round {i + 1}: {problem}")
    if trace.emitted_ids() != trace.output.token_ids:
        raise TraceError("the rounds do not rebuild the output tokens")
    for key, value in (
        ("rounds", len(trace.rounds)),
        ("new_tokens", len(trace.output.token_ids)),
        ("proposed", sum(r.drafted for r in trace.rounds)),
        ("accepted", sum(r.n_accepted for r in trace.rounds)),
    ):
        if getattr(trace.totals, key) != value:
            raise TraceError(f"totals.{key} is {getattr(trace.totals, key)!r} but the rounds give {value}")


def _parts_problem(trace: Trace) -> str | None:
    out, base = trace.output, trace.baseline
    if not isinstance(out.text, str) or not is_ids(out.token_ids):
        return "output needs a text and a list of whole-number token ids"
    if base is not None and not (
        isinstance(base.text, str)
        and is_ids(base.token_ids)
        and is_num(base.wall_s)
        and is_num(base.tokens_per_s)
        and isinstance(base.token_times_s, list)
        and all(is_num(t) for t in base.token_times_s)
        and is_texts(base.token_texts)
    ):
        return "baseline needs a text, token ids, wall_s, tokens_per_s and token times as numbers"
    return None


def _round_problem(s: Round, is_last: bool, sampled: bool) -> str | None:
    if not is_int(s.drafted) or not is_int(s.n_accepted):
        return "drafted and n_accepted must be whole numbers"
    if not all(is_num(t) and t >= 0 for t in (s.draft_ms, s.verify_ms, s.round_ms)):
        return "draft_ms, verify_ms and round_ms must be numbers of milliseconds"
    for name in ("target_top", "draft_top", "residual_top"):
        top = getattr(s, name)
        if top is not None and not all(
            is_int(t.id) and isinstance(t.text, str) and is_prob(t.prob) for t in top
        ):
            return f"{name} needs tokens with a whole-number id, a text and a probability"
    if s.match is not None and not (is_int(s.match.start) and is_int(s.match.ngram) and s.match.start >= 0):
        return "match needs a whole-number start and n-gram length"
    if s.source is not None and not isinstance(s.source, str):
        return "source must be the name of the draft that drafted the round, or null"
    if s.tree is not None and (problem := _tree_problem(s)):
        return problem
    if s.translation is not None and (problem := _translation_problem(s)):
        return problem
    if not s.drafted == len(s.draft) == len(s.verdicts):
        return f"drafted is {s.drafted} but it has {len(s.draft)} draft tokens and {len(s.verdicts)} verdicts"
    if not 0 <= s.n_accepted <= s.drafted:
        return f"n_accepted {s.n_accepted} is outside 0..{s.drafted}"
    for j, (tok, v) in enumerate(zip(s.draft, s.verdicts)):
        problem = _token_problem(tok, v, verdict_kind(j, s.n_accepted), sampled)
        if problem:
            return f"draft position {j + 1}: {problem}"
    if s.emitted is None:
        if s.n_accepted == 0 or not is_last:
            return "nothing was emitted, which only the last round may do after an accepted end of text"
        return None
    expected = "target" if s.drafted == 0 else "bonus" if s.n_accepted == s.drafted else "correction"
    if s.emitted.kind != expected:
        return f"the emitted token is a {s.emitted.kind!r}, expected a {expected!r}"
    if not is_int(s.emitted.id) or not isinstance(s.emitted.text, str) or not is_prob(s.emitted.p):
        return "the emitted token needs a whole-number id, a text and a probability p"
    if not _is_entropy(s.emitted.entropy):
        return "the emitted token's entropy must be a number of nats, 0 or more, or null"
    return None


def _translation_problem(s: Round) -> str | None:
    t = s.translation
    if not (is_ids(t.ids) and is_texts(t.texts) and len(t.ids) == len(t.texts)):
        return "translation needs the draft's token ids and one text for each"
    if t.mode not in ("text", "vocab"):
        return f"translation mode must be 'text' or 'vocab', got {t.mode!r}"
    if not isinstance(t.sources, list):
        return "translation sources must be a list, one entry per drafted token"
    if len(t.sources) != s.drafted:
        return f"translation has sources for {len(t.sources)} tokens, but the round drafted {s.drafted}"
    if not all(
        isinstance(src, list) and all(is_int(i) and 0 <= i < len(t.ids) for i in src) for src in t.sources
    ):
        return "translation sources must be indices of the draft's own tokens"
    return None


def _tree_problem(s: Round) -> str | None:
    """Parents first, depths that follow them, and an accepted path that is the draft's accepted prefix."""
    for i, node in enumerate(s.tree):
        if not (is_int(node.id) and isinstance(node.text, str) and is_prob(node.q)):
            return f"tree node {i}: needs a whole-number id, a text and a probability q"
        if not (is_int(node.parent) and -1 <= node.parent < i and is_int(node.depth)):
            return f"tree node {i}: its parent must be an earlier node or -1"
        if node.depth != (1 if node.parent < 0 else s.tree[node.parent].depth + 1):
            return f"tree node {i}: depth {node.depth} does not follow its parent's"
        if not (node.p is None or is_prob(node.p)) or not isinstance(node.accepted, bool):
            return f"tree node {i}: p must be a probability or null, accepted true or false"
        if node.accepted and not (node.parent < 0 or s.tree[node.parent].accepted):
            return f"tree node {i}: accepted below a node that was not"
    path = [n.id for n in s.tree if n.accepted]
    if path != [t.id for t in s.draft[: s.n_accepted]]:
        return "the tree's accepted path is not the draft's accepted tokens"
    return None


def _token_problem(tok: DraftToken, v: Verdict, kind: str, sampled: bool) -> str | None:
    if not is_int(tok.id) or not isinstance(tok.text, str) or not is_prob(tok.q):
        return "a draft token needs a whole-number id, a text and a probability q"
    if v.kind != kind or v.accepted != (kind == "accepted"):
        return f"the verdict says {v.kind!r} (accepted={v.accepted}) but its place in the round makes it {kind!r}"
    if not _is_entropy(v.entropy):
        return "a verdict's entropy must be a number of nats, 0 or more, or null"
    if kind == "discarded":
        if (v.p, v.accept_prob, v.u, v.entropy) != (None, None, None, None):
            return "a discarded token was never judged, so its p, accept_prob, u and entropy must be null"
    elif not (
        is_prob(v.p) and is_prob(v.accept_prob) and (is_prob(v.u) if sampled else v.u is None or is_prob(v.u))
    ):
        return "a judged token needs p and accept_prob between 0 and 1 (and u, when sampling)"
    return None


def _is_entropy(value: object) -> bool:
    return value is None or (is_num(value) and value >= 0)
