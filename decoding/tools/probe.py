"""`python -m decoding probe`: the target's step on this machine against what the machine allows.

For n tokens checked in one forward pass, a step can go no faster than the
larger of two limits: streaming the weights once (weight bytes ÷ memory
bandwidth) and doing the arithmetic (n × FLOPs per token ÷ the peak of a
large matrix product). Both limits are measured here, on this machine, with
the same process and threads the decoder uses.

What the probe found is kept in the cache folder, one file per machine,
target, device and dtype (`measure`, `cached`): the app's Theory and
Production tabs open on this machine's own V(n) once it was measured here.

A machine with noisy neighbours can time V(1) at twice V(2), and every
prediction made from it would inherit that. So the row counts are timed in
interleaved passes (each pass times every n, each n first in turn), each n
keeps its spread over the passes, and a result that breaks physics (checking
more tokens for less than one, beyond the noise; V(1) far over its limit while
V(2) sits at it; passes scattered too widely to say) is measured again, a few
times at most, then refused. What is kept says when, over how many passes, how
noisy, and under what load (`provenance`); an older file without those figures
is still read, and a kept file that breaks physics is not used (`kept`).
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from .. import costmodel
from ..errors import SpecLensError
from ..models.loading import LoadedModel, pick_device, pick_dtype
from ..runtime.forward import crop, forward, new_cache
from ..runtime.rowlinear import RowLinear, kernel_choices
from ..runtime.static import drop_static, graphed, use_static, warm_up
from ..settings.environment import cache_dir
from .bench import machine

ROWS = (1, 2, 3, 5, 9, 17, 32, 64)  # 32 and 64: what several requests decoded together check
CONTEXT = 100  # tokens already in the cache, as in a short chat turn
CPU = torch.device("cpu")
PASSES = 15  # interleaved passes over every n
TRIES = 3  # a result that breaks physics is measured again, this many times in all at most
NOISE_FLOOR = 0.1  # V(n) this far below V(1) is no timing jitter on a quiet machine
FAR_OVER = 1.5  # V(1) this many times further over its limit than V(2): the same weights stream for both
# The middle half of a row count's passes spanning more than its median: no figure to keep. Narrower is
# kept, its ± said (on 2 cores of an AMD EPYC, V(1)'s was 0.52 under a load average of 12, 0.12 under 4.7).
MAX_SPREAD = 1.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # the GPU runs behind the host: a time means the work is done
        torch.cuda.synchronize(device)


def _ms(fn, device: torch.device = CPU) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - start) * 1e3


def _best_ms(fn, reps: int, device: torch.device = CPU) -> float:
    fn()  # the first call allocates
    return min(_ms(fn, device) for _ in range(reps))


def streaming_reads(mb: int = 256, device: torch.device = CPU):
    """Two reads of `mb` MB of float32 on `device` that do little else (a matrix-vector product and a
    sum), and their bytes.

    The limit is the faster of the two: on an AMD EPYC the product read 22 GB/s
    and the sum 32, and the model's own products stream faster than the
    product, so the product alone understated the limit. torch's, on the
    decoder's own threads: numpy's BLAS keeps threads of its own spinning
    after each call, which slowed the step timed next by ×2-3.
    """
    n = int((mb * 2**20 / 4) ** 0.5)
    a, x = torch.ones(n, n, device=device), torch.ones(n, device=device)
    return (lambda: torch.mv(a, x), a.sum), a.numel() * a.element_size()


def peak_gflops(n: int = 2048, reps: int = 4, device: torch.device = CPU, dtype=torch.float32) -> float:
    """The arithmetic the device can do in the model's dtype: the best n×n×n product (torch's or,
    on the CPU, numpy's float32)."""
    ta = torch.ones(n, n, device=device, dtype=dtype)
    ms = _best_ms(lambda: ta @ ta, reps, device)
    if device.type == "cpu" and dtype == torch.float32:
        na = np.ones((n, n), dtype=np.float32)
        ms = min(ms, _best_ms(lambda: na @ na, reps))
    return 2 * n**3 / ms / 1e6


