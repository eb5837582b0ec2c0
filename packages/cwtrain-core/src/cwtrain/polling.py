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

**Adaptive polling** (``poll(budget, interval, adaptive=True)``, the hot-load waits): the
``interval`` is the longest pause, and the pause after each pass is :func:`adaptive_pause`::

    min(interval, max(MIN_PAUSE, ANSWER_RATIO × slowest pass so far, elapsed / ELAPSED_DIVISOR))

A pass is timed while the caller runs it (its requests: how fast the service answers).
So a service on loopback that answers in a few milliseconds is polled every few hundred
milliseconds at first, and a hot-load that ends in 60 ms is seen within about 0.2 s, not
after the 5 s a fixed interval waits. What that costs, as a rule:

- a service whose passes take ``interval / ANSWER_RATIO`` or more (100 ms at the 5 s
  default) gets exactly the fixed schedule: never more requests than a fixed interval;
- a faster one gets more passes only until ``ELAPSED_DIVISOR × interval`` seconds into the
  wait (20 s at 5 s; each pause at least a quarter of the time waited so far, so at most
  ``⌈log(ELAPSED_DIVISOR × interval / MIN_PAUSE) / log(1 + 1 / ELAPSED_DIVISOR)⌉`` more
  than the fixed schedule, 35 at 5 s, over a wait of any length), and then the fixed one;
  while a pass takes at most ``1 / ANSWER_RATIO`` of the time between passes (2 %).

``time.sleep`` and ``time.monotonic`` are looked up at call time, so a test that
replaces them drives these waits too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["ANSWER_RATIO", "ELAPSED_DIVISOR", "MIN_PAUSE", "Budget", "adaptive_pause", "poll"]

#: Adaptive polling: the pause after a pass is at least this many times the slowest pass.
ANSWER_RATIO = 50.0
#: Adaptive polling: the pause is at least the time waited so far divided by this.
ELAPSED_DIVISOR = 4.0
#: Adaptive polling: the shortest pause, in seconds.
MIN_PAUSE = 0.01


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

    def extend(self, seconds: float) -> None:
        """Give the steps left ``seconds`` more (e.g. to follow a hot-load created as the budget ran out)."""
        self.total += max(0.0, seconds)

    def sleep(self, interval: float) -> None:
        """Sleep ``interval`` seconds, or what is left of the budget if that is less."""
        time.sleep(min(interval, self.remaining))


def adaptive_pause(interval: float, slowest_pass: float, elapsed: float) -> float:
    """The pause of adaptive polling after a pass (see the module doc for the rule).

    Args:
        interval: the longest pause (the caller's poll interval).
        slowest_pass: seconds the slowest pass so far took.
        elapsed: seconds since the first pass began.
    """
    return min(interval, max(MIN_PAUSE, ANSWER_RATIO * slowest_pass, elapsed / ELAPSED_DIVISOR))


def poll(budget: Budget, interval: float, *, adaptive: bool = False) -> Iterator[int]:
    """Passes of a polling loop: the first at once, then one every ``interval`` seconds.

    Args:
        budget: the time budget; iteration ends after the first pass that finds it spent.
        interval: seconds between passes (the last sleep is cut to the deadline); with
            ``adaptive``, the longest pause.
        adaptive: pause :func:`adaptive_pause` after each pass instead: shorter while
            passes are fast and the wait is young, never longer than ``interval``.

    Yields:
        The pass number, from 1.
    """
    attempt = 0
    first = time.monotonic()
    slowest = 0.0
    while True:
        attempt += 1
        began = time.monotonic()
        yield attempt
        ended = time.monotonic()
        if budget.spent:
            return
        if adaptive:
            slowest = max(slowest, ended - began)
            budget.sleep(adaptive_pause(interval, slowest, ended - first))
        else:
            budget.sleep(interval)
