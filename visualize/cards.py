"""Stat cards: the headline numbers of a run, as HTML."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from decoding.trace import Timing, Trace, agreement, decode_ratio, plain_timing, speculative_timing

from . import glossary
from .busy import busy_note


def _card(label: str, value: str, cls: str = "", tip: str = "", term: str = "") -> str:
    # Every card's popover defines its figure (visualize/glossary.py), after what this run says, if anything.
    text = "\n\n".join(x for x in (tip, glossary.tip(term or label)) if x)
    return f'<div class="sl-card {cls}" data-tip="{escape(text, quote=True)}" tabindex="0"><div class="sl-card-value">{escape(value)}</div><div class="sl-card-label">{escape(label)}</div></div>'


def seconds(s: float) -> str:
    """Three significant digits: a ratio of two of them is right to about one percent."""
    return f"{s:#.3g} s" if s < 100 else f"{s:.0f} s"


def recorded_note(trace: Trace, source: str, machine: str = "") -> str:
    """What a run replayed from a file is: recorded elsewhere, where and when as far as `source` (its
    file), `machine` and the trace's own start say, so that its figures are not read as this machine's."""
    when = f" on {trace.meta.started[:10]}" if trace.meta.started else ""
    where = f" on {machine}" if machine else ""
    return (
        f"Recorded, not run on this machine: {source}, measured{when}{where}. Its times and speedup are "
        "that machine's."
    )


def stats_html(trace: Trace, recorded: str = "") -> str:
    """The cards, the sentence that says why, the caption; `recorded` (`recorded_note`) above them
    where the run is replayed from a file rather than made here."""
    t = trace.totals
    cards = [
        _card("acceptance rate", f"{t.acceptance_rate:.0%}"),
        _card("tokens per round", f"{t.tokens_per_round:.2f}"),
        _card("tokens / s", f"{t.tokens_per_s:.1f}"),
        *timing_cards(speculative_timing(trace), plain_timing(trace)),
    ]
    busy = busy_note(trace)
    if t.speedup is not None:
        # A figure no quiet machine gives is shown, never as a fact: queried, amber, the reason first.
        cls = "sl-busy" if busy else "sl-bad" if t.speedup < 1 else ""
        cards.append(_card("speedup vs plain", f"×{t.speedup:.2f}{'?' * bool(busy)}", cls, busy))
    same = agreement(trace)
    if same is not None:
        cls = {True: "sl-good", False: "sl-bad", None: ""}[same.good]
        cards.append(_card(same.label, same.value, cls, tip=same.sentence, term="agreement"))
    m = trace.meta
    caption = f"{m.target or '?'} · draft {m.draft or '?'} · {t.tokens_in_rounds} · {m.device} {m.dtype}"
    if m.stopped:
        caption += f" · {m.stopped}"
    why, kind = (busy, "sl-busy") if busy else (slower_because(trace), "")
    if not why:
        why, kind = faster_because(trace), "sl-gain"
    why_html = f'<div class="{" ".join(["sl-why", *[kind] * bool(kind)])}">{escape(why)}</div>' if why else ""
    flag = f'<div class="sl-recorded">{escape(recorded)}</div>' if recorded else ""
    return f'{flag}<div class="sl-cards">{"".join(cards)}</div>{why_html}<div class="sl-caption">{escape(caption)}</div>'


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


@dataclass(frozen=True)
class RoundCost:
    """The rounds after the first, in plain decoding's terms: what a round made, what it cost in
    plain target steps (its drafting, its check and the rest, bookkeeping), and the pace that gives."""

    rounds: int
    made: float
    cost: float
    draft: float
    check: float
    pace: float

    @property
    def rest(self) -> float:
        return self.cost - self.draft - self.check

    def said(self, card: float) -> str:
        # The card's tokens per round counts the first round too: say so where the two differ.
        first = (
            f" (the card's {card:.2f} counts the first too)" if f"{self.made:.2f}" != f"{card:.2f}" else ""
        )
        return (
            f"after the first round{first} a round made {self.made:.2f} tokens and cost {self.cost:.2f} plain "
            f"target steps (drafting {self.draft:.2f}, checking {self.check:.2f}, the rest {self.rest:.2f}): "
            f"×{self.pace:.2f} plain decoding's pace"
        )


def round_cost(trace: Trace) -> RoundCost | None:
    """The rounds after the first against plain decoding's steps after its first; None where either
    has nothing after its first token."""
    ours, plain, pace = speculative_timing(trace), plain_timing(trace), decode_ratio(trace)
    if ours is None or plain is None or pace is None:
        return None
    later = trace.rounds[1:]
    step_ms = plain.decode_s / plain.decode_tokens * 1e3
    return RoundCost(
        len(later),
        ours.decode_tokens / len(later),
        ours.decode_s * 1e3 / len(later) / step_ms,
        sum(r.draft_ms for r in later) / len(later) / step_ms,
        sum(r.verify_ms for r in later) / len(later) / step_ms,
        pace,
    )


def _totals(ours: Timing, plain: Timing, than: str) -> str:
    return (
        f"{than} than plain decoding: {ours.tokens} tokens took {seconds(ours.wall_s)}, "
        f"plain decoding's {plain.tokens} took {seconds(plain.wall_s)}"
    )


def _start(trace: Trace, ours: Timing, plain: Timing) -> str:
    """When each run's first token came, and what its prefill was."""
    prefill = trace.totals.prefill_ms / 1e3
    said = (
        f"Its first token came after {seconds(ours.first_token_s)} ({ours.first_token_s / ours.wall_s:.0%} "
        f"of its time: the prompt's prefill, {seconds(prefill)}, and the first round), "
        f"plain decoding's after {seconds(plain.first_token_s)}"
    )
    if prefill <= plain.first_token_s:
        return said + "."
    why = (
        "the head reads the target's features there, which plain decoding does not (and the machine may "
        "have been busier then)"
        if "head" in trace.meta.draft
        else "the same work, so the machine differed (busier then, or a one-time cost paid by this run)"
    )
    return f"{said}; its prefill alone took longer than plain decoding's prefill and first step over the same prompt: {why}."


