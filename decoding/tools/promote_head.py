"""`python -m decoding promote-head`: a newly trained head against the shipped one, in one run, and the
shipped one replaced only where the new head beats it.

Both heads draft every prompt at the same k, each prompt's plain run between them (the heads taking
turns at going first, so that neither always meets a warmer machine), and each head's speedup is its
tokens/s over that same plain run. The new head beats the shipped one when, over all prompts, it
drafts more tokens a round and runs faster against plain decoding, with every greedy output what
plain decoding wrote. Only then, and only when asked to, are the shipped head's files replaced by its.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import api
from ..api import RunConfig
from ..core.proposal import Draft
from ..drafts.head.files import shipped_head
from ..errors import SpecLensError
from ..models.presets import PRESETS
from ..trace import Trace
from .prompts import read_prompts

DEV_PROMPTS = Path(__file__).resolve().parents[2] / "assets" / "prompts" / "specbench_dev.jsonl"
HEAD_FILE_LIMIT = 10 * 2**20  # bytes: a file of a head kept in git
SHIPPED, CANDIDATE = "shipped", "candidate"


@dataclass(frozen=True)
class PromoteConfig:
    candidate: Path  # the new head's folder (train-head --out)
    prompts: Path = DEV_PROMPTS  # measured on, never trained on
    # The target, k, new tokens and sampling of every run (its draft is each head in turn).
    run: RunConfig = field(default_factory=lambda: RunConfig(draft="head", k=3, max_new_tokens=128))
    shipped: Path | None = None  # the head it must beat; None: assets/heads/<target>
    limit: int = 2  # prompts per category
    install: bool = False  # replace the shipped head's files when the candidate beats it


@dataclass(frozen=True)
class HeadScore:
    """One head over every prompt: tokens a round (all its tokens over all its rounds) and the
    geometric mean of its speedups against each prompt's plain run."""

    tokens_per_round: float
    speedup: float
    identical: bool  # every greedy output equal to plain decoding's (sampled runs: True)


@dataclass(frozen=True)
class Verdict:
    shipped: HeadScore
    candidate: HeadScore
    promoted: bool  # the candidate beats the shipped head
    reason: str  # why, in one line
    installed: bool = False


def beats(candidate: HeadScore, shipped: HeadScore) -> tuple[bool, str]:
    """Whether the candidate beats the shipped head on both figures, and why (not) in words."""
    if not candidate.identical:
        return False, "the candidate's greedy output differs from plain decoding's: it is not lossless"
    more = candidate.tokens_per_round > shipped.tokens_per_round
    faster = candidate.speedup > shipped.speedup
    said = (
        f"{candidate.tokens_per_round:.2f} against {shipped.tokens_per_round:.2f} tokens a round, "
        f"×{candidate.speedup:.2f} against ×{shipped.speedup:.2f}"
    )
    if more and faster:
        return True, f"the candidate beats the shipped head: {said}"
    lost = " and ".join(w for w, ok in (("tokens a round", more), ("speedup", faster)) if not ok)
    return False, f"the candidate does not beat the shipped head on {lost}: {said}"


def promote_head(cfg: PromoteConfig, say: Callable[[str], None] = print) -> Verdict:
    """Measure both heads on the prompts in one run; replace the shipped head's files with the
    candidate's where it beats them and `cfg.install` asks for it."""
    shipped = cfg.shipped or _shipped(cfg.run.target)
    for folder in (shipped, cfg.candidate):
        if not (folder / "config.json").is_file():
            raise SpecLensError(f"no head in {folder} (a head folder holds config.json and its weights)")
    runs = {
        name: replace(cfg.run, draft=f"head:{folder}")
        for name, folder in ((SHIPPED, shipped), (CANDIDATE, cfg.candidate))
    }
    prompts = read_prompts(cfg.prompts, cfg.limit, lambda p: api.fits(replace(cfg.run, prompt=p)))
    measured = _measure(runs, [p["prompt"] for p in prompts], say)
    scores = {name: _score(rows) for name, rows in measured.items()}
    promoted, reason = beats(scores[CANDIDATE], scores[SHIPPED])
    installed = promoted and cfg.install
    if installed:
        install_head(cfg.candidate, shipped)
    return Verdict(scores[SHIPPED], scores[CANDIDATE], promoted, reason, installed)


def _shipped(target: str) -> Path:
    if target not in PRESETS:  # a folder or hub id: SpecLens ships no head for it
        raise SpecLensError(f"no head ships for '{target}': name the head to beat with --shipped FOLDER")
    return shipped_head(target)


def _measure(runs: dict[str, RunConfig], prompts: list[str], say: Callable[[str], None]) -> dict[str, list]:
    """(tokens, rounds, speedup, identical) of each head on each prompt; a warm-up run of each first."""
    warm = {name: api.prepare(replace(c, prompt=prompts[0])) for name, c in runs.items()}
    for run in warm.values():  # first calls allocate: kept out of the figures
        api.speculative(run)
    drafts = {name: run.draft for name, run in warm.items()}
    measured: dict[str, list] = {name: [] for name in runs}
    for i, prompt in enumerate(prompts):
        order = list(runs) if i % 2 == 0 else list(reversed(runs))
        first = _head_run(runs[order[0]], prompt, drafts[order[0]])
        plain = api.plain_baseline(replace(runs[order[0]], prompt=prompt))
        second = _head_run(runs[order[1]], prompt, drafts[order[1]])
        for name, trace in ((order[0], first), (order[1], second)):
            t = trace.totals
            greedy_equal = not trace.meta.sampling.greedy or trace.output.token_ids == plain.token_ids
            measured[name].append((t.new_tokens, t.rounds, t.tokens_per_s / plain.tokens_per_s, greedy_equal))
        say(f"[{i + 1}/{len(prompts)}] " + ", ".join(f"{n} ×{measured[n][-1][2]:.2f}" for n in runs))
    return measured


def _head_run(config: RunConfig, prompt: str, draft: Draft) -> Trace:
    return api.speculative(api.prepare(replace(config, prompt=prompt), draft))


def _score(rows: list[tuple[int, int, float, bool]]) -> HeadScore:
    tokens, rounds = sum(r[0] for r in rows), sum(r[1] for r in rows)
    speedup = statistics.geometric_mean(r[2] for r in rows)
    return HeadScore(tokens / max(1, rounds), speedup, all(r[3] for r in rows))


def install_head(candidate: Path, shipped: Path) -> None:
    """The shipped head's folder replaced by the candidate's files, whole: written beside it first,
    then swapped in, so an interrupted copy never leaves half a head. A file too large for git is
    refused before anything changes."""
    files = sorted(p for p in candidate.iterdir() if p.is_file())
    too_big = [p.name for p in files if p.stat().st_size >= HEAD_FILE_LIMIT]
    if too_big:
        raise SpecLensError(
            f"{', '.join(too_big)}: a head file in git stays under 10 MB (train-head shards it)"
        )
    staged = shipped.with_name(f".{shipped.name}.new-{int(time.time())}")
    staged.mkdir(parents=True)
    for p in files:
        shutil.copy2(p, staged / p.name)
    old = shipped.with_name(f".{shipped.name}.old-{int(time.time())}")
    if shipped.exists():
        shipped.rename(old)
    staged.rename(shipped)
    shutil.rmtree(old, ignore_errors=True)
