"""Throttled logging: a failure that repeats every decode step must not flood
the scheduler's log, and must not go unsaid either.

Two rhythms, used wherever the gate logs something that can repeat:

* :func:`first_then_every` -- log the first occurrence, then every 1000th
  (internal errors, plain-step failures, control failures, ops stages);
* :class:`OncePer` -- log at most once per interval, whatever the count
  (policy errors, slow decisions).

Both cost a comparison or two when they say no; no allocation.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["first_then_every", "OncePer", "EVERY", "INTERVAL_S"]

#: after the first, every how many occurrences one is logged.
EVERY = 1000
#: the shortest time between two lines of a :class:`OncePer` (seconds).
INTERVAL_S = 60.0


def first_then_every(count: int, every: int = EVERY) -> bool:
    """Whether occurrence number ``count`` (1-based) is one to log."""
    return count == 1 or count % every == 0


class OncePer:
    """``ready()`` is True at most once per ``interval_s`` (the first call is)."""

    __slots__ = ("interval_s", "_clock", "_last")

    def __init__(
        self,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last = -float("inf")

    def ready(self) -> bool:
        now = self._clock()
        if now - self._last >= self.interval_s:
            self._last = now
            return True
        return False
