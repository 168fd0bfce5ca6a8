"""Speculative-decoding metrics of a serving engine (vLLM, SGLang) or of SpecLens itself.

A metrics page (Prometheus text, from `http://host:port/metrics` or a saved
file) is parsed with `prometheus_client`'s own parser. The figures follow
vLLM V1's definitions (`vllm/v1/spec_decode/metrics.py`), so a run here and
a deployment there compare line by line:

- mean acceptance length = 1 + accepted / drafts (the bonus token included;
  SGLang's `spec_accept_length`), where a draft is a round that drafted
  (`num_drafts`): SpecLens's tokens per round over those rounds, lower over
  every round where some drafted nothing,
- acceptance rate = accepted / draft tokens,
- per-position acceptance = accepted at position i / drafts.

No torch here: the Production tab and the CLI read pages on any machine.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from .. import costmodel
from ..errors import SpecLensError
from ..trace import Trace

MAX_PAGE_BYTES = 8_000_000  # a real engine's page is tens of kB
TIMEOUT_S = 3.0
MAX_POSITIONS = 64  # draft positions read from a page; engines draft far fewer
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
PREFIXES = {"vllm:": "vllm", "sglang:": "sglang", "speclens:": "speclens"}


@dataclass
class Snapshot:
    """What one page says; counters are totals since the engine started."""

    engine: str
    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    per_pos: list[float] = field(default_factory=list)  # accepted tokens at each draft position
    # SGLang's gauges: already averages, so they have no counters behind them here.
    accept_length: float | None = None
    accept_rate: float | None = None
    taken_at: float = field(default_factory=time.time)


# -- reading a page -------------------------------------------------------------


def fetch(source: str, timeout: float = TIMEOUT_S) -> str:
    """The text of a metrics page: an http(s) URL, or a file."""
    if source.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(source, timeout=timeout) as response:
                body = response.read(MAX_PAGE_BYTES + 1)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SpecLensError(f"cannot read metrics from {source}: {reason}") from None
    else:
        body = fetch_path(source).read_bytes()
    if len(body) > MAX_PAGE_BYTES:
        raise SpecLensError(f"the page at {source} is over {MAX_PAGE_BYTES // 10**6} MB: not a metrics page")
    return body.decode("utf-8", errors="replace")


def fetch_path(source: str) -> Path:
    """A saved page or trace, checked to exist and to be of a sane size."""
    path = Path(source).expanduser()
    if not path.is_file():
        raise SpecLensError(f"no metrics page at '{source}': give http://host:port/metrics or a file")
    if path.stat().st_size > MAX_PAGE_BYTES:
        raise SpecLensError(f"'{source}' is over {MAX_PAGE_BYTES // 10**6} MB: not a metrics page")
    return path


def parse(text: str) -> Snapshot:
    """The speculative-decoding figures on a page, summed over its engines and models."""
    try:
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except (ValueError, TypeError, IndexError):
        # Not the parser's message: it can quote the page, which may be any server's answer.
        raise SpecLensError("not a Prometheus metrics page: the text format could not be parsed") from None
    for prefix, engine in PREFIXES.items():
        mine = [s for s in samples if s.name.startswith(prefix)]
        snapshot = _counters(engine, prefix, mine) if engine != "sglang" else _sglang(mine)
        if snapshot is not None:
            return snapshot
    raise SpecLensError(
        "no speculative-decoding metrics on that page (looked for vllm:spec_decode_*, "
        "sglang:spec_accept_length and speclens:spec_decode_*): is speculative decoding on?"
    )


def _counters(engine: str, prefix: str, samples: list) -> Snapshot | None:
    found = False
    snapshot = Snapshot(engine)
    per_pos: dict[int, float] = {}
    for s in samples:
        # A counter's samples are NAME_total (and NAME_created, its start time: skipped).
        if s.name.endswith("_created"):
            continue
        name = s.name.removeprefix(prefix + "spec_decode_").removesuffix("_total")
        if name in COUNTERS:
            setattr(snapshot, name, getattr(snapshot, name) + s.value)
            found = True
        elif name == "num_accepted_tokens_per_pos":
            pos = s.labels.get("position", "")
            if pos.isdigit() and int(pos) < MAX_POSITIONS:  # a page is input: no label sizes a list
                per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + s.value
    if not found:
        return None
    snapshot.per_pos = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []
    return snapshot


def _sglang(samples: list) -> Snapshot | None:
    def mean(name: str) -> float | None:
        values = [s.value for s in samples if s.name == f"sglang:{name}"]
        return sum(values) / len(values) if values else None

    length, rate = mean("spec_accept_length"), mean("spec_accept_rate")
    if length is None and rate is None:
        return None
    return Snapshot("sglang", accept_length=length, accept_rate=rate)


def read(source: str) -> Snapshot:
    """A page parsed, timed when it was read (a URL) or last written (a saved file).

    A SpecLens trace (`.json`) reads as the page its run would export.
    """
    if source.endswith(".json") and not source.startswith(("http://", "https://")):
        snapshot = snapshot_of([Trace.load(fetch_path(source))])
        snapshot.taken_at = Path(source).expanduser().stat().st_mtime
        return snapshot
    snapshot = parse(fetch(source))
    if not source.startswith(("http://", "https://")):
        snapshot.taken_at = Path(source).expanduser().stat().st_mtime
    return snapshot


def interval(before: Snapshot, after: Snapshot) -> dict:
    """The summary over the interval between two snapshots, per second when they are apart in time."""
    seconds = after.taken_at - before.taken_at
    return summary(between(before, after), seconds if seconds >= 1.0 else None)


# -- figures ----------------------------------------------------------------------


def between(before: Snapshot, after: Snapshot) -> Snapshot:
    """The counters over the interval between two snapshots of one engine."""
    if before.engine != after.engine:
        raise SpecLensError(f"the two pages come from different engines ({before.engine}, {after.engine})")
    if after.engine == "sglang":  # gauges: the later value is the one that holds
        return after
    diffs = {name: getattr(after, name) - getattr(before, name) for name in COUNTERS}
    pos = [a - (before.per_pos[i] if i < len(before.per_pos) else 0.0) for i, a in enumerate(after.per_pos)]
    if any(d < 0 for d in [*diffs.values(), *pos]):
        raise SpecLensError(
            "the counters went down between the two snapshots: the engine restarted in between; "
            "take both after the restart"
        )
    return replace(after, per_pos=pos, **diffs)


def summary(s: Snapshot, seconds: float | None = None) -> dict:
    """The figures, by vLLM's definitions; per second too when `seconds` is the interval's length."""
    if s.engine == "sglang":
        return {
            "engine": s.engine,
            "mean_acceptance_length": s.accept_length,
            "acceptance_rate": s.accept_rate,
            "per_position": [],
            "num_drafts": None,
            "num_draft_tokens": None,
            "num_accepted_tokens": None,
        }
    drafts = s.num_drafts
    out = {
        "engine": s.engine,
        "mean_acceptance_length": 1 + s.num_accepted_tokens / drafts if drafts else None,
        "acceptance_rate": s.num_accepted_tokens / s.num_draft_tokens if s.num_draft_tokens else None,
        "per_position": [p / drafts for p in s.per_pos] if drafts else [],
        "num_drafts": int(s.num_drafts),
        "num_draft_tokens": int(s.num_draft_tokens),
        "num_accepted_tokens": int(s.num_accepted_tokens),
    }
    if seconds:
        out["accepted_tokens_per_s"] = s.num_accepted_tokens / seconds
        out["drafted_tokens_per_s"] = s.num_draft_tokens / seconds
    return out


def table(figures: dict) -> str:
    """The summary as a few aligned lines, for the terminal."""

    def num(x, fmt: str) -> str:
        return "–" if x is None else format(x, fmt)

    lines = [
        f"engine                  {figures['engine']}",
        f"mean acceptance length  {num(figures['mean_acceptance_length'], '.2f')}",
        f"acceptance rate         {num(figures['acceptance_rate'], '.1%')}",
        "per-position acceptance " + (", ".join(f"{p:.3f}" for p in figures["per_position"]) or "–"),
        f"drafts                  {num(figures['num_drafts'], 'd')}",
        f"draft tokens            {num(figures['num_draft_tokens'], 'd')}",
        f"accepted tokens         {num(figures['num_accepted_tokens'], 'd')}",
    ]
    for key in ("accepted_tokens_per_s", "drafted_tokens_per_s"):
        if key in figures:
            lines.append(f"{key.replace('_', ' '):<24}{figures[key]:.1f}")
    return "\n".join(lines)


# -- the best num_speculative_tokens for a deployment's acceptance ------------------

ASSUMED_POSITIONS = 8  # an engine that reports only an average rate: the profile is taken this long


@dataclass(frozen=True)
class KChoice:
    """The best num_speculative_tokens for a measured acceptance, chosen only among the k it was
    measured for: past the positions a deployment drafted, its acceptance would be a guess."""

    best: int
    speedups: list[float]  # expected, for k = 1 .. measured
    measured: int  # draft positions with a measured acceptance
    assumed: bool  # per-position acceptance assumed from an average rate (SGLang)


def acceptance_profile(figures: dict) -> list[float]:
    """Per-position acceptance; SGLang reports only an average rate, taken as i.i.d. per position."""
    if figures["per_position"]:
        return figures["per_position"]
    rate = figures["acceptance_rate"] or 0.0
    return [rate ** (i + 1) for i in range(ASSUMED_POSITIONS)]


def choose_k(figures: dict, draft_cost: float, verify_ratio: Callable[[int], float]) -> KChoice:
    """The k with the best expected speedup for these figures (`summary`'s), a draft step costing
    `draft_cost` target steps and checking n tokens `verify_ratio(n)` (costmodel.best_k_profile)."""
    profile = acceptance_profile(figures)
    best, speedups = costmodel.best_k_profile(profile, draft_cost, verify_ratio, k_max=len(profile))
    return KChoice(best, speedups, len(profile), not figures["per_position"])


# -- SpecLens's own runs as a page --------------------------------------------------


def snapshot_of(traces: Iterable) -> Snapshot:
    """A SpecLens run counted as vLLM counts: a draft is a round that proposed tokens."""
    s = Snapshot("speclens")
    per_pos: list[float] = []
    for trace in traces:
        for rnd in trace.rounds:
            if rnd.drafted == 0:
                continue
            s.num_drafts += 1
            s.num_draft_tokens += rnd.drafted
            s.num_accepted_tokens += rnd.n_accepted
            per_pos += [0.0] * (rnd.drafted - len(per_pos))
            for i in range(rnd.n_accepted):
                per_pos[i] += 1
    s.per_pos = per_pos
    return s


def metrics_page(snapshot: Snapshot) -> str:
    """A Prometheus text page with `speclens:` counters named as vLLM names its own."""
    registry = CollectorRegistry()
    for name in COUNTERS:
        counter = Counter(
            f"speclens:spec_decode_{name}", f"SpecLens {name.replace('_', ' ')}.", registry=registry
        )
        counter.inc(getattr(snapshot, name))
    per_pos = Counter(
        "speclens:spec_decode_num_accepted_tokens_per_pos",
        "SpecLens accepted tokens per draft position.",
        ["position"],
        registry=registry,
    )
    for i, value in enumerate(snapshot.per_pos):
        per_pos.labels(str(i)).inc(value)
    return generate_latest(registry).decode()