def matmul_weights(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes, parameters) of the weights a step multiplies by: every linear layer, output layer included."""
    linears = (torch.nn.Linear, RowLinear)
    weights = [m.weight for m in model.modules() if isinstance(m, linears)]
    head = model.get_output_embeddings()
    if head is not None:  # read once per step whatever module holds it
        weights.append(head.weight)
    # Tied weights, and the views a fused product leaves its parts, share storage: count it once.
    storages = {
        w.untyped_storage().data_ptr(): (w.untyped_storage().nbytes(), w.element_size()) for w in weights
    }
    return sum(b for b, _ in storages.values()), sum(b // size for b, size in storages.values())


def steps_and_bandwidth(
    model: torch.nn.Module, rows: tuple[int, ...], reps: int = PASSES
) -> tuple[dict, list[float]]:
    """Times (ms) of one forward pass over n new tokens after CONTEXT cached ones, for each n, and the
    bandwidth (GB/s) of the faster streaming read just before them, rep by rep: a shared machine's
    memory changes speed within seconds (33 and 57 GB/s in turn on an AMD EPYC), so each rep's steps
    are set against what memory did then. Each rep times every n, starting from another each time:
    a neighbour's burst, or threads still spinning after the read, then falls on every n alike."""
    device = model.get_output_embeddings().weight.device
    cache = new_cache(model)
    forward(model, torch.arange(CONTEXT, device=device).view(1, -1) % 1000 + 10, cache, keep=1)
    # A GPU reads 256 MB in tens of microseconds: a larger read times its memory better.
    reads, nbytes = streaming_reads(2048 if device.type == "cuda" else 256, device)
    steps: dict[int, list[float]] = {n: [] for n in rows}
    bandwidths: list[float] = []
    for rep in range(reps + 1):  # the first pass of each allocates
        fastest = min(_ms(read, device) for read in reads)
        times = {}
        turn = rep % len(rows)
        for n in rows[turn:] + rows[:turn]:
            ids = torch.arange(n, device=device).view(1, -1) + 20
            times[n] = _ms(lambda ids=ids: forward(model, ids, cache), device)
            crop(cache, CONTEXT)
        if rep:
            bandwidths.append(nbytes / fastest / 1e6)
            for n in rows:
                steps[n].append(times[n])
    return steps, bandwidths


def probe(target: LoadedModel, rows: tuple[int, ...] = ROWS, graphs: bool = True) -> dict:
    """Measured step times for each n in `rows`, V(n)/V(1), and the machine's limits for them.

    `step_ms`, `limit_ms` and `bandwidth_gbs` are medians over the reps, `step_min_ms` and
    `step_max_ms` the fastest and slowest rep, `spread` the middle half of the reps' span over the
    median; `step_over_limit` is the median of each rep's step against that rep's limit.
    On a GPU with `graphs`, the steps are replayed from CUDA graphs over a static cache, as a
    run's are (decoding/runtime/static.py); `graphs` in the result says whether they were.
    """
    weight_bytes, params = matmul_weights(target.model)
    device = target.device
    if graphs and device.type == "cuda" and use_static(target.model, CONTEXT + max(rows)) is not None:
        warm_up(target.model, [(n, 0) for n in rows])
    elif not graphs:
        drop_static(target.model)
    peak = peak_gflops(8192 if device.type == "cuda" else 2048, device=device, dtype=target.dtype)
    steps, bandwidths = steps_and_bandwidth(target.model, rows)

    def limit(n: int, bandwidth: float) -> float:
        return max(weight_bytes / bandwidth / 1e6, 2 * params * n / peak / 1e6)

    bandwidth = statistics.median(bandwidths)
    result: dict = {
        "target": target.name,
        "dtype": str(target.dtype).removeprefix("torch."),
        "device": str(target.device),
        "row_kernel": target.row_kernel,
        "kernel": kernel_choices() if target.row_kernel else {"build": "none"},
        "packed_output_layer": target.packed,
        "graphs": graphed(target.model),
        "weight_bytes": weight_bytes,
        "bandwidth_gbs": round(bandwidth, 2),
        "peak_gflops": round(peak, 1),
        "passes": len(bandwidths),
    }
    one = statistics.median(steps[rows[0]])
    for n in rows:
        paired = [step / limit(n, b) for step, b in zip(steps[n], bandwidths, strict=True)]
        low, median, high = statistics.quantiles(steps[n], n=4, method="inclusive")
        result[str(n)] = {
            "step_ms": round(median, 2),
            "verify_ratio": round(median / one, 3),
            "limit_ms": round(limit(n, bandwidth), 2),
            "step_over_limit": round(statistics.median(paired), 3),
            "step_min_ms": round(min(steps[n]), 2),
            "step_max_ms": round(max(steps[n]), 2),
            "spread": round((high - low) / median, 3),
        }
    return result


