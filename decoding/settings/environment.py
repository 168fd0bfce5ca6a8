"""Facts about this machine and process that several layers read: the cache folder, the hub
setting, free memory, the CPU."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

import psutil


def cache_dir() -> Path:
    """Where converted models, compiled kernels and training data live: $SPECLENS_CACHE,
    else ~/.cache/speclens (under $XDG_CACHE_HOME when set)."""
    root = os.environ.get("SPECLENS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "speclens"
    )
    return Path(root)


def on_zerogpu() -> bool:
    """Whether this process serves a ZeroGPU Space: each `@spaces.GPU` call then runs in a process of
    its own on a slice of a GPU, and the main process must not start CUDA. The variable and its
    reading are the `spaces` package's own (spaces/config.py)."""
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


def available_memory_bytes() -> int:
    """Memory a new model may still take on this machine (what the kernel calls available)."""
    return psutil.virtual_memory().available


def total_memory_bytes() -> int:
    return psutil.virtual_memory().total


@functools.cache
def cpu_info() -> dict[str, str]:
    """The CPU's model name and feature flags, from /proc/cpuinfo where there is one."""
    info = {"model name": platform.processor() or platform.machine(), "flags": platform.processor()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in info and value.strip():
                    info[key] = value.strip()
                if key == "flags":  # the first core's block is enough
                    break
    except OSError:
        pass
    return info


def cpu_name() -> str:
    """How benchmarks and cards name the CPU: cores and model, e.g. '2 × AMD EPYC'."""
    return f"{os.cpu_count()} × {cpu_info()['model name']}"
