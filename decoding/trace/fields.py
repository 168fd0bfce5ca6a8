"""Type checks of a trace's fields as JSON gives them, shared by the schema's readers and
`validate`: a file from outside must be refused with one line, never break a view."""

from __future__ import annotations

import math
from typing import Any


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def is_ids(x: Any) -> bool:
    return isinstance(x, list) and all(is_int(i) for i in x)


def is_texts(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(t, str) for t in x)


def is_prob(x: Any) -> bool:
    # 1e-4 of slack: float32 softmax sums can round just past 1.
    return is_num(x) and -1e-4 <= x <= 1 + 1e-4


def meta_problem(meta: dict[str, Any]) -> str | None:
    for key in (
        "prompt",
        "target",
        "target_source",
        "draft",
        "draft_kind",
        "device",
        "dtype",
        "started",
        "stopped",
    ):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            return f"meta.{key} must be text"
    for key in ("compiled", "row_kernel", "packed_output_layer", "chat_template"):
        if not isinstance(meta.get(key, False), bool):
            return f"meta.{key} must be true or false"
    for key in ("prompt_tokens", "max_new_tokens", "tree_nodes", "branch", "batch_size", "batch_sequence"):
        if not is_int(meta.get(key, 0)):
            return f"meta.{key} must be a whole number"
    if not is_texts(meta.get("prompt_token_texts", [])):
        return "meta.prompt_token_texts must be a list of texts"
    versions = meta.get("versions", {})
    if not (isinstance(versions, dict) and is_texts(list(versions.values()))):
        return "meta.versions must map names to texts"
    sampling = meta.get("sampling", {})
    if not (
        isinstance(sampling, dict)
        and isinstance(sampling.get("greedy", True), bool)
        and all(is_num(sampling.get(key, 0)) for key in ("temperature", "top_p"))
        and all(is_int(sampling.get(key, 0)) for key in ("top_k", "seed"))
    ):
        return "meta.sampling must be an object: greedy true or false, temperature and top_p numbers, top_k and seed whole"
    policy = meta.get("policy", {})
    if not (
        isinstance(policy, dict)
        and isinstance(policy.get("name", ""), str)
        and is_int(policy.get("k", 0))
        and (policy.get("min_confidence") is None or is_num(policy["min_confidence"]))
    ):
        return (
            "meta.policy must be an object with a name, a whole-number k and min_confidence a number or null"
        )
    return None
