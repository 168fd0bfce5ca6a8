"""The linear layers of the default CPU mode: SpecLens's own kernel for a few rows at a time.

A small model's step on a CPU is bound by streaming its weights, and checking
k+1 tokens reads the same weights as checking one. Through MKL (`F.linear`)
SmolLM2-135M's linear layers take about twice as long for 5 rows as for 1;
`kernels/rows.h` reads the weights once for all the rows, so 1 to 9 rows
cost about the same (`python -m decoding probe`). Each layer packs a copy of
its weight into panels the first time it runs, so that 9 or 17 rows also run
near the cores' arithmetic: the kernel costs a second copy of the weights in
memory.

Its sums do not depend on the batch: a token's outputs are the same bits
whether it is checked alone or with k others, so plain decoding and
verification agree exactly. Every loop (plain, speculative, Hugging Face's
`generate` in the benchmark) runs the same modules, so speedups stay honest.

The kernel is compiled once per machine with the system's C++ compiler
(about a second) into the cache folder: for this CPU (`-march=native`) where
it has AVX2, FMA and F16C, else the portable build, the same algorithm in the
compiler's generic vectors (any CPU: an ARM laptop, an older x86), whose
results are batch-independent too. SPECLENS_KERNEL_BUILD=portable forces the
portable build (the tests run it here). Without a compiler the model keeps
its linear layers and only the output layer is packed for oneDNN
(`packed.py`). SPECLENS_KERNEL=0 turns the kernel off. The choices that
depend on the machine (prefetching, threads) are measured the first time a
kernel loads on a machine (`tuning.py`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from ..settings.environment import cache_dir, cpu_info
from .tuning import TUNED, tune

KERNELS = Path(__file__).parent / "kernels"
SOURCES = (
    KERNELS / "rowlinear.cpp",
    KERNELS / "layer.cpp",
)  # layer.cpp: llama.py's and the draft head's layer
KERNEL_FILES = (*SOURCES, KERNELS / "rows.h")
# -ffp-contract=off: no fused multiply-adds but the kernels' own, so the
# elementwise parts round as torch's ops do.
COMMON = ("-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
FLAGS = {"native": ("-march=native", *COMMON), "portable": ("-DSPECLENS_PORTABLE", *COMMON)}


def kernel_build() -> str:
    """ "native" on an x86 CPU with AVX2, FMA and F16C, else "portable"; SPECLENS_KERNEL_BUILD chooses."""
    forced = os.environ.get("SPECLENS_KERNEL_BUILD", "")
    if forced in FLAGS:
        return forced
    flags = set(cpu_info()["flags"].split())
    return (
        "native"
        if platform.machine() in ("x86_64", "AMD64") and {"avx2", "fma", "f16c"} <= flags
        else "portable"
    )


def _build(compiler: str, flags: tuple[str, ...], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built beside its final name and renamed, so concurrent first runs never load half a file.
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        part = Path(tmp) / out.name
        subprocess.run(
            [compiler, *flags, *map(str, SOURCES), "-o", str(part)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        os.replace(part, out)


def kernel_file(build: str, sources: bytes) -> str:
    """The compiled kernel's file name: a new source, build or CPU gives a new file (and a new tuning)."""
    # -march=native: a binary for this CPU, so the CPU's flags are part of its name.
    key = hashlib.sha256(sources + " ".join(FLAGS[build]).encode() + cpu_info()["flags"].encode())
    return f"rowlinear-{build}-{key.hexdigest()[:16]}.so"


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel (`kernel_build()`'s), built on first use; None where it cannot be (no compiler)."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if os.environ.get("SPECLENS_KERNEL", "1") == "0" or compiler is None:
        return None
    build = kernel_build()
    try:
        path = cache_dir() / "kernels" / kernel_file(build, b"".join(p.read_bytes() for p in KERNEL_FILES))
        if not path.exists():
            _build(compiler, FLAGS[build], path)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError):
        return None
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    for name, args in {
        "rowlinear": [ptr] * 4 + [i64] * 3,
        "rowlinear_half": [ptr] * 4 + [i64] * 3,
        "rowlinear_panels": [ptr] * 4 + [i64] * 3,
        "pack_panels": [ptr] * 2 + [i64] * 2,
        "rmsnorm": [ptr] * 3 + [i64] * 2 + [ctypes.c_float],
        "silu_rows": [ptr, ptr, i64],
        "attention": [ptr],
        "llama_layers": [ptr, ptr, i64, ptr],
        "eagle_layer": [ptr] * 4,
        "struct_layout": [ptr],
        "rowlinear_settings": [ptr],
        "rowlinear_tune": [ptr],
    }.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = None
    TUNING[str(path)] = tune(lib, path)
    return lib


