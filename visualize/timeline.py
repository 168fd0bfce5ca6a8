"""Trace -> the colour-coded token timeline, as HTML.

One row per round: accepted draft tokens, the rejected one struck through,
the discarded ones (never judged) greyed, then the target's own token (a
correction or a bonus). Hovering a token shows p, q, the acceptance
probability and u, and where the round turned the target's and the draft's
top 5, and for a draft with another tokenizer the draft tokens it came from;
hovering a round shows its plain-language explanation. The prompt is
shown token by token as the target saw it, each token with its position (the
chat template's text folded into a chip that unfolds to its tokens, numbered);
for a selected n-gram round the part the draft matched and copied is marked,
and its fold opened, and a draft token copied from the prompt names the
positions it came from (a click marks them: assets/speclens.js). All token
text is escaped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from html import escape

from decoding.costmodel import target_ms_per_token
from decoding.trace import Round, TopToken, Trace

from .explain import SOURCE_LABELS, explain_round, explain_round_markdown, md_escape

KIND_LABELS = {
    "prompt": "prompt",
    "accepted": "accepted draft",
    "rejected": "rejected draft",
    "discarded": "discarded draft (never judged)",
    "correction": "target's correction",
    "bonus": "target's bonus",
    "target": "target alone (nothing drafted)",
}
# Each kind's colour in words, as assets/speclens.css's --sl-<kind> paints it in the chips, the
# legend and the entropy strip: a caption that names a colour names this one.
KIND_COLOURS = {
    "accepted": "green",
    "rejected": "red",
    "discarded": "grey",
    "correction": "amber",
    "bonus": "blue",
    "target": "purple",
}


def _shown(text: str) -> str:
    # Newlines and bare spaces would vanish in a token chip; show them.
    if text == "":
        return "∅"
    return escape(text.replace("\n", "↵"))


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _token(kind: str, text: str, tip: str, step: str = "", attrs: str = "") -> str:
    # data-tip, not title: the page's popover (assets/speclens.js) opens on hover and on a tap.
    # data-step: a round's draft token or the target's own, for the step-through (speclens.js).
    stage = f' data-step="{step}"' if step else ""
    return (
        f'<span class="sl-tok sl-{kind}" data-tip="{escape(tip, quote=True)}"{stage}{attrs} tabindex="0">'
        f"{_shown(text)}</span>"
    )


def _top_lines(title: str, top: list[TopToken] | None, symbol: str) -> str:
    if not top:
        return ""
    items = ", ".join(f"“{t.text.replace(chr(10), '↵')}” {symbol}={t.prob:.3f}" for t in top)
    return f"\n{title}: {items}"


def _turn_lines(rnd: Round) -> str:
    """The distributions where the round turned: the target's, the draft's, the residual's."""
    lines = _top_lines("target's top 5 here", rnd.target_top, "p")
    if rnd.n_accepted < rnd.drafted:
        if rnd.draft_top:
            lines += _top_lines("draft's top 5 here", rnd.draft_top, "q")
        elif rnd.translation is not None:
            lines += "\ndraft: another tokenizer; q is its probability of the draft token this came from"
        elif rnd.target_top is not None:
            refused = rnd.draft[rnd.n_accepted].text.replace(chr(10), "↵")
            lines += f"\ndraft: only “{refused}”, with q = 1 (it has no distribution)"
        lines += _top_lines("drawn from the residual max(0, p − q), top 5", rnd.residual_top, "r")
    return lines


def _copied(rnd: Round, n_prompt: int) -> tuple[range, range] | None:
    """The prompt positions (0-based) an n-gram round matched and copied, where it copied from
    the prompt."""
    m = rnd.match
    if m is None or m.start >= n_prompt:
        return None
    return range(max(0, m.start - m.ngram), m.start), range(m.start, min(m.start + rnd.drafted, n_prompt))


