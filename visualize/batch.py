"""A batched run's figures in words: why speculation pays or stops paying with more requests at
once, and the draft length by batch size as vLLM and SGLang take it."""

from __future__ import annotations

import json

import pandas as pd

from decoding import costmodel

FLAT = 1.25  # a pass "costs about the same" while it takes at most this many times a one-row pass

# vLLM's `speculative_config["method"]` for each SpecLens draft kind (the hybrid's head is EAGLE-3).
VLLM_METHODS = {
    "ngram": "ngram",
    "suffix": "suffix",
    "head": "eagle3",
    "hybrid": "eagle3",
    "model": "draft_model",
}


def draft_kind(spec: str) -> str:
    """The kind of draft a draft spec names, as VLLM_METHODS keys them."""
    if spec.startswith("ngram+head"):
        return "hybrid"
    if spec.startswith("head"):
        return "head"
    return spec if spec in ("ngram", "suffix") else "model"


def flat_rows(verify_ms) -> int:
    """The most rows a pass takes for at most FLAT times a one-row pass (checked up to 256)."""
    one = verify_ms(1)
    return max([n for n in range(1, 257) if verify_ms(n) <= FLAT * one] or [1])


def why_sentence(table: pd.DataFrame, pass_ms: dict[int, float]) -> str:
    """One sentence from the measured rows: what a pass costs by its rows on this machine, and what
    that does to speculation at the smallest batch and at the first larger one where it stops
    paying (else the largest)."""
    if table.empty:
        return ""
    verify_ms = costmodel.pass_cost(list(pass_ms.items()))
    limit = flat_rows(verify_ms)
    best = table.loc[table.groupby("batch")["speedup"].idxmax()].sort_values("batch")
    small = best.iloc[0]
    later = best.iloc[1:]
    losing = later[later["speedup"] < 1.0]
    large = losing.iloc[0] if not losing.empty and small.speedup >= 1.0 else best.iloc[-1]
    rows = (
        f"a target pass costs about the same for up to {limit} rows (V({limit}) ≤ {FLAT:g} × V(1)), then grows with them"
        if limit > 1
        else f"even 2 rows cost more than {FLAT:g} times a one-row pass"
    )
    text = (
        f"Here {rows}. At {_requests(int(small.batch))}, a round's check of {small.rows_per_pass:.0f} rows "
        f"brings {small.tokens_per_round:.2f} tokens a request (×{small.speedup:.2f} at k={int(small.k)})"
    )
    if large.batch == small.batch:
        return text + "."
    verdict = "speculation does not pay" if large.speedup < 1.0 else "speculation still pays"
    return text + (
        f"; at {_requests(int(large.batch))}, plain decoding already fills a pass with {int(large.batch)} rows and "
        f"speculation's {large.rows_per_pass:.0f} rows cost {verify_ms(large.rows_per_pass) / verify_ms(large.batch):.1f} "
        f"times that pass for {large.tokens_per_round:.2f} tokens a request: {verdict} "
        f"(×{large.speedup:.2f} at its best k, {int(large.k)})."
    )


def busy_note(table: pd.DataFrame, pass_ms: dict[int, float]) -> str:
    """Why these timings cannot come from a quiet machine, or "": a speedup above the tokens a round
    brings, or plain decoding whose tokens/s grow far less with the batch than its own passes allow
    (B rows for V(B) against one row for V(1))."""
    if table.empty:
        return ""
    if (table["speedup"] > table["tokens_per_round"] * 1.1).any():
        return "a speedup above its tokens a round"
    # Decode tokens/s only: the prefills, the same at every batch size, would hide what the passes do.
    if "decode_tokens_per_s_plain" not in table or len(pass_ms) < 2:
        return ""
    verify_ms = costmodel.pass_cost(list(pass_ms.items()))
    plain = table.groupby("batch")["decode_tokens_per_s_plain"].median()
    one = plain.get(min(plain.index))
    for b, tps in plain.items():
        allowed = b * verify_ms(1) / verify_ms(b)  # what the passes alone allow, over one row's rate
        if b > 1 and tps / one < 0.5 * allowed:
            return f"plain decoding at batch {b} ran {tps / one:.1f} times batch 1's tokens/s where its passes allow {allowed:.1f}"
    return ""


def spread_note(table: pd.DataFrame) -> str:
    """Where the k by batch size rests on single runs, or on speedups within their spread of ×1."""
    if "speedup_low" in table and (table["speedup_low"] == table["speedup_high"]).all():
        return (
            "Each point ran once: there is no spread to judge by, so take the ranges below as a first look."
        )
    close = (
        table[(table["speedup_low"] < 1.0) & (table["speedup_high"] > 1.0)]
        if "speedup_low" in table
        else table[:0]
    )
    if not close.empty:
        sizes = ", ".join(str(int(b)) for b in sorted(set(close["batch"])))
        return f"At batch {sizes} the repeats fall on both sides of ×1: there, speculation's gain is within the noise."
    return ""


def _requests(n: int) -> str:
    return "1 request" if n == 1 else f"{n} requests together"


def k_ranges(table: pd.DataFrame) -> list[tuple[int, int, int]]:
    speedups: dict[int, dict[int, float]] = {}
    for r in table.itertuples():
        speedups.setdefault(int(r.batch), {})[int(r.k)] = float(r.speedup)
    return costmodel.k_per_batch_size(speedups)


def engine_configs(table: pd.DataFrame, draft_kind: str) -> tuple[str, str]:
    """vLLM's `--speculative-config` and SGLang's `--speculative-adaptive-config` file for the draft
    length by batch size these measurements recommend, as JSON texts; where speculation paid at no
    batch size, a line saying to leave it off."""
    ranges = k_ranges(table)
    if all(k == 0 for _, _, k in ranges):
        off = f"speculation paid at no batch size measured ({_sizes(table)}): leave it off"
        return off, off
    vllm = costmodel.vllm_speculative_config(VLLM_METHODS.get(draft_kind, "draft_model"), ranges)
    return json.dumps(vllm, indent=1), json.dumps(costmodel.sglang_adaptive_config(ranges), indent=1)


def _sizes(table: pd.DataFrame) -> str:
    return ", ".join(str(int(b)) for b in sorted(set(table["batch"])))