def cache_file(target: str, device: torch.device, dtype: torch.dtype, compiled: bool = False) -> Path:
    """Where the probe's figures for `target` are kept: they hold for this machine, device, dtype
    and compilation alone, so all of them name the file."""
    key = json.dumps([machine(), target.strip(), str(device), str(dtype), compiled])
    return cache_dir() / "probe" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def _load() -> float | None:
    """The machine's load over the last minute (runnable processes), where the system says it."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def first_plausible(take: Callable[[], dict], tries: int = TRIES) -> dict:
    """The first of up to `tries` results of `take` that breaks no physics (`physics_problems`),
    with how many it took; refused with the last one's first problem when none did."""
    for attempt in range(1, tries + 1):
        found = take()
        problems = physics_problems(found)
        if not problems:
            return found | {"tries": attempt}
    raise SpecLensError(
        f"V(n) was measured {tries} times and broke physics each time ({problems[0]}): the machine is "
        "too busy to time it now, so nothing was kept; measure again when it is quieter"
    )


def measure(target: LoadedModel, graphs: bool = True, tries: int = TRIES) -> dict:
    """`probe`, with the machine, the time and its load, kept where `cached` finds it; measured
    again where it breaks physics, and refused after `tries` (`first_plausible`)."""

    def timed() -> dict:
        before = _load()
        return probe(target, graphs=graphs) | {
            "machine": machine(),
            "measured_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "load": {"before": before, "after": _load(), "cores": os.cpu_count()},
        }

    found = first_plausible(timed, tries)
    path = cache_file(target.name, target.device, target.dtype, target.compiled)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(f".{os.getpid()}.part")  # whole or not at all, with two servers writing
    part.write_text(json.dumps(found, indent=1))
    part.replace(path)
    return found


def physics_problems(found: dict) -> list[str]:
    """What in a probe's result no quiet machine could time, each in a line; empty when nothing.

    Checking n tokens reads the same weights as checking one and does more arithmetic, so V(n)
    below V(1) beyond the two's noise is a neighbour's load, not the model; so is V(1) far further
    over its limit than V(2) over the same limit. Older results, without a spread, get NOISE_FLOOR.
    """
    rows = {int(n): row for n, row in found.items() if n.isdigit()}
    one = rows.get(1)
    if one is None:
        return []
    problems = [
        f"V({n}) = {row['step_ms']:.1f} ms, below V(1) = {one['step_ms']:.1f} ms: checking {n} tokens "
        "cannot cost less than checking one"
        for n, row in sorted(rows.items())
        if n > 1
        and row["step_ms"]
        < one["step_ms"] * (1 - max(NOISE_FLOOR, row.get("spread", 0) + one.get("spread", 0)))
    ]
    two = rows.get(2)
    if two and one["step_over_limit"] > FAR_OVER * two["step_over_limit"]:
        problems.append(
            f"V(1) is {one['step_over_limit']:.2f}× its limit while V(2) is {two['step_over_limit']:.2f}× "
            "its own: both stream the same weights"
        )
    problems += [
        f"V({n})'s passes scattered by {row['spread']:.0%} of their median (the middle half of them)"
        for n, row in sorted(rows.items())
        if row.get("spread", 0) > MAX_SPREAD
    ]
    return problems


