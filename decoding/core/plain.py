"""Plain decoding, one target step a token, and what it shares with the speculative loop: the
clock, the prefill and the stop check."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection
from typing import NamedTuple

import torch

from ..runtime.forward import forward, new_cache
from ..settings.sampling import Sampling
from .proposal import Draft
from .verify import warp

# Asked after every round (and before every plain token): a reason to stop now, or None.
StopCheck = Callable[[], str | None]


class PlainRun(NamedTuple):
    token_ids: list[int]
    wall_s: float
    token_times_s: list[float]  # when each token was ready, from the start
    stopped: str | None = None  # why it ended early, if it did


class Clock:
    """Wall clock in seconds; waits for the GPU first so timings are real."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def prefill(target: torch.nn.Module, prompt_ids: torch.Tensor, draft: Draft | None = None):
    cache = new_cache(target)
    if prompt_ids.shape[1] > 1:
        with draft.watching_target() if draft else contextlib.nullcontext():
            forward(target, prompt_ids[:, :-1], cache, keep=1)
    return cache


def autoregressive_generate(
    target: torch.nn.Module,
    prompt_ids: torch.Tensor,
    sampling: Sampling = Sampling(),
    max_new_tokens: int = 128,
    eos_ids: Collection[int] = (),
    should_stop: StopCheck | None = None,
) -> PlainRun:
    """Plain decoding with the same model, cache and timing as the speculative loop.

    A reason from `should_stop` ends it early; the run then says why.
    """
    device = prompt_ids.device
    clock = Clock(device)
    generator = torch.Generator(device=device).manual_seed(sampling.seed)
    eos = set(eos_ids)
    output: list[int] = []
    times: list[float] = []
    start = clock()
    cache = prefill(target, prompt_ids)
    last = prompt_ids[:, -1:]
    while len(output) < max_new_tokens:
        if should_stop is not None and (reason := should_stop()):
            return PlainRun(output, clock() - start, times, reason)
        logits = forward(target, last, cache)
        if sampling.greedy:
            token = logits[-1].argmax()
        else:
            token = torch.multinomial(warp(logits[-1], sampling), 1, generator=generator)[0]
        output.append(int(token))
        times.append(time.perf_counter() - start)
        if output[-1] in eos:
            break
        last = token.view(1, 1)
    return PlainRun(output, clock() - start, times)