def _copy_attrs(rnd: Round, n_prompt: int) -> str:
    """Where a draft copied from in the prompt, 1-based as the popover says, for the page to mark."""
    copied = _copied(rnd, n_prompt)
    if copied is None:
        return ""
    key, copy = copied
    spans = [f"{r.start + 1}-{r.stop}" if r else "" for r in (key, copy)]
    return f' data-key="{spans[0]}" data-copy="{spans[1]}"'


def _match_line(rnd: Round, prompt_texts: list[str], typed: range) -> str:
    m = rnd.match
    if m is None:
        return ""
    n_prompt = len(prompt_texts)
    key = "".join(prompt_texts[m.start - m.ngram : m.start]) if m.start <= n_prompt else ""
    where = (
        f"prompt tokens {m.start + 1}–{m.start + rnd.drafted}"
        if m.start < n_prompt
        else f"the text written so far (output token {m.start - n_prompt + 1} on)"
    )
    after = f" after “{key.replace(chr(10), '↵')}”" if key else f" after a matching {m.ngram}-token sequence"
    if m.start < n_prompt:  # the page marks them in the prompt on a click
        folded = " (the chat template's, folded in the prompt)" if m.start not in typed else ""
        after += f"{folded}\nclick: the prompt marks them green, the tokens matched before them dashed"
    return f"\ncopied from {where}{after}"


def _translation_line(rnd: Round, j: int) -> str:
    """Which of the draft's own tokens (it has another tokenizer) this target token came from."""
    t = rnd.translation
    if t is None or j >= len(t.sources):
        return ""
    own = ", ".join(f"“{t.texts[i].replace(chr(10), '↵')}” (id {t.ids[i]})" for i in t.sources[j])
    if not own:
        return "\nadded by the draft's end of text"
    if t.mode == "vocab":
        return f"\nthe draft's own token {own}: the same text in both vocabularies"
    return f"\nfrom the draft's own token{'s' * (len(t.sources[j]) > 1)} {own}, re-encoded for the target"


def _draft_chip(rnd: Round, j: int, prompt_texts: list[str], typed: range, greedy: bool) -> str:
    tok, v = rnd.draft[j], rnd.verdicts[j]
    tip = f"{KIND_LABELS[v.kind]} · position {j + 1}\ndraft's probability q = {_fmt(tok.q)}"
    if v.kind == "discarded":
        tip += "\nnever judged: it came after a rejected token, so the target's scores for it mean nothing"
    elif greedy:  # the rule is the target's top choice, not min(1, p ÷ q)
        tip += (
            f"\ntarget's probability p = {_fmt(v.p)}\ngreedy: kept only if it is the target's own top choice"
        )
    else:
        tip += (
            f"\ntarget's probability p = {_fmt(v.p)}\nchance to keep = min(1, p ÷ q) = {_fmt(v.accept_prob)}"
        )
        if v.u is not None:
            tip += f"\nrandom draw u = {_fmt(v.u)} (kept when below the chance to keep)"
    if v.kind == "rejected":
        tip += _turn_lines(rnd)
    tip += _match_line(rnd, prompt_texts, typed) + _translation_line(rnd, j)
    return _token(v.kind, tok.text, tip, step="draft", attrs=_copy_attrs(rnd, len(prompt_texts)))


