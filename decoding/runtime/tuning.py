"""The kernel's choices that depend on the machine, measured at first use on each machine.

How far ahead to prefetch weights, whether to prefetch at all when a
product's rows fit one tile, and how many threads share a product decide
whether checking 5 tokens costs the same as checking 1: on a 2-core AMD
EPYC the hardware prefetchers alone serve one tile best, while on a 2-core Intel Xeon (Sapphire Rapids) the same build
checked 5 tokens in 1.41 plain steps and 9 in fewer. A kernel library picks
such choices per machine; so does this. The first time a compiled kernel is
loaded it times each candidate on products shaped like a small model's
(about 3 seconds), interleaved and repeated, keeps the defaults unless a
candidate is clearly faster, and writes the choice beside the kernel. A
change of kernel source or compiler flags gives a new kernel file and so a
new measurement; a change of CPU model or thread count does too.
SPECLENS_KERNEL_TUNE=0 keeps the defaults.

No choice changes the order of any sum (rows.h), so the results' bits are the
same whatever is chosen; the tests check it with each candidate forced.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import time
import warnings
from pathlib import Path

import torch

from ..settings.environment import cpu_info

# rows.h's Tuning, in rowlinear_tune's order.
TUNED = (
    "prefetch_weight_rows_ahead",
    "panel_chunk_steps",
    "panel_prefetch_chunks_ahead",
    "panel_prefetch_one_tile",
    "threads_per_product",
)
DEFAULTS = {"prefetch_weight_rows_ahead": 8, "panel_chunk_steps": 32, "panel_prefetch_chunks_ahead": 2,
            "panel_prefetch_one_tile": 0, "threads_per_product": 0}  # fmt: skip
PANEL_CANDIDATES = [
    {"panel_chunk_steps": chunk, "panel_prefetch_chunks_ahead": ahead, "panel_prefetch_one_tile": one}
    for one in (0, 1)
    for ahead in (1, 2, 4)
    for chunk in (16, 32, 64)
]
ROW_CANDIDATES = [{"prefetch_weight_rows_ahead": rows} for rows in (0, 4, 8, 16)]
ROWS = (1, 3, 5, 9, 17)  # a plain step, then verifications of k = 2, 4, 8 and a 16-node tree
# 24 products of 576 × 1536 (SmolLM2-135M's MLP shape): 85 MB, past a server's L3 as a model's step
# is (with 42 MB, a 32 MB L3 kept enough of it to make the candidates' order change run to run).
K, N, PRODUCTS = 576, 1536, 24
REPEATS = 5
MARGIN = 0.03  # a candidate replaces the defaults only when this much faster (geometric mean over ROWS)


def thread_candidates() -> list[dict[str, int]]:
    """Every thread torch offers (0), or half of them: past a few cores a product may stream its
    weights as fast on fewer threads, each then waiting less at the barriers."""
    threads = torch.get_num_threads()
    return [{"threads_per_product": 0}] + ([{"threads_per_product": threads // 2}] if threads >= 2 else [])


def apply(lib: ctypes.CDLL, choices: dict[str, int]) -> None:
    """Sets the kernel's tuned choices (any left out keep their defaults); only between products."""
    merged = DEFAULTS | choices
    lib.rowlinear_tune((ctypes.c_int64 * len(TUNED))(*(merged[name] for name in TUNED)))


def tune(lib: ctypes.CDLL, kernel: Path) -> str:
    """Applies this machine's choices for `kernel` (cached beside it, measured when missing) and says
    where they came from: "defaults", "cached" or "measured"."""
    if os.environ.get("SPECLENS_KERNEL_TUNE", "1") == "0":
        apply(lib, DEFAULTS)
        return "defaults"
    path = kernel.with_suffix(".tuning.json")
    choices = read_cache(path, kernel.name)
    if choices is not None:
        apply(lib, choices)
        return "cached"
    choices = measure(lib)
    apply(lib, choices)
    part = path.with_suffix(
        f".{os.getpid()}.part"
    )  # renamed into place: concurrent first runs never read half
    part.write_text(
        json.dumps({"kernel": kernel.name, "machine": machine_key(), "choices": choices}, indent=1)
    )
    os.replace(part, path)
    return "measured"