TUNING: dict[str, str] = {}  # each loaded kernel's choices: "measured", "cached" or "defaults" (tuning.py)
SETTINGS = ("vector_width", "weight_rows_per_block", "input_rows_per_block", "panel_tile_rows", "panel_tiles",
            *TUNED)  # fmt: skip


def kernel_choices() -> dict:
    """Which build runs, its fixed choices and its measured ones (rows.h, tuning.py), for the probe;
    {"build": "none"} without one."""
    lib = library()
    if lib is None:
        return {"build": "none"}
    values = (ctypes.c_int64 * len(SETTINGS))()
    lib.rowlinear_settings(values)
    return {
        "build": kernel_build(),
        "flags": " ".join(FLAGS[kernel_build()][:1]),
        "tuning": TUNING[lib._name],
        **dict(zip(SETTINGS, values)),
    }


def row_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    panels: torch.Tensor | None = None,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` through the kernel: float32 CPU tensors, weight and bias contiguous;
    from `panels` (`pack_panels(weight)`) where given. A float16 weight is widened exactly as it is
    read: the product is the float32 one of the same values, from half the bytes."""
    # Lean on purpose: a step makes over a hundred of these calls, each a few microseconds of work.
    if not x.is_contiguous():
        x = x.contiguous()
    out = x.new_empty((*x.shape[:-1], weight.shape[0]))
    if weight.dtype == torch.float16:
        product = library().rowlinear_half
    else:
        product = _kernel() if panels is None else library().rowlinear_panels
    product(
        x.data_ptr(),
        weight.data_ptr() if panels is None else panels.data_ptr(),
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
        x.numel() // x.shape[-1],
        x.shape[-1],
        weight.shape[0],
    )
    return out


def pack_panels(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` [N, K] laid out in the kernel's panels, or None where N is not a multiple of its width."""
    lib = library()
    n, k = weight.shape
    if n % lib.rowlinear_width():
        return None
    panels = torch.empty(n * k, dtype=torch.float32)
    lib.pack_panels(weight.data_ptr(), panels.data_ptr(), k, n)
    return panels


@functools.cache
def _kernel():
    return library().rowlinear


class RowLinear(torch.nn.Module):
    """A linear layer computed by the kernel; it keeps the original's weight and bias (tied weights stay tied)
    and packs a copy of the weight into panels the first time it runs."""

    def __init__(self, linear: torch.nn.Linear, panels: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.uses_panels = panels
        self._panels: torch.Tensor | None = None
        self._packed = False

    def panels(self) -> torch.Tensor | None:
        """The weight's panels, packed on first use (None without, or where its shape has none)."""
        if self.uses_panels and not self._packed:
            self._panels, self._packed = pack_panels(self.weight.detach()), True
        return self._panels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Prompts too: MKL would read a long prompt faster, but its sums depend on
        # the shapes, and the model's own forward (all rows, q/k/v apart) must
        # give the lean pass's bits (one row kept, q/k/v fused).
        return row_linear(x, self.weight, self.bias, self.panels())


def _fits(linear: torch.nn.Linear, width: int) -> bool:
    w = linear.weight
    return (
        w.device.type == "cpu"
        and w.dtype == torch.float32
        and w.is_contiguous()
        and linear.in_features % width == 0
        and (linear.bias is None or linear.bias.is_contiguous())
    )


def use_row_kernel(model: torch.nn.Module, panels: bool = True) -> bool:
    """Swap every linear layer of a float32 CPU model the kernel can run for a `RowLinear`
    (over packed panels, or over the weights' own rows with `panels=False`).

    False (nothing changed) where the kernel is unavailable or does not apply.
    """
    lib = library()
    if lib is None:
        return False
    width = lib.rowlinear_width()
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is torch.nn.Linear and _fits(child, width)
    ]
    for parent, name, child in swaps:
        setattr(parent, name, RowLinear(child, panels))
    return bool(swaps)