def _round_html(
    rnd: Round,
    index: int,
    greedy: bool,
    selected: bool,
    prompt_texts: list[str],
    typed: range,
    at_limit: bool = False,
    plain: PlainStep | None = None,
    later: bool = False,
) -> str:
    chips = [_draft_chip(rnd, j, prompt_texts, typed, greedy) for j in range(rnd.drafted)]
    if rnd.emitted is not None:
        e = rnd.emitted
        tip = f"{KIND_LABELS[e.kind]}\ntarget's probability p = {_fmt(e.p)}" + _turn_lines(rnd)
        chips.append(_token(e.kind, e.text, tip, step="emit"))
    cls = "sl-round" + " sl-selected" * selected + " sl-later" * later
    timing = f" · {rnd.round_ms:.0f} ms" if rnd.round_ms else ""  # a simulated round took no time
    # A tree round shows its main line (the accepted path, then the best refused child).
    shape = f"tree of {len(rnd.tree)}" if rnd.tree else f"{rnd.drafted} drafted"
    if rnd.translation is not None:  # a draft with another tokenizer: `drafted` counts target tokens
        n = len(rnd.translation.ids)
        shape += f" from {n} draft token{'s' * (n != 1)}"
    if rnd.source:  # a draft of several sources: the one that drafted this round
        shape += f" · by {SOURCE_LABELS.get(rnd.source, rnd.source)}"
    nodes = f' data-tree-nodes="{len(rnd.tree)}"' if rnd.tree else ""
    stages = _stage_attrs(rnd, plain) if rnd.drafted else ""
    drawn = pass_html(rnd, plain) if rnd.drafted and rnd.verify_ms else ""
    sentence = explain_round(rnd, index, greedy, at_limit) + template_copy_note(rnd, prompt_texts, typed)
    return (
        f'<div class="{cls}" data-round="{index}"{nodes}{stages}>'
        f'<span class="sl-label">#{index + 1} · {shape}{timing}</span>'
        f'<span class="sl-chips">{"".join(chips)}</span>'
        f"{drawn}"
        f'<div class="sl-explain">{escape(sentence)}</div>'
        "</div>"
    )


def _prompt_html(trace: Trace, selected: Round | None, typed: range) -> str:
    meta = trace.meta
    texts = meta.prompt_token_texts
    tip = f"{meta.prompt_tokens or '?'} prompt tokens"
    if not texts:  # a version-1 trace: the prompt as the user typed it
        return _token("prompt", meta.prompt, tip)
    marks = [""] * len(texts)
    copied = _copied(selected, len(texts)) if selected is not None else None
    for positions, mark in zip(copied or (), ("sl-match-key", "sl-match-copy")):
        for i in positions:
            marks[i] = mark
    spans = [_prompt_token(t, i, len(texts), mark) for i, (t, mark) in enumerate(zip(texts, marks))]
    start, end = typed.start, typed.stop
    parts = [
        _template_fold(spans[:start], 0, any(marks[:start])),
        "".join(spans[start:end]),
        _template_fold(spans[end:], end, any(marks[end:])),
    ]
    return f'<span class="sl-tok sl-prompt" data-tip="{escape(tip, quote=True)}">{"".join(parts)}</span>'


def _prompt_token(text: str, i: int, n: int, mark: str) -> str:
    """One prompt token, with its position (1-based, as the draft tokens' popovers count)."""
    cls = f'class="{mark}" ' if mark else ""
    tip = escape(f"prompt token {i + 1} of {n}", quote=True)
    return f'<span {cls}data-pos="{i + 1}" data-tip="{tip}">{escape(text)}</span>'


def _typed_range(trace: Trace) -> range:
    """The prompt positions the user typed; the rest, before and after, is the chat template's."""
    texts, meta = trace.meta.prompt_token_texts, trace.meta
    if not meta.chat_template:
        return range(len(texts))
    return range(*_typed_span(texts, meta.prompt))


def _typed_span(texts: list[str], typed: str) -> tuple[int, int]:
    """The tokens [start, end) that spell what the user typed; the rest is the chat template's."""
    joined = "".join(texts)
    at = joined.find(typed.strip()) if typed.strip() else -1
    if at < 0:
        return 0, len(texts)
    start = end = 0
    offset = 0
    for i, t in enumerate(texts):
        if offset + len(t) <= at:
            start = i + 1
        if offset < at + len(typed.strip()):
            end = i + 1
        offset += len(t)
    return start, end


def _template_fold(spans: list[str], first: int, opened: bool) -> str:
    """The chat template's tokens folded into one chip that opens on a click, to its tokens
    numbered; open where a selected round copied from it."""
    if not spans:
        return ""
    where = f"token {first + 1}" if len(spans) == 1 else f"tokens {first + 1}–{first + len(spans)}"
    return (
        f'<details class="sl-template"{" open" if opened else ""}>'
        f"<summary>chat template · {where}</summary>{''.join(spans)}</details>"
    )