def machine_key() -> str:
    """What the choices were measured on: the CPU model and the threads a product runs on."""
    return f"{cpu_info()['model name']} / {torch.get_num_threads()} threads"


def read_cache(path: Path, kernel_name: str) -> dict[str, int] | None:
    """The cached choices, or None where there are none for this kernel and machine; a file that cannot
    be read is ignored with one warning (and measured again)."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if data["kernel"] != kernel_name or data["machine"] != machine_key():
            return None
        return {name: int(data["choices"][name]) for name in TUNED}
    except (OSError, ValueError, KeyError, TypeError):
        warnings.warn(f"ignoring the broken kernel tuning file {path}; measuring again", stacklevel=2)
        return None


def measure(lib: ctypes.CDLL) -> dict[str, int]:
    """The fastest panel candidate, row-prefetch distance and thread count, each against the defaults."""
    torch.manual_seed(0)
    weights = [torch.randn(N, K) for _ in range(PRODUCTS)]
    panels = [torch.empty(N * K) for _ in weights]
    for w, p in zip(weights, panels):
        lib.pack_panels(w.data_ptr(), p.data_ptr(), K, N)
    x, y = torch.randn(max(ROWS), K), torch.empty(max(ROWS), N)

    def panel_pass(rows: int) -> None:
        for p in panels:
            lib.rowlinear_panels(x.data_ptr(), p.data_ptr(), None, y.data_ptr(), rows, K, N)

    def row_pass(rows: int) -> None:
        for w in weights:
            lib.rowlinear(x.data_ptr(), w.data_ptr(), None, y.data_ptr(), rows, K, N)

    best = fastest(lib, PANEL_CANDIDATES, panel_pass, ROWS)
    best |= fastest(lib, ROW_CANDIDATES, row_pass, ROWS[:3])  # past 5 rows the panels run
    if len(threads := thread_candidates()) > 1:  # with the choices above in place
        best |= fastest(lib, threads, panel_pass, ROWS, base=best)
    apply(lib, DEFAULTS)
    return DEFAULTS | best


def fastest(
    lib: ctypes.CDLL, candidates: list[dict], one_pass, rows: tuple[int, ...], base: dict | None = None
) -> dict[str, int]:
    """The candidate whose passes over `rows` take the least time relative to the defaults', or the
    defaults' values unless it beats them by MARGIN twice: among all, then alone against them.
    `base`: choices set beside each candidate (the rest keep their defaults)."""
    base = base or {}
    default = {name: DEFAULTS[name] for name in candidates[0]}
    everyone = [default, *(c for c in candidates if c != default)]
    scores = relative_times(lib, [base | c for c in everyone], one_pass, rows, REPEATS)
    winner = everyone[min(range(len(everyone)), key=scores.__getitem__)]
    if winner == default or min(scores) >= 1 - MARGIN:
        return default
    # The best of many is partly luck: it must win again.
    again = relative_times(lib, [base | default, base | winner], one_pass, rows, 2 * REPEATS)
    # A copy: the caller merges more choices into it, and the candidate lists must stay as written
    # (pytest names its tests by them, and each worker process must name them alike).
    return dict(winner) if again[1] < 1 - MARGIN else default


def relative_times(
    lib: ctypes.CDLL, candidates: list[dict], one_pass, rows: tuple[int, ...], repeats: int
) -> list[float]:
    """Each candidate's time relative to the first's: the geometric mean over `rows` of the medians."""
    times: list[dict[int, list[float]]] = [{n: [] for n in rows} for _ in candidates]
    for _ in range(repeats):  # interleaved, so that a slow moment of a shared machine hits every candidate
        for candidate, seen in zip(candidates, times):
            apply(lib, candidate)
            one_pass(1)  # warm: the first pass after a change pays for nothing of the next
            for n in rows:
                started = time.perf_counter()
                one_pass(n)
                seen[n].append(time.perf_counter() - started)
    medians = [{n: statistics.median(ts) for n, ts in seen.items()} for seen in times]
    return [statistics.geometric_mean([m[n] / medians[0][n] for n in rows]) for m in medians]
