"""The one polling helper: a budget, passes at an interval, never a sleep past the deadline."""

from __future__ import annotations

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