# Step-through controls; assets/speclens.js builds each round up stage by stage: the draft's
# tokens appear; the target reads them all in one pass (check_stage, pass_html); every verdict of
# that pass at once (verdicts_stage); then the target's own token, and the round's sentence.
STEPPER = (
    '<div class="sl-stepper" role="group" aria-label="step through the rounds">'
    '<button type="button" class="sl-step-prev" aria-label="previous stage" title="previous stage (←)">◀</button>'
    '<button type="button" class="sl-step-play" aria-label="play" title="play or pause (space)">▶ Step through</button>'
    '<button type="button" class="sl-step-next" aria-label="next stage" title="next stage (→)">▶|</button>'
    '<select class="sl-step-speed" aria-label="speed">'
    '<option value="0.5">×0.5</option><option value="1" selected>×1</option><option value="2">×2</option>'
    '<option value="4">×4</option></select>'
    '<button type="button" class="sl-step-all" aria-label="show every round">show all</button>'
    '<span class="sl-step-where" aria-live="polite"></span>'
    "</div>"
)


@dataclass(frozen=True)
class PlainStep:
    """One plain target step's time, which a round's one pass is set against, and where it came from."""

    ms: float
    source: str


def plain_step(trace: Trace) -> PlainStep | None:
    """The plain run's measured step where the run was compared with one; else the mean of this run's
    own one-token passes (rounds that drafted nothing: the target alone, as in plain decoding);
    None when it has neither."""
    ms = target_ms_per_token(trace.baseline.token_times_s) if trace.baseline else None
    if ms:
        return PlainStep(ms, "the plain run's measured step")
    single = [r.verify_ms for r in trace.rounds if r.checked == 1 and r.verify_ms > 0]
    if not single:
        return None
    rounds = f"{len(single)} round{'s' * (len(single) != 1)}"
    return PlainStep(sum(single) / len(single), f"this run's one-token passes, {rounds} that drafted nothing")


def _ms(x: float) -> str:
    return f"{x:.0f} ms" if x >= 10 else f"{x:.1f} ms"


def check_stage(rnd: Round, plain: PlainStep | None) -> str:
    """The step-through's check stage: every guess read in one target pass, its measured time beside
    what the target would take to write them one at a time (and its own next token: k + 1 steps)."""
    d = rnd.drafted
    read = (
        f"all {len(rnd.tree)} tokens of the tree"
        if rnd.tree
        else "the guess"
        if d == 1
        else f"all {d} guesses"
    )
    if not rnd.verify_ms:  # a simulated round: no model, no time
        return f"the target reads {read} in one pass."
    text = f"the target reads {read} in one pass: {_ms(rnd.verify_ms)}."
    if plain is None:
        return text + " (No plain step was measured in this run to set it against.)"
    those = "that token" if d == 1 else f"those {d} tokens"
    steps = d + 1
    return text + (
        f" One at a time, {those} and the target's next would take {steps} plain steps: "
        f"{steps} × {plain.ms:.1f} ms = {_ms(steps * round(plain.ms, 1))} ({plain.source})."
    )


def verdicts_stage(rnd: Round) -> str:
    """The step-through's verdict stage: every verdict of the one pass at once."""
    counts = Counter(v.kind for v in rnd.verdicts)
    d = rnd.drafted
    if counts["accepted"] == d:
        said = "kept" if d == 1 else "both kept" if d == 2 else f"all {d} kept"
    elif d == 1:
        said = "refused (the target would have written another token)"
    else:
        said = f"{counts['accepted'] or 'none'} kept, 1 refused (the target would have written another token)"
        if counts["discarded"]:
            said += f", {counts['discarded']} never judged (after the refusal)"
    where = "on the main line, " if rnd.tree else ""
    verdicts = "the verdict" if d == 1 else "both verdicts at once" if d == 2 else f"all {d} verdicts at once"
    return f"{where}{verdicts}, from that one pass: {said}"


