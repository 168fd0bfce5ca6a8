"""Prompt files: JSON lines with a `prompt` (and, for benchmarks, a `category`), as Spec-Bench's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..errors import SpecLensError


def read_prompts(
    path: Path,
    limit: int = 0,
    fits: Callable[[str], bool] | None = None,
    need_category: bool = True,
) -> list[dict]:
    """Rows of `category`, `question_id` and `prompt`: the first `limit` of each category (0: all);
    with `fits`, only prompts that fit the target. Without `need_category` a row needs only its
    prompt (its category is then "")."""
    if not path.is_file():
        raise SpecLensError(f"no prompts file at '{path}'")
    rows, seen = [], {}
    # Split on newlines alone: splitlines() would also cut at the U+2028 a prompt may hold.
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        category, prompt, question_id = _parse(line, need_category, f"{path}:{n}")
        if (not limit or seen.get(category, 0) < limit) and (fits is None or fits(prompt)):
            seen[category] = seen.get(category, 0) + 1
            rows.append({"category": category, "question_id": question_id or n, "prompt": prompt})
    if not rows:
        raise SpecLensError(f"'{path}' holds no prompts" + (" that fit the target's context" if fits else ""))
    return rows


def _parse(line: str, need_category: bool, where: str) -> tuple[str, str, object]:
    expected = "a JSON object with category and prompt" if need_category else "a JSON object with a prompt"
    try:
        row = json.loads(line)
        prompt = row["prompt"]
        category = row["category"] if need_category else row.get("category", "")
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise SpecLensError(f"{where}: expected {expected}") from None
    if not isinstance(prompt, str):
        raise SpecLensError(f"{where}: expected {expected}")
    return category, prompt, row.get("question_id")
