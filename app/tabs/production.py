"""Production: a deployment's speculative-decoding metrics (vLLM, SGLang) beside a SpecLens run,
and the k they make best."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from app.common import (
    download_folder,
    user_errors,
)
from decoding import costmodel
from decoding.errors import SpecLensError
from decoding.tools import metrics
from decoding.tools.batch_bench import load_measured
from decoding.tools.probe import measured_verify_ratio
from decoding.trace import Trace
from visualize.batch import draft_kind, engine_configs
from visualize.charts import (
    best_k_figure,
    per_position_figure,
)


def read_deployment(url: str | None, first: str | None, second: str | None) -> dict:
    """A deployment's figures from a metrics URL, a saved page, or two pages (the interval between)."""
    sources = [x for x in ((url or "").strip(), first, second) if x]
    if not sources:
        raise SpecLensError("give a metrics URL (http://host:port/metrics) or upload a saved metrics page")
    if len(sources) > 2:
        raise SpecLensError("give a URL or pages, at most two in all (two: the interval between them)")
    snapshots = [metrics.read(s) for s in sources]
    return metrics.interval(*snapshots) if len(snapshots) == 2 else metrics.summary(snapshots[0])


def check_production(url, first, second, *_) -> None:
    """Refuse an unreachable URL or a page without speculative-decoding metrics before any view
    changes (see `check_explore`)."""
    with user_errors():
        read_deployment(url, first, second)


def run_production(url, first, second, draft_cost: float, verify_growth: float, trace_dict: dict | None):
    """A deployment's acceptance beside this session's SpecLens run, and the best k for it (the
    deployment's machine is not this one: its verify cost is the slider's)."""
    with user_errors():
        figures = read_deployment(url, first, second)
        series = {f"{figures['engine']} deployment": figures["per_position"]}
        page = None
        if trace_dict:
            ours = metrics.snapshot_of([Trace.from_dict(trace_dict)])
            series["this SpecLens run"] = metrics.summary(ours)["per_position"]
            page = download_folder() / "speclens-metrics.prom"
            page.write_text(metrics.metrics_page(ours))
        verify = costmodel.linear_verify(float(verify_growth))
        choice = metrics.choose_k(figures, float(draft_cost), verify)
        costing = f"c = {float(draft_cost):.2f} target steps and checking k+1 tokens 1 + b·k, b = {float(verify_growth):.2f}"
        run = Trace.from_dict(trace_dict) if trace_dict else None
        return (
            per_position_figure(series),
            best_k_figure(choice.speedups, choice.best),
            production_text(figures, choice, costing, run),
            str(page) if page else None,
        )


def production_example(draft_cost: float, verify_growth: float, trace_dict: dict | None):
    """The Production tab without a server: the current Explore run exported as a metrics page in
    vLLM's names (the `speclens:` prefix), read back as a deployment's page would be."""
    with user_errors():
        if not trace_dict:
            raise SpecLensError("run a prompt in Explore first: its run becomes the example page")
        trace = Trace.from_dict(trace_dict)
        page = download_folder() / "speclens-example-metrics.prom"
        page.write_text(metrics.metrics_page(metrics.snapshot_of([trace])))
        figures = read_deployment(None, str(page), None)
        verify, checking = example_verify_cost(trace, float(verify_growth))
        costing = f"c = {float(draft_cost):.2f} target steps and {checking}"
        choice = metrics.choose_k(figures, float(draft_cost), verify)
        label = (
            "**Example page**: the current Explore run exported in vLLM's metric names (prefix `speclens:`), "
            "read back as a deployment's page would be. Point the URL at a real server to read yours."
        )
        return (
            per_position_figure({f"{figures['engine']} deployment": figures["per_position"]}),
            best_k_figure(choice.speedups, choice.best),
            f"{label}\n\n{production_text(figures, choice, costing, trace)}{batch_line(trace.meta.target, trace.meta.draft)}",
            str(page),
        )