def _stage_attrs(rnd: Round, plain: PlainStep | None) -> str:
    """What the step-through says at a round's check and verdict stages (assets/speclens.js)."""
    check, verdicts = escape(check_stage(rnd, plain), quote=True), escape(verdicts_stage(rnd), quote=True)
    return f' data-check="{check}" data-verdicts="{verdicts}"'


def pass_html(rnd: Round, plain: PlainStep | None) -> str:
    """The check stage drawn, on one time scale: the one pass as one bar, beside k + 1 plain steps
    as k + 1 bars. Shown only while the step-through is at that round's check (assets/speclens.css)."""
    d = rnd.drafted
    what = f"{len(rnd.tree)} tree tokens" if rnd.tree else f"{d} guess{'es' * (d != 1)}"
    rows = [("sl-pass-one", f"one pass, {what}", rnd.verify_ms, 1)]
    if plain is not None:
        rows.append(("sl-pass-steps", f"{d + 1} plain steps, one token each", (d + 1) * plain.ms, d + 1))
    top = max(ms for _, _, ms, _ in rows) or 1.0
    html = []
    for cls, label, ms, parts in rows:
        segments = '<span class="sl-pass-seg"></span>' * parts
        html.append(
            f'<span class="sl-pass-row {cls}"><span class="sl-pass-what">{escape(label)}</span>'
            f'<span class="sl-pass-track"><span class="sl-pass-bar" style="width:{100 * ms / top:.1f}%">'
            f'{segments}</span></span><span class="sl-pass-ms">{_ms(ms)}</span></span>'
        )
    return f'<div class="sl-pass">{"".join(html)}</div>'


def _quote(text: str) -> str:
    return "“" + text.replace("\n", "↵") + "”"


def template_copy_note(rnd: Round, prompt_texts: list[str], typed: range, markdown: bool = False) -> str:
    """A sentence for a draft copied from the chat template: the model reads that text around the typed
    prompt, and the prompt box never shows it, so the sentence quotes it. Empty for any other round."""
    m = rnd.match
    if m is None or m.start >= len(prompt_texts) or m.start in typed or not rnd.drafted:
        return ""
    before = m.start < typed.start
    text = "".join(prompt_texts[: typed.start] if before else prompt_texts[typed.stop :])
    quoted = md_escape(_quote(text)) if markdown else _quote(text)
    them = "it" if rnd.drafted == 1 else "them"
    return (
        f" The draft copied {them} from the chat template, text the model reads "
        f"{'before' if before else 'after'} the typed prompt but the prompt box hides "
        f"(folded in the prompt row): {quoted}."
    )


def round_sentence_markdown(trace: Trace, index: int) -> str:
    """Round `index` told in a sentence for a Markdown view, with where a copied draft came from."""
    rnd = trace.rounds[index]
    sentence = explain_round_markdown(rnd, index, at_limit=trace.left_to_the_target(index))
    return sentence + template_copy_note(
        rnd, trace.meta.prompt_token_texts, _typed_range(trace), markdown=True
    )


def token_entropies(trace: Trace) -> list[tuple[str, str, float | None]]:
    """(kind, text, the target's entropy in nats) for each output token, in order; a refused draft
    shares its position with the target's correction, so the correction carries that entropy."""
    out: list[tuple[str, str, float | None]] = []
    for r in trace.rounds:
        out += [(v.kind, t.text, v.entropy) for t, v in zip(r.draft[: r.n_accepted], r.verdicts)]
        if r.emitted is not None:
            out.append((r.emitted.kind, r.emitted.text, r.emitted.entropy))
    return out


