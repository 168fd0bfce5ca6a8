"""Stat cards: the headline numbers of a run, as HTML."""

from __future__ import annotations

from html import escape

from decoding.trace import Timing, Trace, agreement, decode_ratio, plain_timing, speculative_timing

from . import glossary


def _card(label: str, value: str, cls: str = "", tip: str = "", term: str = "") -> str:
    # Every card's popover defines its figure (visualize/glossary.py), after what this run says, if anything.
    text = "\n\n".join(x for x in (tip, glossary.tip(term or label)) if x)
    return f'<div class="sl-card {cls}" data-tip="{escape(text, quote=True)}" tabindex="0"><div class="sl-card-value">{escape(value)}</div><div class="sl-card-label">{escape(label)}</div></div>'


def seconds(s: float) -> str:
    """Three significant digits: a ratio of two of them is right to about one percent."""
    return f"{s:#.3g} s" if s < 100 else f"{s:.0f} s"


def stats_html(trace: Trace) -> str:
    t = trace.totals
    cards = [
        _card("acceptance rate", f"{t.acceptance_rate:.0%}"),
        _card("tokens per round", f"{t.tokens_per_round:.2f}"),
        _card("tokens / s", f"{t.tokens_per_s:.1f}"),
        *timing_cards(speculative_timing(trace), plain_timing(trace)),
    ]
    if t.speedup is not None:
        cards.append(_card("speedup vs plain", f"×{t.speedup:.2f}", "sl-bad" if t.speedup < 1 else ""))
    same = agreement(trace)
    if same is not None:
        cls = {True: "sl-good", False: "sl-bad", None: ""}[same.good]
        cards.append(_card(same.label, same.value, cls, tip=same.sentence, term="agreement"))
    m = trace.meta
    caption = f"{m.target or '?'} · draft {m.draft or '?'} · {t.tokens_in_rounds} · {m.device} {m.dtype}"
    if m.stopped:
        caption += f" · {m.stopped}"
    why = slower_because(trace)
    why_html = f'<div class="sl-why">{escape(why)}</div>' if why else ""
    return f'<div class="sl-cards">{"".join(cards)}</div>{why_html}<div class="sl-caption">{escape(caption)}</div>'


def timing_cards(ours: Timing | None, plain: Timing | None) -> list[str]:
    """Time to first token and decoding's tokens/s after it, the run's and (beside it) plain decoding's."""
    if ours is None:
        return []
    first, rate = seconds(ours.first_token_s), _rate(ours.decode_tokens_per_s)
    if plain is None:
        return [_card("time to first token", first), _card("decode tokens / s", rate)]
    # Plain decoding's figure goes in the label; the popover defines the figure (the glossary's).
    return [
        _card(
            f"time to first token (plain: {seconds(plain.first_token_s)})", first, term="time to first token"
        ),
        _card(
            f"decode tokens / s (plain: {_rate(plain.decode_tokens_per_s)})", rate, term="decode tokens / s"
        ),
    ]


def _rate(tokens_per_s: float | None) -> str:
    return "–" if tokens_per_s is None else f"{tokens_per_s:.1f}"


def slower_because(trace: Trace) -> str:
    """Why a run was slower than plain decoding, from the figures the cards show: each run's time is
    its time to the first token plus the decoding after it, so the sentence names which part made
    the difference (the start, the prefill among it, or the rounds' cost against what they made)
    and its figures multiply out to the card's speedup. Empty when it was not slower."""
    t = trace.totals
    ours, plain = speculative_timing(trace), plain_timing(trace)
    if t.speedup is None or t.speedup >= 1 or ours is None or plain is None or ours.wall_s <= 0:
        return ""
    total = (
        f"Slower than plain decoding: {ours.tokens} tokens took {seconds(ours.wall_s)}, "
        f"plain decoding's {plain.tokens} took {seconds(plain.wall_s)}"
    )
    start = (
        f"Its first token came after {seconds(ours.first_token_s)} ({ours.first_token_s / ours.wall_s:.0%} "
        f"of its time: the prompt's prefill, {seconds(t.prefill_ms / 1e3)}, and the first round), "
        f"plain decoding's after {seconds(plain.first_token_s)}."
    )
    ratio = decode_ratio(trace)
    if ratio is None:
        return f"{total}. {start}"
    rounds = len(trace.rounds) - 1  # after the first
    made = ours.decode_tokens / rounds
    # The card's tokens per round counts the first round too: say so where the two differ.
    card = (
        f" (the card's {t.tokens_per_round:.2f} counts the first too)"
        if f"{made:.2f}" != f"{t.tokens_per_round:.2f}"
        else ""
    )
    cost = ours.decode_s / rounds / (plain.decode_s / plain.decode_tokens)
    if ratio >= 1:
        return (
            f"{total}, and its start made the difference. {start} After the first round{card}, a round made {made:.2f} "
            f"tokens and cost {cost:.2f} plain target steps: ×{ratio:.2f} plain decoding's pace."
        )
    nothing = sum(not r.drafted and not trace.left_to_the_target(i) for i, r in enumerate(trace.rounds))
    idle = f"; in {nothing} of {t.rounds} rounds the draft had nothing to propose" if nothing else ""
    where = " on the trees' main lines" if any(r.tree for r in trace.rounds) else ""
    return (
        # Tokens after a refusal are never judged: "right x% of the time" would count them as wrong.
        f"{total}. The target kept {t.accepted} of the {t.proposed} draft tokens{where} ({t.acceptance_rate:.0%}, "
        f"those after a refusal never judged){idle}, so after the first "
        f"round{card} a round made {made:.2f} tokens while it cost {cost:.2f} plain target steps (drafting, "
        f"checking, bookkeeping): ×{ratio:.2f} plain decoding's pace. {start}"
    )
