"""The race: a run and its plain-decoding comparison replayed side by side at their measured speed.

Each token appears at the wall-clock time it was ready in the measured run (the trace's own
times, prefill included), optionally slowed down for a class; at the end a line says who finished
first and by how much. The page's script
(assets/speclens.js) plays it; this module writes the two lanes and their data as HTML.
"""

from __future__ import annotations

import json
from html import escape

from decoding.trace import Trace

from .busy import BUSY, busy_note, busy_signs
from .cards import seconds

SLOW_MOTION = (1, 5, 20)


def _as_written(texts: list[str], written: str) -> list[str]:
    """The tokens' texts as the run's text shows them: the token that ended the text (a special
    token such as <|im_end|>, which the decoded text leaves out) shows nothing; its time counts."""
    last = texts[-1].strip() if texts else ""
    if last and not written.endswith(last):
        return [*texts[:-1], ""]
    return texts


def spec_tokens(trace: Trace) -> list[str]:
    """The run's output tokens' texts, in order (accepted drafts, then the target's own token)."""
    texts: list[str] = []
    for r in trace.rounds:
        texts += [t.text for t in r.draft[: r.n_accepted]]
        if r.emitted is not None:
            texts.append(r.emitted.text)
    return _as_written(texts, trace.output.text)


def plain_tokens(trace: Trace) -> list[str]:
    """The plain run's tokens' texts: recorded, else the run's own where the outputs are the same
    tokens, else the plain text cut into as many equal parts (a trace older than the record)."""
    base = trace.baseline
    if base.token_texts:
        return _as_written(base.token_texts, base.text)
    if base.token_ids == trace.output.token_ids:
        return spec_tokens(trace)
    n = max(1, len(base.token_ids))
    size = max(1, -(-len(base.text) // n))
    return [base.text[i * size : (i + 1) * size] for i in range(n)]


def race_html(trace: Trace | None) -> str:
    """Two lanes, speculative and plain, and the controls that replay them; a line saying what is
    missing when the run has no comparison."""
    if trace is not None and trace.baseline is None and trace.meta.stopped:  # Stop came first
        why = f"{trace.meta.stopped.capitalize()}: no plain run to race against."
        return f'<div class="sl-race sl-empty">{escape(why)}</div>'
    if trace is None or trace.baseline is None or not trace.rounds:
        return '<div class="sl-race sl-empty">Run with "Compare with plain decoding" to race the two.</div>'
    lanes = {
        "speculative": list(zip(trace.token_times_s(), spec_tokens(trace), strict=False)),
        "plain": list(zip(trace.baseline.token_times_s, plain_tokens(trace), strict=False)),
    }
    # A race replays the times as measured: where a busy machine spoilt them, it says so before it runs.
    return _race(lanes, "The measured run and its plain comparison", note=busy_note(trace))


def race_many_html(traces: list[Trace]) -> str:
    """Each draft source's run beside its own plain run, made just before it (the one its speedup
    in the table is measured against: another source's plain run ran at another moment of a busy
    machine), all raced at once; the end line gives each source's finish against its own."""
    timed = [t for t in traces if t.baseline is not None and t.rounds]
    if not timed:
        return ""
    lanes: dict[str, list[tuple[float, str]]] = {}
    for t in timed:
        lanes[t.meta.draft] = list(zip(t.token_times_s(), spec_tokens(t), strict=False))
        lanes[own_plain(t.meta.draft)] = list(zip(t.baseline.token_times_s, plain_tokens(t), strict=False))
    what = (
        "Each source's measured run (its median repeat; of an even number, the lower middle one) "
        "and its own plain run, made just before it,"
    )
    return _race(lanes, what, pairs_line(timed), busy_line(timed))


def busy_line(traces: list[Trace]) -> str:
    """One line naming each raced run whose timings no quiet machine gives (visualize/busy.py), with
    its first sign; empty when none shows one."""
    found = [f"{t.meta.draft}: {signs[0]}" for t in traces if (signs := busy_signs(t))]
    return f"{BUSY} ({'; '.join(found)}). Compare again on a quieter machine." if found else ""


def own_plain(draft: str) -> str:
    """The lane of a source's own plain run."""
    return f"plain, before {draft}"


def pairs_line(traces: list[Trace]) -> str:
    """Each source's finish against its own plain run: both times and the speedup, the run's own
    (the table's for an odd number of repeats)."""
    parts = []
    for t in traces:
        spec_s, plain_s = t.token_times_s()[-1], t.baseline.token_times_s[-1]
        parts.append(
            f"{t.meta.draft} ×{t.totals.speedup:.2f} ({seconds(spec_s)} against its plain run's {seconds(plain_s)})"
        )
    return "Each against its own plain run: " + "; ".join(parts) + "."


def finish_line(lanes: dict[str, list[tuple[float, str]]]) -> str:
    """Who finished first and by how much: each lane's last token's measured time, the others'
    lag behind the first in seconds and as a ratio of times. Empty with fewer than two lanes."""
    ends = {name: (lane[-1][0], len(lane)) for name, lane in lanes.items() if lane}
    if len(ends) < 2:
        return ""
    order = sorted(ends, key=lambda name: ends[name][0])
    first_s, first_n = ends[order[0]]
    parts = [f"First to finish: {order[0]}, {first_n} tokens in {seconds(first_s)}"]
    for name in order[1:]:
        end_s, n = ends[name]
        if round(end_s, 3) == round(first_s, 3):
            parts.append(f"{name} at the same time ({n} tokens)")
            continue
        ratio = f", ×{end_s / first_s:.2f} the time" if first_s > 0 else ""
        parts.append(f"{name} {seconds(end_s - first_s)} later ({n} tokens in {seconds(end_s)}{ratio})")
    return "; ".join(parts) + "."


def _race(
    lanes: dict[str, list[tuple[float, str]]], what: str, end: str | None = None, note: str = ""
) -> str:
    data = escape(json.dumps({name: [[round(t, 4), x] for t, x in lane] for name, lane in lanes.items()}))
    speeds = "".join(
        f'<button class="sl-race-speed{" sl-on" if s == 1 else ""}" data-slow="{s}">×{s}</button>'
        for s in SLOW_MOTION
    )
    rows = "".join(
        f'<div class="sl-lane" data-lane="{escape(name, quote=True)}"><div class="sl-lane-head">{escape(name)}'
        f' · <span class="sl-lane-count">0</span> tokens</div><div class="sl-lane-text"></div></div>'
        for name in lanes
    )
    busy = f'<div class="sl-why sl-busy">{escape(note)}</div>' if note else ""
    return (
        f'<div class="sl-race" data-race="{data}">'
        '<div class="sl-race-bar"><button class="sl-race-play">▶ Race</button>'
        f'<span class="sl-race-speeds">slow motion {speeds}</span>'
        '<span class="sl-race-clock">0.00 s</span></div>'
        f"{busy}{rows}"
        f'<div class="sl-race-end" hidden>{escape(finish_line(lanes) if end is None else end)}</div>'
        f'<div class="sl-caption">{escape(what)} replayed at the times each token was ready (not a simulation).</div></div>'
    )
