"""Stat cards: the headline numbers of a run, as HTML."""

from __future__ import annotations

from html import escape

from decoding.trace import Trace


def _card(label: str, value: str, cls: str = "") -> str:
    return f'<div class="sl-card {cls}"><div class="sl-card-value">{escape(value)}</div><div class="sl-card-label">{escape(label)}</div></div>'


def stats_html(trace: Trace) -> str:
    t = trace.totals
    cards = [
        _card("acceptance rate", f"{t.get('acceptance_rate', 0):.0%}"),
        _card("tokens per round", f"{t.get('tokens_per_step', 0):.2f}"),
        _card("tokens / s", f"{t.get('tokens_per_s', 0):.1f}"),
    ]
    if "speedup" in t:
        cards.append(_card("speedup vs plain", f"×{t['speedup']:.2f}"))
        same = t.get("identical_to_baseline")
        cards.append(
            _card("identical to plain decoding", "✓" if same else "✗", "sl-good" if same else "sl-bad")
        )
    m = trace.meta
    caption = f"{m.get('target', '?')} · draft {m.get('draft', '?')} · {t.get('new_tokens', 0)} tokens in {t.get('steps', 0)} rounds · {m.get('device', '')} {m.get('dtype', '')}"
    return f'<div class="sl-cards">{"".join(cards)}</div><div class="sl-caption">{escape(caption)}</div>'
