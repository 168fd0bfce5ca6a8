"""One time limit and one stop switch for all the model work a user asked for.

A `RunBudget` is handed to every loop a request runs (the speculative run,
the plain run it is compared with, each k of a sweep) as their `should_stop`
check. Its clock starts at the first decoding round, so loading or converting
a model never eats into it.
"""

from __future__ import annotations

import threading
import time

from ..errors import SpecLensError


class RunStopped(SpecLensError):
    """A run ended early (the user stopped it, or it hit its time limit) before it had anything to show."""


class RunBudget:
    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._stop = threading.Event()
        self._reason = "stopped by the user"
        self._started: float | None = None

    def stop(self, reason: str = "stopped by the user") -> None:
        """Ask every loop under this budget to end at its next round."""
        self._reason = reason
        self._stop.set()

    def __call__(self) -> str | None:
        """A reason to stop now, or None; the first call starts the clock."""
        if self._stop.is_set():
            return self._reason
        now = time.monotonic()
        if self._started is None:
            self._started = now
        elif now - self._started > self.limit_s:
            return f"stopped at the {self.limit_s:g} s time limit (ask for fewer tokens)"
        return None
