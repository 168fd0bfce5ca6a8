"""One plain sentence per round, for a class to follow."""

from __future__ import annotations

from decoding.trace import Step


def _q(text: str) -> str:
    return "“" + text.replace("\n", "↵") + "”"


def _join(texts: list[str]) -> str:
    return ", ".join(_q(t) for t in texts)


def explain_step(step: Step, index: int, greedy: bool | None = None) -> str:
    """What the draft proposed, what the target kept, what it rejected and why, what it wrote."""
    if greedy is None:
        greedy = all(v.u is None for v in step.verdicts)
    head = f"Round {index + 1}: "
    drafted = [t.text for t in step.draft]
    e = step.emitted
    if step.k == 0:
        return head + f"the draft had nothing to propose, so the target wrote {_q(e.text)} itself."
    proposed = f"the draft proposed {len(drafted)} token{'s' * (len(drafted) != 1)} ({_join(drafted)})"
    n = step.n_accepted
    if n == step.k:
        if e is None:
            return head + f"{proposed}; the target kept all of them, and the last one ended the text."
        return (
            head + f"{proposed}; the target kept all of them and added {_q(e.text)} for free (a bonus token)."
        )
    kept = f"kept {_join(drafted[:n])}" if n else "kept none of them"
    bad, v = step.draft[n], step.verdicts[n]
    if greedy:
        why = (
            f"rejected {_q(bad.text)}, because its own top choice was {_q(e.text)} "
            f"(p={e.p:.2f}), while it gave {_q(bad.text)} only p={v.p:.2f}"
        )
    else:
        why = (
            f"rejected {_q(bad.text)}: the chance to keep it was min(1, p/q) = "
            f"min(1, {v.p:.2f}/{bad.q:.2f}) = {v.accept_prob:.2f}, and the draw u={v.u:.2f} was above it"
        )
    wrote = f"so it wrote {_q(e.text)} instead"
    after = step.k - n - 1
    tail = (
        f"; the {after} draft token{'s' * (after != 1)} after it {'were' if after != 1 else 'was'} discarded"
        if after
        else ""
    )
    return head + f"{proposed}; the target {kept}, {why}, {wrote}{tail}."
