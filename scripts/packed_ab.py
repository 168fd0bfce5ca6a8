"""Side by side on one machine: SmolLM2's step with the eager output layer and with the packed one.

Interleaved per row count (eager, packed, eager, packed, ...) so that the
noise of a shared machine falls on both alike; medians of 12 passes after
100 cached tokens. Run from the repository root: `.venv/bin/python -m scripts.packed_ab`.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from decoding.bench import machine
from decoding.forward import crop, forward, new_cache
from decoding.packed import pack_output_layer
from decoding.probe import CONTEXT, ROWS

TARGET = "smollm2-135m"


def main() -> None:
    from transformers import AutoModelForCausalLM

    from decoding.models import resolve_source

    source = resolve_source(TARGET)
    models = {name: AutoModelForCausalLM.from_pretrained(source).eval() for name in ("eager", "packed")}
    assert pack_output_layer(models["packed"])
    caches = {name: new_cache(m) for name, m in models.items()}
    for name, m in models.items():
        forward(m, torch.arange(CONTEXT).view(1, -1) + 10, caches[name], keep=1)
    result: dict = {"machine": machine()}
    for n in ROWS:
        ids = torch.arange(n).view(1, -1) + 20
        times: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(14):
            for name, m in models.items():
                start = time.perf_counter()
                forward(m, ids, caches[name])
                times[name].append(time.perf_counter() - start)
                crop(caches[name], CONTEXT)
        result[str(n)] = {name: round(statistics.median(t[2:]) * 1e3, 1) for name, t in times.items()}
    for name in models:
        result[f"{name}_V5/V1"] = round(result["5"][name] / result["1"][name], 2)
        result[f"{name}_V9/V1"] = round(result["9"][name] / result["1"][name], 2)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
