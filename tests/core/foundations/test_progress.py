"""ByteProgress: no rate or ETA from the first samples, a smoothed rate after, where it draws."""

from __future__ import annotations

import io

import pytest

from cwtrain.hotload.follow import ProgressEvent
from cwtrain.progress import WARMUP_SECONDS, ByteProgress, RateEstimate


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lines(screen: io.StringIO) -> list[str]:
    """What a terminal shows after each redraw."""
    return [part.removeprefix("\x1b[K").rstrip("\n") for part in screen.getvalue().split("\r") if part]


def test_no_rate_or_eta_in_the_first_second() -> None:
    """The reported case: a 212 KiB upload whose first sample said "355 B/s ETA 10m13s"."""
    screen, clock = Terminal(), Clock()
    total = 212 << 10
    progress = ByteProgress("uploading tiny", total, stream=screen, interval=0.0, clock=clock)
    for step in range(1, 9):  # 8 samples spread over the first 0.8 s
        clock.now += 0.1
        progress.add(355 if step == 1 else 8 << 10)
    assert all("/s" not in line and "ETA" not in line for line in _lines(screen))
    assert _lines(screen)[0] == "uploading tiny: 355 B/212.0 KiB (0%)"


def test_rate_is_the_average_after_warm_up_then_smoothed() -> None:
    screen, clock = Terminal(), Clock()
    progress = ByteProgress("up", 100_000, stream=screen, interval=0.0, clock=clock)
    clock.now += WARMUP_SECONDS
    progress.add(10_000)  # 10 kB in the first second: the average so far
    assert _lines(screen)[-1] == "up: 9.8 KiB/97.7 KiB (10%) 9.8 KiB/s ETA 9s"
    clock.now += 0.1
    progress.add(50_000)  # a burst 0.1 s later moves nothing (samples are >= 0.5 s apart)
    assert _lines(screen)[-1].endswith(" 9.8 KiB/s ETA 4s")
    clock.now += 0.5
    progress.add(0)  # 50 kB in 0.6 s (83 kB/s) moves the average part of the way only
    rate = 10_000 + (1 - 0.5 ** (0.6 / 3.0)) * (50_000 / 0.6 - 10_000)
    assert _lines(screen)[-1].endswith(f" {rate / 1024:.1f} KiB/s ETA {round(40_000 / rate)}s")
    clock.now += 0.4
    progress.close()
    assert _lines(screen)[-1] == "up: 58.6 KiB/97.7 KiB (60%) 29.3 KiB/s in 2.0s"
    assert screen.getvalue().endswith("\n")


def test_rate_estimate_alone() -> None:
    estimate = RateEstimate(warmup=1.0, half_life=1.0)
    estimate.update(0.5, 1000)
    assert estimate.rate is None and estimate.eta(10) is None
    estimate.update(1.0, 1000)
    assert estimate.rate == 1000.0 and estimate.eta(3000) == 3.0
    estimate.update(2.0, 4000)  # 3000 B/s for one half-life: halfway from 1000 to 3000
    assert estimate.rate == pytest.approx(2000.0)


def test_asked_for_off_a_terminal_one_line_per_interval() -> None:
    stream, clock = io.StringIO(), Clock()
    progress = ByteProgress("diff", 40, stream=stream, live=True, clock=clock)
    for _ in range(8):
        clock.now += 0.5
        progress.add(5)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()
    assert lines[0] == "diff: 5 B/40 B (12%)"  # the first is drawn, before any rate
    assert len(lines) == 5  # at 0.5, 1.5, 2.5, 3.5 s (one second apart) and the final line
    assert lines[1] == "diff: 15 B/40 B (38%) 10 B/s ETA 2s"
    assert lines[-1] == "diff: 40 B/40 B (100%) 10 B/s in 4.0s"


def test_live_false_on_a_terminal_only_logs_the_final_line(caplog: pytest.LogCaptureFixture) -> None:
    screen = Terminal()
    progress = ByteProgress("up", 10, stream=screen, live=False)
    with caplog.at_level("INFO", logger="cwtrain.progress"):
        progress(ProgressEvent.uploading("x", 5, 10, 2.0))
        progress(ProgressEvent.uploading("x", 10, 10, 4.0))
    assert screen.getvalue() == ""
    assert [r.getMessage() for r in caplog.records] == ["up: 10 B/10 B (100%) 2 B/s in 4.0s"]


def test_instant_work_has_no_rate() -> None:
    screen, clock = Terminal(), Clock()
    progress = ByteProgress("empty", 0, stream=screen, clock=clock)
    progress.close()
    assert _lines(screen) == ["empty: 0 B/0 B (100%)"]
