"""Stat cards: the headline numbers of a run, as HTML."""

from __future__ import annotations

from html import escape

from decoding import costmodel
from decoding.trace import Trace, agreement


def _card(label: str, value: str, cls: str = "", tip: str = "") -> str:
    return f'<div class="sl-card {cls}" data-tip="{escape(tip, quote=True)}" tabindex="0"><div class="sl-card-value">{escape(value)}</div><div class="sl-card-label">{escape(label)}</div></div>'


def stats_html(trace: Trace) -> str:
    t = trace.totals
    cards = [
        _card("acceptance rate", f"{t.acceptance_rate:.0%}"),
        _card("tokens per round", f"{t.tokens_per_round:.2f}"),
        _card("tokens / s", f"{t.tokens_per_s:.1f}"),
    ]
    if t.speedup is not None:
        cards.append(_card("speedup vs plain", f"×{t.speedup:.2f}", "sl-bad" if t.speedup < 1 else ""))
    same = agreement(trace)
    if same is not None:
        cls = {True: "sl-good", False: "sl-bad", None: ""}[same.good]
        cards.append(_card(same.label, same.value, cls, tip=same.sentence))
    m = trace.meta
    caption = f"{m.target or '?'} · draft {m.draft or '?'} · {t.new_tokens} tokens in {t.rounds} rounds · {m.device} {m.dtype}"
    if m.stopped:
        caption += f" · {m.stopped}"
    why = slower_because(trace)
    why_html = f'<div class="sl-why">{escape(why)}</div>' if why else ""
    return f'<div class="sl-cards">{"".join(cards)}</div>{why_html}<div class="sl-caption">{escape(caption)}</div>'


def slower_because(trace: Trace) -> str:
    """Why a run was slower than plain decoding, in one sentence from its own figures: how often
    the draft was right, and what a round cost in plain target steps. Empty when it was not slower."""
    t = trace.totals
    step_ms = costmodel.target_ms_per_token(trace.baseline.token_times_s) if trace.baseline else None
    if t.speedup is None or t.speedup >= 1 or not t.rounds or not step_ms:
        return ""
    drafted = [r for r in trace.rounds if r.drafted]
    cost = sum(r.round_ms for r in trace.rounds) / len(trace.rounds) / step_ms
    nothing = len(trace.rounds) - len(drafted)
    idle = f"; in {nothing} of {t.rounds} rounds the draft had nothing to propose" if nothing else ""
    return (
        f"Slower than plain decoding: the draft was right {t.acceptance_rate:.0%} of the time{idle}, so a round "
        f"made {t.tokens_per_round:.2f} tokens, while a round cost {cost:.2f} plain target steps "
        "(drafting, checking, bookkeeping)."
    )
