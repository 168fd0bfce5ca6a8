"""Sampling settings: what the run draws with.

Torch-free, so that a Trace (and a laptop charting one) can hold them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SpecLensError


@dataclass(frozen=True)
class Sampling:
    # The help texts are the command line's (see cli.add_run_flags).
    temperature: float = field(default=0.0, metadata={"help": "0 means greedy"})
    top_k: int = field(default=0, metadata={"help": "keep only the k most likely tokens (0: off)"})
    top_p: float = field(default=1.0, metadata={"help": "keep the most likely tokens holding this much mass"})
    seed: int = field(default=0, metadata={"help": "seed of the sampling draws"})

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 10.0:
            raise SpecLensError(f"temperature must be between 0 and 10, got {self.temperature}")
        if self.top_k < 0:
            raise SpecLensError(f"top-k must be 0 (off) or positive, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecLensError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
