"""The figures recorded on GPUs in benchmarks/gpu-*/ (scripts/device-check.sh), for pricing a run
measured elsewhere on them (costmodel.price_on_gpu).

A folder holds `probe-<shape>.json` files (V(n) of one model shape), `bench-*/` runs (meta.json and
results.csv: a draft model's cost c beside its target), and may hold the same again in a subfolder
(`no-graphs/`: steps without CUDA graphs). Each folder (or subfolder) and graphs setting is one
figure set. A probe from before the probe recorded `graphs` replayed none. Whatever cannot be read
(a file cut short, a probe of a CPU, a folder with no probe) is skipped: the rest still counts.
"""

from __future__ import annotations

import csv
import json
import math
import shlex
from pathlib import Path

from ..costmodel import BOOKKEEPING_DRAFTS, GpuFigures, GpuPricing, model_shape, price_on_gpu
from ..trace import Trace

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
UNREADABLE = (OSError, ValueError, KeyError, TypeError, AttributeError)


def recorded(root: Path = BENCHMARKS) -> list[GpuFigures]:
    """Every figure set under root/gpu-*/, its folders in name order."""
    found: list[GpuFigures] = []
    for folder in sorted(root.glob("gpu-*")):
        try:
            places = [folder, *sorted(p for p in folder.iterdir() if p.is_dir())]
        except OSError:  # not a folder, or not readable
            continue
        for place in places:
            found += _figure_sets(place, root.parent)
    return found


def read_probe(path: Path) -> dict | None:
    """A probe's result as a figure set needs it, or None where it is no GPU's readable V(n)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
        if not str(found.get("device", "")).startswith("cuda"):
            return None
        steps = {int(n): float(row["step_ms"]) for n, row in found.items() if n.isdigit()}
        if not steps.get(1, 0) > 0 or not all(math.isfinite(ms) and ms > 0 for ms in steps.values()):
            return None
        name = str(found.get("target") or path.stem.removeprefix("probe-"))
        return {
            "shape": model_shape(name),
            "random": name.rstrip("/").endswith("-random"),
            "graphs": bool(found.get("graphs", False)),
            "card": str(found.get("machine") or ""),
            "dtype": str(found.get("dtype", "")),
            "date": str(found.get("measured_at", ""))[:10],
            "steps": steps,
        }
    except UNREADABLE:
        return None


def _figure_sets(place: Path, repo: Path) -> list[GpuFigures]:
    """The figure sets of one folder: its probes grouped by card, dtype and graphs, each with the
    draft costs its bench runs measured under the same settings."""
    probes = [p for p in (read_probe(f) for f in sorted(place.glob("probe-*.json"))) if p]
    groups: dict[tuple[str, str, bool], list[dict]] = {}
    for p in probes:
        groups.setdefault((p["card"] or _card(place), p["dtype"], p["graphs"]), []).append(p)
    sets = []
    for (card, dtype, graphs), members in groups.items():
        costs, dates = _draft_costs(place, graphs)
        sets.append(
            GpuFigures(
                card=card or "an unnamed GPU",
                dtype=dtype,
                graphs=graphs,
                date=min([p["date"] for p in members if p["date"]] or dates or [""]),
                source=str(place.relative_to(repo)) if place.is_relative_to(repo) else str(place),
                random_weights=all(p["random"] for p in members),
                steps_ms={p["shape"]: p["steps"] for p in members},
                draft_costs=costs,
            )
        )
    return sets


def _card(place: Path) -> str:
    """The card machine.txt names (nvidia-smi's first field), in this folder or the one above."""
    for folder in (place, place.parent):
        try:
            return (folder / "machine.txt").read_text(encoding="utf-8").split(",")[0].strip()
        except OSError:
            continue
    return ""


def _draft_costs(place: Path, graphs: bool) -> tuple[dict[tuple[str, str], float], list[str]]:
    """c of each draft model a bench run measured here with `graphs` as given, by (target shape,
    draft shape), its prompts' mean; and the runs' dates."""
    costs: dict[tuple[str, str], float] = {}
    dates: list[str] = []
    for meta_file in sorted(place.glob("bench-*/meta.json")):
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
            if not str(meta["device"]).startswith("cuda") or bool(meta.get("graphs", False)) != graphs:
                continue
            args = shlex.split(meta["command"])
            target, draft = args[args.index("--target") + 1], args[args.index("--draft") + 1]
            with (meta_file.parent / "results.csv").open(encoding="utf-8") as f:
                measured = [float(row["draft_cost"]) for row in csv.DictReader(f) if row.get("draft_cost")]
        except UNREADABLE:
            continue
        measured = [c for c in measured if math.isfinite(c)]
        if measured and _is_model(draft):
            costs[(model_shape(target), model_shape(draft))] = sum(measured) / len(measured)
            dates.append(str(meta.get("date", ""))[:10])
    return costs, [d for d in dates if d]


def _is_model(draft: str) -> bool:
    """A draft spec that names a model (not n-gram, suffix, a head, the target's layers or a mix)."""
    return draft not in BOOKKEEPING_DRAFTS and not draft.startswith(("head", "layers:", "ngram+"))


def price_lines(trace: Trace, sets: list[GpuFigures]) -> list[str]:
    """`python -m decoding price`: the run on each recorded GPU, k by k, or why not, as text."""
    if not sets:
        return ["no GPU figures are recorded (benchmarks/gpu-*/)"]
    t = trace.totals
    measured = f"×{t.speedup:.2f} against plain decoding" if t.speedup else "not compared with plain decoding"
    lines = [
        f"this run ({trace.meta.target} with {trace.meta.draft}, k = {trace.meta.policy.k}, measured on "
        f"{trace.meta.device or 'an unrecorded device'}): {measured}"
    ]
    for pricing in (price_on_gpu(trace, figures) for figures in sets):
        lines += ["", f"predicted on the {pricing.figures.card}, {pricing.figures.conditions()}:"]
        lines += _price_table(pricing)
    return lines


def _price_table(pricing: GpuPricing) -> list[str]:
    if pricing.unpriced:
        return [f"  {pricing.unpriced}"]
    rows = [f"  k={p.k:<3} ×{p.speedup:.2f}  {p.tokens_per_s:.1f} tokens/s" for p in pricing.prices]
    return [
        *rows,
        f"  plain decoding {1e3 / pricing.step_ms:.1f} tokens/s at the card's one-token step of "
        f"{pricing.step_ms:.2f} ms; {pricing.draft_cost}",
    ]
