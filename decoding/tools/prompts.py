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
    extra: tuple[str, ...] = (),
) -> list[dict]:
    """Rows of `category`, `question_id` and `prompt`: the first `limit` of each category (0: all);
    with `fits`, only prompts that fit the target. Without `need_category` a row needs only its
    prompt (its category is then ""). The `extra` fields a line holds are kept as they are."""
    if not path.is_file():
        raise SpecLensError(f"no prompts file at '{path}'")
    rows, seen = [], {}
    # Split on newlines alone: splitlines() would also cut at the U+2028 a prompt may hold.
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        row = _parse(line, need_category, f"{path}:{n}")
        category, prompt = row["category"], row["prompt"]
        if (not limit or seen.get(category, 0) < limit) and (fits is None or fits(prompt)):
            seen[category] = seen.get(category, 0) + 1
            kept = {"category": category, "question_id": row.get("question_id") or n, "prompt": prompt}
            rows.append(kept | {name: row[name] for name in extra if name in row})
    if not rows:
        raise SpecLensError(f"'{path}' holds no prompts" + (" that fit the target's context" if fits else ""))
    return rows


def _parse(line: str, need_category: bool, where: str) -> dict:
    """The line's object, its category set ("" where none is needed and none is given)."""
    expected = "a JSON object with category and prompt" if need_category else "a JSON object with a prompt"
    try:
        row = json.loads(line)
        prompt = row["prompt"]
        category = row["category"] if need_category else row.get("category", "")
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise SpecLensError(f"{where}: expected {expected}") from None
    if not isinstance(prompt, str):
        raise SpecLensError(f"{where}: expected {expected}")
    return row | {"category": category}
