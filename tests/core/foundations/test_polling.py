"""The one polling helper: a budget, passes at an interval, never a sleep past the deadline."""

from __future__ import annotations

import itertools
import math

import pytest

import cwtrain.polling as polling
from cwtrain.polling import Budget, poll


class Clock:
    """A monotonic clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(polling.time, "monotonic", fake.monotonic)
    monkeypatch.setattr(polling.time, "sleep", fake.sleep)
    return fake


def test_budget_counts_down_from_its_start_and_never_below_zero(clock: Clock) -> None:
    budget = Budget(10.0)
    clock.now += 4
    assert (budget.elapsed, budget.remaining, budget.spent) == (4.0, 6.0, False)
    clock.now += 7
    assert (budget.remaining, budget.spent) == (0.0, True)


def test_budget_sleep_is_cut_to_what_is_left(clock: Clock) -> None:
    budget = Budget(3.0)
    budget.sleep(2.0)
    budget.sleep(2.0)
    budget.sleep(2.0)
    assert clock.sleeps == [2.0, 1.0, 0.0]


def test_poll_passes_at_the_interval_and_once_more_at_the_deadline(clock: Clock) -> None:
    budget = Budget(10.0)
    passes = [(n, clock.now - 100.0) for n in poll(budget, 4.0)]
    assert passes == [(1, 0.0), (2, 4.0), (3, 8.0), (4, 10.0)]
    assert clock.sleeps == [4.0, 4.0, 2.0]


def test_poll_makes_one_pass_on_a_spent_budget(clock: Clock) -> None:
    assert list(poll(Budget(0.0), 5.0)) == [1]
    assert clock.sleeps == []


def test_leaving_the_loop_stops_the_polling(clock: Clock) -> None:
    for n in poll(Budget(60.0), 5.0):
        if n == 2:
            break
    assert clock.sleeps == [5.0]


def _passes(clock: Clock, budget: Budget, interval: float, pass_seconds: float, *, adaptive: bool) -> list[float]:
    """When each pass of a wait began, each pass taking ``pass_seconds`` (the service's answer)."""
    starts = []
    for _ in poll(budget, interval, adaptive=adaptive):
        starts.append(clock.now - 100.0)
        clock.now += pass_seconds
    return starts


def test_adaptive_pause_follows_the_rule() -> None:
    # a fast answer early in the wait: 50 x the pass time
    assert polling.adaptive_pause(5.0, 0.002, 0.0) == pytest.approx(0.1)
    # nothing measured yet: the floor
    assert polling.adaptive_pause(5.0, 0.0, 0.0) == polling.MIN_PAUSE
    # a quarter of the time waited so far once that is longer
    assert polling.adaptive_pause(5.0, 0.002, 2.0) == pytest.approx(0.5)
    # never past the interval, however slow the answer or long the wait
    assert polling.adaptive_pause(5.0, 1.0, 0.0) == 5.0
    assert polling.adaptive_pause(5.0, 0.0, 1000.0) == 5.0


def test_adaptive_polling_is_the_fixed_schedule_against_a_slow_service(clock: Clock) -> None:
    """Passes of interval / ANSWER_RATIO or longer: exactly the fixed schedule, so no more requests."""
    slow = 5.0 / polling.ANSWER_RATIO
    fixed = _passes(clock, Budget(300.0), 5.0, slow, adaptive=False)
    fixed_sleeps, clock.sleeps = clock.sleeps, []
    adaptive = _passes(clock, Budget(300.0), 5.0, slow, adaptive=True)
    assert adaptive == pytest.approx([t - fixed[0] + adaptive[0] for t in fixed])
    assert clock.sleeps == pytest.approx(fixed_sleeps)


def test_adaptive_polling_is_fast_on_a_fast_service_and_costs_a_bounded_number_of_passes(clock: Clock) -> None:
    """Loopback answers (2 ms): the first passes come within a fraction of a second, then the pauses grow
    to the interval; over any wait, at most the documented number of passes more than the fixed schedule."""
    starts = _passes(clock, Budget(600.0), 5.0, 0.002, adaptive=True)
    assert starts[1] < 0.15 and starts[3] < 0.5  # a 60 ms hot-load is seen within about 0.2 s
    assert all(0 < s <= 5.0 for s in clock.sleeps)
    late = [b - a for a, b in itertools.pairwise(starts) if a >= 4 * 5.0]
    assert late[:-1] and all(gap == pytest.approx(5.002) for gap in late[:-1])  # the fixed pace after 20 s
    bound = math.ceil(math.log(polling.ELAPSED_DIVISOR * 5.0 / polling.MIN_PAUSE) / math.log(1.25))
    assert bound == 35
    for horizon in (0.5, 1, 5, 10, 20, 60, 300, 599):
        fixed = math.floor(horizon / 5.002) + 1  # passes of the fixed schedule begun by then
        adaptive = sum(1 for t in starts if t <= horizon)
        assert adaptive - fixed <= bound, horizon
    # and the worst case (instant answers: only the floor and the elapsed rule) stays inside the bound
    clock.sleeps.clear()
    instant = _passes(clock, Budget(600.0), 5.0, 0.0, adaptive=True)
    assert max(sum(1 for t in instant if t <= h) - (math.floor(h / 5.0) + 1) for h in range(1, 600)) <= bound
