"""Side by side on one machine: SmolLM2's step in each CPU mode SpecLens has had.

- `eager`: the model's own forward, `F.linear` everywhere (MKL), Hugging Face's cache;
- `packed`: the same with the output layer packed for oneDNN (the default until the kernel);
- `kernel`: SpecLens's linear kernel, fused products and the lean pass's loop over the model's
  own modules, over an in-place cache (the default until the layer kernel);
- `layer`: the default now: the decoder layers, the final norm and the output layer one call of `kernels/layer.cpp`.

Interleaved per row count (eager, packed, kernel, layer, eager, ...) so that the
noise of a shared machine falls on all alike; medians of 12 passes after 100
cached tokens. Run from the repository root: `.venv/bin/python -m scripts.step_ab`.
"""

from __future__ import annotations

import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from decoding.models.loading import resolve_source
from decoding.runtime.forward import crop, forward, new_cache
from decoding.runtime.llama import fuse_projections, use_layer_kernel
from decoding.runtime.packed import pack_output_layer
from decoding.runtime.rowlinear import use_row_kernel
from decoding.tools.bench import machine
from decoding.tools.probe import CONTEXT, ROWS

TARGET = "smollm2-135m"


def main() -> None:
    source = resolve_source(TARGET)
    models = {
        name: AutoModelForCausalLM.from_pretrained(source).eval()
        for name in ("eager", "packed", "kernel", "layer")
    }
    assert pack_output_layer(models["packed"])
    assert use_row_kernel(models["kernel"]) and use_row_kernel(models["layer"])
    fuse_projections(models["kernel"])
    assert use_layer_kernel(models["layer"])  # as `load_model` does
    caches = {name: DynamicCache(config=m.config) for name, m in models.items()}
    for name in ("kernel", "layer"):
        caches[name] = new_cache(models[name])  # the lean pass's cache
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
        for n in (5, 9, 17):
            result[f"{name}_V{n}/V1"] = round(result[str(n)][name] / result["1"][name], 2)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