def provenance(found: dict, day: bool = True) -> str:
    """When, over how many passes, how noisy and under what load the probe measured `found` (the
    day left out where the sentence already gives it): every view that uses it names it so."""
    stamp = found.get("measured_at", "?")
    when = f"measured {stamp[:10]} at {stamp[11:16]} UTC" if day else f"timed at {stamp[11:16]} UTC"
    spreads = [row["spread"] for n, row in found.items() if n.isdigit() and "spread" in row]
    if not spreads:
        return f"{when} by an older probe, which kept no spread or load"
    load = found.get("load") or {}
    under = (
        f", load {load['before']:.1f} → {load['after']:.1f} on {load['cores']} cores"
        if load.get("before") is not None and load.get("after") is not None
        else ""
    )
    return (
        f"{when} over {found.get('passes', '?')} interleaved passes, each V(n) within "
        f"±{max(spreads) / 2:.0%} (the middle half of its passes){under}"
    )


def kept(target: str, device: str | None = None, dtype: str | None = None) -> tuple[dict | None, str]:
    """What `measure` kept for `target` (the device and dtype it loads with by default, as the app
    loads it) on this machine, and "" ; or None and why not: never measured here, or measured on a
    machine too busy to trust (a file from before the probe refused such results)."""
    try:
        dev = pick_device(device)
        found = json.loads(cache_file(target, dev, pick_dtype(dev, dtype)).read_text())
    except (SpecLensError, OSError, ValueError):  # no such device here, never measured, a file cut short
        return None, "never measured here"
    if not isinstance(found, dict) or not verify_ratios(found):
        return None, "never measured here"
    problems = physics_problems(found)
    if problems:
        return None, (
            f"the V(n) kept from {found.get('measured_at', '?')[:10]} breaks physics ({problems[0]}): it was "
            "timed on a busy machine, so it is not used"
        )
    return found, ""


def cached(target: str, device: str | None = None, dtype: str | None = None) -> dict | None:
    """What `measure` kept for `target` on this machine (`kept`), or None when it never measured
    it here or what it kept cannot be trusted."""
    return kept(target, device, dtype)[0]


def measured_verify_ratio(
    target: str, device: str | None = None, dtype: str | None = None
) -> tuple[Callable[[int], float], str] | None:
    """V(n)/V(1) for any n as the probe measured it for `target` on this machine (straight lines
    between its points, costmodel.verify_ratio_at), and when, how noisy and under what load it
    did (`provenance`); None where it never did, or not in a way to trust."""
    found = cached(target, device, dtype)
    if found is None:
        return None
    return functools.partial(costmodel.verify_ratio_at, verify_ratios(found)), provenance(found)


def verify_ratios(found: dict) -> dict[int, float]:
    """V(n)/V(1) for each n the probe measured."""
    return {int(n): row["verify_ratio"] for n, row in found.items() if n.isdigit()}


def concurrency_what_if(ratios: dict[int, float], alpha: float, c: float, ks: range = range(1, 7)) -> dict:
    """Predicted speedup against the number of requests decoded together, for each k, from the
    measured V(n)/V(1) (costmodel.concurrent_speedup), and the number at which it stops paying.
    Beyond the largest n measured, V grows along its last measured slope."""

    def ratio(n: int) -> float:
        return costmodel.verify_ratio_at(ratios, n)

    return {
        "predicted_from": "the step costs measured above (V(n)/V(1)), not measured runs",
        "alpha": alpha,
        "draft_cost_c": c,
        "speedup_by_k": {
            str(k): {
                str(b): round(costmodel.concurrent_speedup(alpha, k, c, ratio, b), 3)
                for b in costmodel.CONCURRENCY
            }
            for k in ks
        },
        "stops_paying_at": {str(k): costmodel.break_even_concurrency(alpha, k, c, ratio) for k in ks},
        "measured_up_to_rows": max(ratios),  # more rows (B·(k+1)) than this: a straight-line guess
    }
