"""Polling inside one time budget: every wait in cwtrain is a :func:`poll` over a :class:`Budget`.

::

    from cwtrain.polling import Budget, poll

    budget = Budget(600.0)                     # seconds for every step of one call
    for _ in poll(budget, interval=5.0):       # a first pass at once, then one every 5 s
        if ready():
            return
    raise TimeoutError(f"not ready after {budget.total:g}s")   # the budget is spent

    trigger(..., timeout=budget.remaining)     # hand what is left to the next step

:func:`poll` sleeps ``min(interval, budget.remaining)`` between passes, so it never sleeps
past the deadline, and it stops after the first pass that finds the budget spent: the
caller always gets at least one pass, and one more right at the deadline. What a pass
does with errors (transient ones are logged and waited through) stays with the caller.

``time.sleep`` and ``time.monotonic`` are looked up at call time, so a test that
replaces them drives these waits too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Budget", "poll"]


@dataclass
class Budget:
    """Seconds shared by the steps of one call, counted from its creation (monotonic clock).

    Attributes:
        total: the whole budget in seconds.
        start: ``time.monotonic()`` when it began.
    """

    total: float
    start: float = field(default_factory=lambda: time.monotonic())

    @property
    def elapsed(self) -> float:
        """Seconds since the budget began."""
        return time.monotonic() - self.start

    @property
    def remaining(self) -> float:
        """Seconds left, never below 0."""
        return max(0.0, self.total - self.elapsed)

    @property
    def spent(self) -> bool:
        """Whether no time is left."""
        return self.remaining <= 0

    def sleep(self, interval: float) -> None:
        """Sleep ``interval`` seconds, or what is left of the budget if that is less."""
        time.sleep(min(interval, self.remaining))


def poll(budget: Budget, interval: float) -> Iterator[int]:
    """Passes of a polling loop: the first at once, then one every ``interval`` seconds.

    Args:
        budget: the time budget; iteration ends after the first pass that finds it spent.
        interval: seconds between passes (the last sleep is cut to the deadline).

    Yields:
        The pass number, from 1.
    """
    attempt = 0
    while True:
        attempt += 1
        yield attempt
        if budget.spent:
            return
        budget.sleep(interval)
