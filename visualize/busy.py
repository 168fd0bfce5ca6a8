"""Whether a run's timings can be trusted, from the run alone.

A CPU with busy neighbours slows some steps and not others: a plain run slowed
while its speculative run was not reads as a speedup that no run could have.
Three signs, each one no quiet machine gives:

- a speedup above the most a round can give: its tokens over one target step
  (costmodel.speedup_ceiling; checking k+1 tokens costs at least one plain step);
- on a CPU, checks of several tokens taking well under a plain step of one;
- rounds that did the same work (checked as many tokens), or plain decoding's
  steps, scattered far beyond what a quiet machine shows (SCATTER).

The Explore cards and the Sweep summary say so in place of stating the speedup
as a fact.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from decoding import costmodel
from decoding.trace import Trace

MARGIN = 1.1  # over the ceiling: a few percent of timing jitter is no sign
CHEAPER = 0.7  # a check of several tokens at this share of a plain step of one, or less
# The slowest tenth of like steps over their fastest tenth: 1.1-1.3 in the committed example traces,
# 2.5 in tests/data/trace-busy-cpu.json (2 cores of an AMD EPYC under a load average of 7-11).
SCATTER = 1.8
LIKE = 8  # steps of one kind needed to judge their scatter
SPREAD = 1.5  # repeats of one setting (same prompt, same work) this far apart, slowest over fastest
BUSY = "The machine was busy; these timings are not trustworthy"


def _tenths(times: Sequence[float]) -> tuple[float, float]:
    """The fastest and slowest tenth's bounds (the 10th and 90th percentiles)."""
    cuts = statistics.quantiles(times, n=10, method="inclusive")
    return cuts[0], cuts[-1]


def _plain_steps_ms(trace: Trace) -> list[float]:
    b = trace.baseline
    times = b.token_times_s if b is not None else []
    return [(later - earlier) * 1e3 for earlier, later in zip(times, times[1:])]


def _scatter(trace: Trace) -> str:
    """The worst scatter of like steps beyond SCATTER, in words; "" when none."""
    groups: dict[int, list[float]] = defaultdict(list)
    for r in trace.rounds:
        groups[r.checked].append(r.verify_ms)
    kinds = [(f"target passes over {n} token{'s' * (n != 1)}", ms) for n, ms in sorted(groups.items())]
    kinds.append(("plain decoding's steps", _plain_steps_ms(trace)))
    for name, ms in kinds:
        if len(ms) >= LIKE:
            fast, slow = _tenths(ms)
            if fast > 0 and slow > SCATTER * fast:
                return f"its {name} ranged from {fast:.1f} to {slow:.1f} ms for the same work"
    return ""


def busy_signs(trace: Trace) -> list[str]:
    """What in this run's timings a quiet machine could not give, each a clause; empty when nothing."""
    t, signs = trace.totals, []
    ceiling = costmodel.speedup_ceiling(t.tokens_per_round, 0.0)
    if t.speedup is not None and t.tokens_per_round and t.speedup > MARGIN * ceiling:
        signs.append(
            f"it came out ×{t.speedup:.2f} faster than plain decoding with {t.tokens_per_round:.2f} tokens a "
            f"round, while a round that checks its tokens in one target pass gives ×{ceiling:.2f} at most"
        )
    plain = _plain_steps_ms(trace)
    checks = [r.verify_ms for r in trace.rounds if r.drafted]
    if trace.meta.device == "cpu" and len(plain) >= LIKE and len(checks) >= LIKE:
        check, step = statistics.median(checks), statistics.median(plain)
        if check < CHEAPER * step:
            signs.append(
                f"its checks of several tokens took {check:.1f} ms, a plain step of one {step:.1f} ms"
            )
    scatter = _scatter(trace)
    return [*signs, scatter] if scatter else signs


def busy_note(trace: Trace) -> str:
    """One sentence for the cards: that the machine was busy and why it shows; "" when it was not seen."""
    signs = busy_signs(trace)
    return f"{BUSY}: {'; '.join(signs)}. Run it again on a quieter machine." if signs else ""


def sweep_busy_note(
    settings: Sequence[str],
    speedups: Sequence[float],
    tokens_per_round: Sequence[float],
    lows: Sequence[float],
    highs: Sequence[float],
    runs: Sequence[tuple[str, Trace]] = (),
) -> str:
    """The same for a sweep, from its table's rows (one per setting: its name, median speedup, tokens
    per round, lowest and highest repeat) and, where kept, each setting's median run with its name:
    a speedup above its tokens per round, repeats of one setting far apart, a run's own signs."""
    found = []
    for name, speedup, tokens, low, high in zip(
        settings, speedups, tokens_per_round, lows, highs, strict=True
    ):
        if tokens and speedup > MARGIN * costmodel.speedup_ceiling(tokens, 0.0):
            found.append(
                f"{name}: ×{speedup:.2f} with {tokens:.2f} tokens a round, more than a round can give"
            )
        elif low > 0 and high > SPREAD * low:
            found.append(f"{name}: its repeats ranged ×{low:.2f}–{high:.2f} for the same work")
    found += [f"{name}: {signs[0]}" for name, trace in runs if (signs := busy_signs(trace))]
    if not found:
        return ""
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return f"**{BUSY}** ({'; '.join(found[:3])}{more}). Sweep again on a quieter machine."


def with_busy_note(
    summary: str, table: Any, names: Sequence[str], runs: Sequence[tuple[str, Trace]] = ()
) -> str:
    """A sweep's summary with `sweep_busy_note` before it where its table (speedup, tokens_per_round,
    speedup_low and speedup_high columns, one row per name) or its runs show a busy machine."""
    columns = (list(table[c]) for c in ("speedup", "tokens_per_round", "speedup_low", "speedup_high"))
    note = sweep_busy_note(names, *columns, runs)
    return f"{note} {summary}" if note else summary
