"""Stat cards: the headline numbers of a run, as HTML."""

from __future__ import annotations

from html import escape

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
        cards.append(_card("speedup vs plain", f"×{t.speedup:.2f}"))
    same = agreement(trace)
    if same is not None:
        cls = {True: "sl-good", False: "sl-bad", None: ""}[same.good]
        cards.append(_card(same.label, same.value, cls, tip=same.sentence))
    m = trace.meta
    caption = f"{m.target or '?'} · draft {m.draft or '?'} · {t.new_tokens} tokens in {t.rounds} rounds · {m.device} {m.dtype}"
    if m.stopped:
        caption += f" · {m.stopped}"
    return f'<div class="sl-cards">{"".join(cards)}</div><div class="sl-caption">{escape(caption)}</div>'