def _kept(trace: Trace) -> str:
    """What the target kept of the draft's tokens, and how often the draft had none to give."""
    t = trace.totals
    nothing = sum(not r.drafted and not trace.left_to_the_target(i) for i, r in enumerate(trace.rounds))
    idle = f"; in {nothing} of {t.rounds} rounds the draft had nothing to propose" if nothing else ""
    where = " on the trees' main lines" if any(r.tree for r in trace.rounds) else ""
    # Tokens after a refusal are never judged: "right x% of the time" would count them as wrong.
    return (
        f"The target kept {t.accepted} of the {t.proposed} draft tokens{where} ({t.acceptance_rate:.0%}, "
        f"those after a refusal never judged){idle}"
    )


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def slower_because(trace: Trace) -> str:
    """Why a run was slower than plain decoding, from the figures the cards show: each run's time is
    its time to the first token plus the decoding after it, so the sentence names which part made
    the difference (the start, the prefill among it, or the rounds' cost against what they made)
    and its figures multiply out to the card's speedup. Empty when it was not slower."""
    t = trace.totals
    ours, plain = speculative_timing(trace), plain_timing(trace)
    if t.speedup is None or t.speedup >= 1 or ours is None or plain is None or ours.wall_s <= 0:
        return ""
    total, start, rounds = (
        _totals(ours, plain, "Slower"),
        _start(trace, ours, plain),
        round_cost(trace),
    )
    if rounds is None:
        return f"{total}. {start}"
    if rounds.pace >= 1:
        return f"{total}, and its start made the difference. {start} {_capital(rounds.said(t.tokens_per_round))}."
    return f"{total}. {_kept(trace)}, so {rounds.said(t.tokens_per_round)}. {start}"


def faster_because(trace: Trace) -> str:
    """Why a run was faster than plain decoding: what its rounds made against what they cost (the
    draft's share, the check's), and what its start took from that or added to it, as a factor:
    pace × start = the card's speedup. Empty when it was not faster."""
    t = trace.totals
    ours, plain = speculative_timing(trace), plain_timing(trace)
    if t.speedup is None or t.speedup < 1 or ours is None or plain is None or ours.wall_s <= 0:
        return ""
    total, start, rounds = (
        _totals(ours, plain, "Faster"),
        _start(trace, ours, plain),
        round_cost(trace),
    )
    if rounds is None:
        return f"{total}. {start}"
    factor = t.speedup / rounds.pace
    verdict = "took some of that back" if factor < 1 else "added to it"
    return (
        f"{total}. {_kept(trace)}, so {rounds.said(t.tokens_per_round)}. {start} The start {verdict}, "
        f"{ours.first_token_s / ours.wall_s:.0%} of its time against {plain.first_token_s / plain.wall_s:.0%} "
        f"of plain decoding's: ×{rounds.pace:.2f} × {factor:.2f} = ×{t.speedup:.2f} in all."
    )