def batch_line(target: str, draft: str) -> str:
    """Where the Traffic tab measured this target and draft here with many requests at once: the k by
    batch size those runs give, said to be measured with many requests (the line above is a
    one-request profile's prediction)."""
    found = load_measured(target)
    if found is None or found["draft"] != draft:
        return ""
    table = pd.DataFrame(found["rows"])
    vllm, _ = engine_configs(table, draft_kind(draft))
    sizes = ", ".join(str(int(b)) for b in sorted(set(table["batch"])))
    return (
        f"\n\nWith many requests at once the answer changes: **measured** on this machine on {found['date'][:10]} "
        f"(Traffic tab, batch sizes {sizes}, k = {', '.join(str(int(k)) for k in sorted(set(table['k'])))}), "
        f"this pair's draft length by batch size is `{' '.join(vllm.split())}`."
    )


def example_verify_cost(trace: Trace, verify_growth: float) -> tuple[Callable[[int], float], str]:
    """The example run's verify cost: what the probe measured for its target on this machine, where
    it did; else the slider's b, said so."""
    m = trace.meta
    measured = measured_verify_ratio(m.target, m.device or None, m.dtype or None)
    if measured is not None:
        ratio, when = measured
        return ratio, (
            f"checking k+1 tokens V(k+1)/V(1), as the probe measured it for {m.target} on this machine ({when})"
        )
    return costmodel.linear_verify(verify_growth), (
        f"checking k+1 tokens 1 + b·k, b = {verify_growth:.2f} from the slider: "
        f"V(n) is not measured for {m.target} on this machine yet (Theory → *Measure V(n)*)"
    )


def run_counting(trace: Trace) -> str:
    """An Explore run counted both ways: Explore's rounds (every target pass, one that drafted
    nothing too) and vLLM's drafts (num_drafts: the rounds that drafted), so that its tokens per
    round and its mean acceptance length read as one count of the same rounds."""
    t = trace.totals
    drafts = sum(1 for r in trace.rounds if r.drafted)
    alone = t.rounds - drafts
    length = f"1 + {t.accepted} accepted / {count(drafts, 'draft')} = **{1 + t.accepted / drafts:.2f}**"
    per_round = f"{count(t.new_tokens, 'token')} / {count(t.rounds, 'round')} = **{t.tokens_per_round:.2f}**"
    if not drafts:
        return f"**The Explore run**: none of its {count(t.rounds, 'round')} drafted, so vLLM would count no drafts."
    if not alone:
        return (
            f"**The Explore run**: all {count(t.rounds, 'round')} drafted, so vLLM counts as many drafts. "
            f"Mean acceptance length {length}; Explore's tokens per round {per_round}."
        )
    return (
        f"**The Explore run**: {count(t.rounds, 'round')}, {drafts} of which drafted: vLLM's num_drafts counts "
        f"those {drafts} only, not the {count(alone, 'round')} that drafted nothing (the target wrote its "
        f"token alone). Mean acceptance length (over the drafts) {length}; Explore's tokens per round (over "
        f"every round) {per_round}."
    )


def count(n: int, thing: str) -> str:
    return f"{n:,} {thing}{'s' * (n != 1)}"


def production_text(figures: dict, choice: metrics.KChoice, costing: str, run: Trace | None = None) -> str:
    """The deployment's figures by vLLM's definitions, the Explore run counted both ways (`run`,
    where there is one), and the best k."""

    def pct(x):
        return "–" if x is None else f"{x:.1%}"

    length = figures["mean_acceptance_length"]
    lines = [
        f"**{figures['engine']}**: mean acceptance length **{'–' if length is None else f'{length:.2f}'}** "
        f"(bonus token included), acceptance rate **{pct(figures['acceptance_rate'])}**"
        + (
            f", {figures['num_drafts']:,} drafts (vLLM's num_drafts: the rounds that drafted)"
            if figures["num_drafts"] is not None
            else ""
        )
        + ".",
    ]
    if run is not None and run.rounds:
        lines.append(run_counting(run))
    if "accepted_tokens_per_s" in figures:
        lines.append(
            f"Over the interval: {figures['accepted_tokens_per_s']:.1f} accepted and "
            f"{figures['drafted_tokens_per_s']:.1f} drafted tokens per second."
        )
    if choice.assumed:
        lines.append(
            "This engine reports no per-position acceptance: the profile assumes the same rate at each "
            f"of {choice.measured} positions."
        )
    lines.append(
        f"With a draft token costing {costing}, **num_speculative_tokens = {choice.best}** is best "
        f"among the k = 1–{choice.measured} its acceptance was measured for: "
        f"×{choice.speedups[choice.best - 1]:.2f} expected over plain decoding."
    )
    return "\n\n".join(lines)
