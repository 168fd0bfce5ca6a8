"""The glossary: every figure the app shows, defined once.

Stat cards, table headers and the Production tab's terms all take their popover text from here
(assets/speclens.js reads `glossary_script()` for the table headers), so a figure never has two
definitions. Each entry lists the names it goes by: a card's label, a table's column.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from html import escape


@dataclass(frozen=True)
class Term:
    term: str  # the heading of its popover
    definition: str
    names: tuple[str, ...]  # card labels and table columns it explains


GLOSSARY: dict[str, Term] = {
    t.names[0]: t
    for t in (
        Term(
            "acceptance rate",
            "Of all the draft tokens proposed, the share the target kept: accepted / proposed. Tokens after "
            "a refusal count as proposed though never judged, so it falls as k grows. A token tree counts "
            "its main line: the kept path and the best refused child after it, not every node. vLLM's "
            "acceptance rate is the same ratio.",
            ("acceptance rate", "acceptance_rate"),
        ),
        Term(
            "α (alpha)",
            "The chance that one judged draft token is kept, if each is kept independently: accepted / "
            "(accepted + refusals). Only tokens the target judged count, so α is at least the acceptance "
            "rate. It is the α of the Theory tab and of the cost model's predictions.",
            ("alpha", "α: acceptance"),
        ),
        Term(
            "tokens per round",
            "Output tokens one round made: its kept draft tokens plus the target's own token (a "
            "correction or a bonus). Plain decoding makes 1 per target step. Every round counts, one "
            "that drafted nothing too (vLLM's mean acceptance length counts only the rounds that drafted).",
            ("tokens per round", "tokens_per_round", "tokens/round"),
        ),
        Term(
            "mean acceptance length (vLLM)",
            "1 + accepted / drafts: vLLM's tokens per round, the target's own token included, over the "
            "rounds that drafted (its num_drafts). Of a run with rounds that drafted nothing it is higher "
            "than the run's tokens per round, which counts those rounds too.",
            ("mean acceptance length",),
        ),
        Term(
            "drafts (vLLM's num_drafts)",
            "The rounds that drafted at least one token. A round where the draft had nothing to propose "
            "(the target wrote its token alone) is a round but not a draft.",
            ("drafts", "num_drafts"),
        ),
        Term(
            "per-position acceptance (SpecLens)",
            "At draft position i, of the tokens the target judged there, the share it kept. A token is "
            "judged only when every earlier one of its round was kept, so a late position can score high "
            "on few tokens. Explore's 'Acceptance by draft position' chart.",
            ("per-position acceptance (SpecLens)",),
        ),
        Term(
            "per-position acceptance (vLLM)",
            "At position i, the tokens kept there / every round that drafted (vLLM's num_drafts). It "
            "counts every round, judged there or not, so it can only fall with i: it is the chance that "
            "the first i tokens were all kept. Production's per-position chart.",
            ("per-position acceptance (vLLM)",),
        ),
        Term(
            "c (draft cost)",
            "What one draft step costs, in plain target steps: the draft's time per token / the target's. "
            "Near 0 for an n-gram lookup; a small model costs more.",
            ("c", "draft_cost", "c: draft cost", "c: draft cost per token (target steps)"),
        ),
        Term(
            "b (verify cost per extra token)",
            "How much more a target pass costs for each extra token it checks, in plain target steps: "
            "checking k + 1 tokens costs 1 + b·k. Near 0 on a large GPU; on a CPU it grows as more tokens "
            "are checked (the Theory tab's Measure V(n) button gives this machine's own).",
            ("b", "b: verify cost per extra token", "b: verify cost per extra token (target steps)"),
        ),
        Term(
            "speedup vs plain",
            "This run's tokens per second / plain decoding's, on the same prompt and machine: ×1.5 makes "
            "tokens 1.5 times as fast; below ×1 is slower. In a sweep: the median of the repeats.",
            ("speedup vs plain", "speedup"),
        ),
        Term(
            "lowest speedup",
            "The lowest speedup among a setting's repeats: with the highest, its spread.",
            ("speedup_low",),
        ),
        Term(
            "highest speedup",
            "The highest speedup among a setting's repeats: with the lowest, its spread.",
            ("speedup_high",),
        ),
        Term(
            "repeats",
            "How many times the setting ran, each right after a plain run of its own.",
            ("repeats",),
        ),
        Term(
            "best",
            "True on the clear best setting alone: its lowest repeat beats every other setting's highest.",
            ("best",),
        ),
        Term(
            "tokens / s",
            "Output tokens per second of wall-clock time over the whole run, the prompt's prefill included.",
            ("tokens / s", "tokens_per_s"),
        ),
        Term(
            "plain tokens / s",
            "Tokens per second of plain decoding (the target alone, one token a step) on the same prompt.",
            ("baseline_tokens_per_s",),
        ),
        Term(
            "time to first token",
            "Seconds from the start of a run to its first output token: the prompt's prefill, and for a "
            "speculative run its first round too (the first draft and check).",
            ("time to first token", "TTFT", "ttft_s"),
        ),
        Term(
            "decode tokens / s",
            "Output tokens per second after the first one: the decoding alone, without the prefill.",
            ("decode tokens / s", "decode_tokens_per_s"),
        ),
        Term(
            "k",
            "Draft tokens asked for per round (a tree's depth). A round may draft fewer: an n-gram with "
            "no match drafts none.",
            ("k",),
        ),
        Term("tree nodes N", "Draft tokens in a round's tree; 0 is a chain of k.", ("nodes",)),
        Term(
            "predicted (Leviathan)",
            "The speedup Leviathan et al.'s formula predicts from α, k and c, counting a check of k + 1 "
            "tokens as one target step.",
            ("predicted_leviathan",),
        ),
        Term(
            "predicted (measured)",
            "The same prediction with the verify cost measured on this machine for k + 1 tokens.",
            ("predicted_measured",),
        ),
        Term(
            "draft ms per token",
            "Milliseconds of drafting per draft token proposed.",
            ("draft_ms_per_token",),
        ),
        Term(
            "verify ms",
            "Milliseconds of one target pass that checks a round's draft.",
            ("verify_ms",),
        ),
        Term(
            "verify ratio",
            "A verify pass's time over one plain target step: what checking the tree costs.",
            ("verify_ratio",),
        ),
        Term(
            "identical to plain decoding",
            "Whether the output matches plain decoding's: token for token when greedy in 32 or 64-bit "
            "floats; in distribution only when sampling; 16-bit floats may flip a near-tie.",
            ("identical_to_baseline", "agreement"),
        ),
        Term("draft source", "What proposed the draft tokens.", ("draft",)),
        Term("category", "The workload's category of prompts; 'all' pools them.", ("category",)),
        Term("prompts", "How many prompts the row's figures pool.", ("prompts",)),
        Term(
            "batch size B",
            "Requests decoded together, one target pass a step for all of them; one that finishes leaves "
            "and the next waiting one joins (continuous batching).",
            ("batch",),
        ),
        Term(
            "predicted (batched)",
            "The speedup the cost model predicts at this batch size from the same runs' pass times by rows, "
            "tokens per round, rows checked and drafting costs — never from the measured speedup.",
            ("predicted_speedup",),
        ),
        Term(
            "plain tokens / s (batch)",
            "Output tokens per second of every request together, decoded plainly B at a time.",
            ("tokens_per_s_plain",),
        ),
        Term(
            "speculative tokens / s (batch)",
            "Output tokens per second of every request together, decoded speculatively B at a time.",
            ("tokens_per_s_speculative",),
        ),
        Term(
            "ms per token, median",
            "What one request waits per token, from its prefill's start to its last token (the median request).",
            ("ms_per_token_p50",),
        ),
        Term(
            "ms per token, p95",
            "The same wait for the slowest requests: 95 in 100 waited less per token.",
            ("ms_per_token_p95",),
        ),
        Term(
            "rows per pass",
            "The rows one target pass checked, every request's together: B for plain decoding, B × (1 + "
            "its draft) for speculation.",
            ("rows_per_pass",),
        ),
        Term(
            "identical (batch)",
            "Whether every request's speculative output equals its plain output at this batch size.",
            ("identical",),
        ),
    )
}
# A term goes by its heading too: a table shows its columns by their terms' headings (`header`).
_BY_NAME = {name.lower(): t for t in GLOSSARY.values() for name in (*t.names, t.term)}


def term(name: str) -> Term | None:
    """The entry a card label, a table column or a heading names, or None."""
    return _BY_NAME.get(name.strip().lower())


def header(column: str) -> str:
    """A table column as the page heads it: its term's words (`speedup_low`: "lowest speedup"); a
    CSV keeps the column's own name."""
    t = term(column)
    return t.term if t else column


def tip(name: str) -> str:
    """A popover's text for a name: its term, then its definition; empty when none defines it."""
    t = term(name)
    return f"{t.term}\n{t.definition}" if t else ""


def glossary_script() -> str:
    """A <script> that hands every name's popover text to assets/speclens.js, for table headers."""
    # "</" would end the script early.
    tips = json.dumps({name: tip(name) for name in _BY_NAME}, ensure_ascii=False).replace("</", "<\\/")
    return f"<script>window.SL_GLOSSARY = {tips};</script>"


def terms_html(names: list[str]) -> str:
    """The named terms as chips, each opening its definition."""
    chips = "".join(
        f'<span class="sl-term" data-tip="{escape(tip(n), quote=True)}" tabindex="0">{escape(term(n).term)}</span>'
        for n in names
    )
    return f'<div class="sl-terms"><span class="sl-terms-head">Terms:</span>{chips}</div>'


def glossary_html() -> str:
    """The whole glossary as a definition list."""
    items = "".join(f"<dt>{escape(t.term)}</dt><dd>{escape(t.definition)}</dd>" for t in GLOSSARY.values())
    return f'<dl class="sl-glossary">{items}</dl>'