def entropy_strip_html(trace: Trace) -> str:
    """A strip of bars along the output, one per token, as tall as the target's entropy there and
    coloured by what happened, as in the legend: the target's corrections (amber), where it refused
    a draft, stand where it was itself unsure."""
    tokens = token_entropies(trace)
    known = [h for _, _, h in tokens if h is not None]
    if not known:
        return ""  # a tree run or an older trace: no entropies recorded
    top = max(max(known), 1e-6)
    bars = []
    for i, (kind, text, h) in enumerate(tokens):
        height = 2 if h is None else 3 + round(33 * h / top)
        value = "not recorded" if h is None else f"{h:.2f} nats"
        tip = f"output token {i + 1} “{text}”: {KIND_LABELS[kind]}\ntarget's entropy here: {value}"
        data = "" if h is None else f' data-entropy="{h}"'
        bars.append(
            f'<span class="sl-ent sl-ent-{kind}" style="height:{height}px"{data} '
            f'data-tip="{escape(tip, quote=True)}"></span>'
        )
    return (
        f'<div class="sl-entropy-box"><div class="sl-entropy">{"".join(bars)}</div>'
        f'<div class="sl-caption">{escape(_entropy_caption(tokens))}</div></div>'
    )


def _entropy_caption(tokens: list[tuple[str, str, float | None]]) -> str:
    def mean(kinds: tuple[str, ...]) -> float | None:
        hs = [h for kind, _, h in tokens if kind in kinds and h is not None]
        return sum(hs) / len(hs) if hs else None

    text = "The target's uncertainty (entropy) at each output token, coloured as in the legend above."
    refused, kept = mean(("correction",)), mean(("accepted",))
    if refused is not None and kept is not None:
        # A refused draft is no output token: its position holds the target's correction.
        text += (
            f" Mean at a {_named('correction')}, where a draft was refused: {refused:.2f} nats;"
            f" at an {_named('accepted')}: {kept:.2f}."
        )
    return text


def _named(kind: str) -> str:
    return f"{KIND_LABELS[kind]} ({KIND_COLOURS[kind]})"


def legend_html() -> str:
    items = "".join(f'<span class="sl-tok sl-{k}">{escape(label)}</span>' for k, label in KIND_LABELS.items())
    return f'<div class="sl-legend">{items}</div>'


def timeline_html(
    trace: Trace, upto: int | None = None, selected: int | None = None, built_up: bool = False
) -> str:
    """The timeline of rounds [0, upto) (all when None), with round `selected` highlighted.
    `built_up`: the rounds after the selected one are there but hidden (Replay), so the step-through
    and its count still cover the whole trace."""
    steps = trace.rounds if upto is None else trace.rounds[:upto]
    greedy = trace.meta.sampling.greedy
    prompt_texts = trace.meta.prompt_token_texts
    strip = entropy_strip_html(trace) if upto is None else ""
    parts = [legend_html(), STEPPER if steps else "", strip, '<div class="sl-rounds">']
    typed = _typed_range(trace)
    if trace.meta.prompt:
        chosen = steps[selected] if selected is not None and 0 <= selected < len(steps) else None
        parts.append(
            f'<div class="sl-prompt"><span class="sl-label">prompt</span>{_prompt_html(trace, chosen, typed)}</div>'
        )
    plain = plain_step(trace)
    hide_after = selected if built_up and selected is not None else len(steps)
    parts += [
        _round_html(
            s,
            i,
            greedy,
            i == selected,
            prompt_texts,
            typed,
            trace.left_to_the_target(i),
            plain,
            i > hide_after,
        )
        for i, s in enumerate(steps)
    ]
    if trace.meta.stopped and upto is None:
        parts.append(f'<p class="sl-empty">{escape(trace.meta.stopped.capitalize())}.</p>')
    parts.append("</div>")
    return f'<div class="sl-timeline">{"".join(parts)}</div>'


def empty_timeline_html(message: str = "Run a prompt to see the draft and the verdicts here.") -> str:
    return f'<div class="sl-timeline">{legend_html()}<p class="sl-empty">{escape(message)}</p></div>'
