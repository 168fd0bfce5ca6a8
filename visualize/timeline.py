"""Trace -> the colour-coded token timeline, as HTML.

One row per round: accepted draft tokens, rejected ones struck through,
then the target's own token (a correction or a bonus). Hovering a token
shows p, q, the acceptance probability and u; hovering a round shows its
plain-language explanation. All token text is escaped.
"""

from __future__ import annotations

from html import escape

from decoding.trace import Step, Trace

from .explain import explain_step

KIND_LABELS = {
    "prompt": "prompt",
    "accepted": "accepted draft",
    "rejected": "rejected draft",
    "correction": "target's correction",
    "bonus": "target's bonus",
}


def _shown(text: str) -> str:
    # Newlines and bare spaces would vanish in a token chip; show them.
    if text == "":
        return "∅"
    return escape(text.replace("\n", "↵"))


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _token(kind: str, text: str, tip: str) -> str:
    return f'<span class="sl-tok sl-{kind}" title="{escape(tip, quote=True)}">{_shown(text)}</span>'


def _round_html(step: Step, index: int, greedy: bool, selected: bool) -> str:
    chips = []
    for j, (tok, v) in enumerate(zip(step.draft, step.verdicts)):
        kind = "accepted" if j < step.n_accepted else "rejected"
        tip = (
            f"{KIND_LABELS[kind]} · position {j + 1}\n"
            f"p (target) = {_fmt(v.p)}\nq (draft) = {_fmt(tok.q)}\n"
            f"accept prob = {_fmt(v.accept_prob)}\nu = {_fmt(v.u)}"
        )
        if j > step.n_accepted:
            tip += "\n(discarded: an earlier token was rejected)"
        chips.append(_token(kind, tok.text, tip))
    if step.emitted is not None:
        e = step.emitted
        chips.append(_token(e.kind, e.text, f"{KIND_LABELS[e.kind]}\np (target) = {_fmt(e.p)}"))
    cls = "sl-round sl-selected" if selected else "sl-round"
    timing = f"{step.step_ms:.0f} ms"
    return (
        f'<div class="{cls}" data-step="{index}">'
        f'<span class="sl-label">#{index + 1} · k={step.k} · {timing}</span>'
        f'<span class="sl-chips">{"".join(chips)}</span>'
        f'<div class="sl-explain">{escape(explain_step(step, index, greedy))}</div>'
        "</div>"
    )


def legend_html() -> str:
    items = "".join(f'<span class="sl-tok sl-{k}">{escape(label)}</span>' for k, label in KIND_LABELS.items())
    return f'<div class="sl-legend">{items}</div>'


def timeline_html(trace: Trace, upto: int | None = None, selected: int | None = None) -> str:
    """The timeline of rounds [0, upto) (all when None), with round `selected` highlighted."""
    steps = trace.steps if upto is None else trace.steps[:upto]
    greedy = bool(trace.meta.get("sampling", {}).get("greedy", True))
    prompt = trace.meta.get("prompt", "")
    parts = [legend_html(), '<div class="sl-rounds">']
    if prompt:
        tip = f"{trace.meta.get('prompt_tokens', '?')} prompt tokens"
        parts.append(
            f'<div class="sl-prompt"><span class="sl-label">prompt</span>{_token("prompt", prompt, tip)}</div>'
        )
    parts += [_round_html(s, i, greedy, i == selected) for i, s in enumerate(steps)]
    parts.append("</div>")
    return f'<div class="sl-timeline">{"".join(parts)}</div>'


def empty_timeline_html(message: str = "Run a prompt to see the draft and the verdicts here.") -> str:
    return f'<div class="sl-timeline">{legend_html()}<p class="sl-empty">{escape(message)}</p></div>'
