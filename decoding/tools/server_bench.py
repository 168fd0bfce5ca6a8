"""`python -m decoding bench --server URL`: the Spec-Bench prompts against a running vLLM or SGLang.

One prompt at a time through the server's OpenAI-compatible
`/v1/completions` (greedy, the same max tokens as SpecLens's own runs), with
its metrics page read before and after each prompt: so a deployment's draft
is measured on the very prompts SpecLens's own benchmark uses, and written
in the same files (results.csv, summary.md, meta.json).
"""

from __future__ import annotations

import datetime as _dt
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd

from ..errors import SpecLensError
from . import metrics

COLUMNS = [
    "category",
    "question_id",
    "prompt_tokens",
    "new_tokens",
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "acceptance_rate",
    "mean_acceptance_length",
    "per_position",
    "tokens_per_s",
]
REQUEST_TIMEOUT_S = 600.0


def _request(url: str, payload: dict | None = None, timeout: float = REQUEST_TIMEOUT_S) -> dict:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise SpecLensError(f"the server at {url} did not answer: {getattr(exc, 'reason', exc)}") from None


def served_model(server: str) -> str:
    """The first model the server lists: what the completions are asked of."""
    models = _request(f"{server}/v1/models", timeout=metrics.TIMEOUT_S).get("data") or []
    if not models:
        raise SpecLensError(f"{server}/v1/models lists no model")
    return models[0]["id"]


def run_prompt(server: str, model: str, prompt: str, max_new_tokens: int) -> dict:
    before = metrics.read(f"{server}/metrics")
    start = time.perf_counter()
    answer = _request(
        f"{server}/v1/completions",
        {"model": model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0},
    )
    wall = time.perf_counter() - start
    figures = metrics.summary(metrics.between(before, metrics.read(f"{server}/metrics")))
    usage = answer.get("usage") or {}
    new = usage.get("completion_tokens", 0)
    return {
        "prompt_tokens": usage.get("prompt_tokens"),
        "new_tokens": new,
        **{k: figures[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")},
        "acceptance_rate": figures["acceptance_rate"],
        "mean_acceptance_length": figures["mean_acceptance_length"],
        "per_position": json.dumps([round(p, 4) for p in figures["per_position"]]),
        "tokens_per_s": new / wall if wall > 0 else 0.0,
    }


def category_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per category and overall, pooled the way the engine pools: counts summed, then divided."""
    rows = []
    for name, part in [*df.groupby("category", sort=True), ("all", df)]:
        drafts = part["num_drafts"].sum()
        per_pos = [json.loads(p) for p in part["per_position"]]
        width = max((len(p) for p in per_pos), default=0)
        pos_counts = [
            sum(p[i] * d for p, d in zip(per_pos, part["num_drafts"]) if i < len(p)) for i in range(width)
        ]
        rows.append(
            {
                "category": name,
                "prompts": len(part),
                "acceptance_rate": part["num_accepted_tokens"].sum() / part["num_draft_tokens"].sum()
                if part["num_draft_tokens"].sum()
                else float("nan"),
                "mean_acceptance_length": 1 + part["num_accepted_tokens"].sum() / drafts
                if drafts
                else float("nan"),
                "per_position": [c / drafts for c in pos_counts] if drafts else [],
                "tokens_per_s": part["tokens_per_s"].mean(),
            }
        )
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    lines = [
        "| category | prompts | acceptance | mean acceptance length | per-position acceptance | tok/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        pos = ", ".join(f"{p:.2f}" for p in r.per_position)
        lines.append(
            f"| {r.category} | {r.prompts} | {r.acceptance_rate:.0%} | {r.mean_acceptance_length:.2f} "
            f"| {pos} | {r.tokens_per_s:.1f} |"
        )
    return "\n".join(lines)


def run_server_bench(
    server: str, prompts: list[dict], max_new_tokens: int, out: Path, command: str, say=print
) -> pd.DataFrame:
    server = server.rstrip("/")
    model = served_model(server)
    rows = []
    for i, p in enumerate(prompts, 1):
        row = run_prompt(server, model, p["prompt"], max_new_tokens)
        rows.append({"category": p["category"], "question_id": p["question_id"], **row})
        say(
            f"[{i}/{len(prompts)}] {p['category']} #{p['question_id']}: mean acceptance length "
            f"{row['mean_acceptance_length'] or 0:.2f}, {row['tokens_per_s']:.1f} tokens/s"
        )
    df = pd.DataFrame(rows, columns=COLUMNS)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "results.csv", index=False)
    date = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    meta = {
        "command": command,
        "date": date,
        "server": server,
        "model": model,
        "max_new_tokens": max_new_tokens,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    text = (
        f"server `{server}`, model `{model}`, greedy, {max_new_tokens} new tokens, {date[:10]}\n\n"
        f"`{command}`\n\n{markdown(category_table(df))}\n"
    )
    (out / "summary.md").write_text(text)
    return df
