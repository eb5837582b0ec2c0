"""Progress of long work: bytes, a smoothed rate and an ETA on a terminal, one final line otherwise.

The library reports progress through ``on_progress`` callbacks that receive
:class:`~cwtrain.hotload.follow.ProgressEvent` objects (``HotLoader.publish``,
``upload``, ``wait``). :class:`ByteProgress` is the display the CLI passes there; it
draws the upload events::

    from cwtrain.progress import ByteProgress

    progress = ByteProgress("uploading run1-v000007")
    loader.publish("ckpt/step-7", "run1-v000007", on_progress=progress)
    # on a terminal, redrawn:  uploading run1-v000007: 1.5 GiB/3.0 GiB (50%) 210.4 MiB/s ETA 7s
    # at the end:              uploading run1-v000007: 3.0 GiB/3.0 GiB (100%) 208.9 MiB/s in 14.7s

Where it draws: with ``live=None`` (the default) it redraws one stderr line while the
stream is a terminal, and otherwise stays silent until the end, when it logs one INFO line
(``extra={"progress": {...}}`` for structured handlers). ``live=True`` (the CLI's
``--progress``) draws also when the stream is not a terminal, one line per update at most
every ``interval`` seconds; ``live=False`` only logs the final line.

The rate is not guessed from the first sample: for the first :data:`WARMUP_SECONDS` only
bytes and percent are shown; after that the rate is the average so far, then an
exponential moving average of the rate between updates (half-life
:data:`HALF_LIFE_SECONDS`), and the ETA is the bytes left at that rate. The final line
shows the average rate over the whole run and its duration, which are measured, not
estimated.

Lower layers that count raw bytes (the uploader's and the codec's byte callbacks) feed
:meth:`ByteProgress.add` instead, and :meth:`ByteProgress.close` draws the final line.
Both entry points are thread-safe: uploads report from worker threads.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol, TextIO


class UploadEvent(Protocol):
    """What :class:`ByteProgress` reads of an ``on_progress`` event (a :class:`~cwtrain.hotload.follow.ProgressEvent`)."""

    @property
    def stage(self) -> str: ...

    @property
    def bytes_done(self) -> int: ...

    @property
    def bytes_total(self) -> int: ...

    @property
    def elapsed(self) -> float: ...


__all__ = [
    "HALF_LIFE_SECONDS",
    "WARMUP_SECONDS",
    "ByteProgress",
    "RateEstimate",
    "UploadEvent",
    "format_bytes",
    "format_seconds",
]

log = logging.getLogger("cwtrain.progress")

#: No rate or ETA is shown before this many seconds of work.
WARMUP_SECONDS = 1.0
#: Half-life of the moving average of the rate.
HALF_LIFE_SECONDS = 3.0
#: Least seconds between two samples of the moving average.
_SAMPLE_SECONDS = 0.5


def format_bytes(count: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def format_seconds(seconds: float) -> str:
    """``75`` -> ``"1m15s"``."""
    seconds = max(0, round(seconds))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _duration(seconds: float) -> str:
    """A measured duration: ``"0.3s"`` under ten seconds, else :func:`format_seconds`."""
    return f"{max(0.0, seconds):.1f}s" if seconds < 10 else format_seconds(seconds)


class RateEstimate:
    """Bytes per second from ``(elapsed, done)`` samples, smoothed.

    :attr:`rate` is ``None`` until ``warmup`` seconds have passed; then it starts as the
    average so far and follows an exponential moving average of the rate between
    samples at least half a second apart, with the given half-life.

    Args:
        warmup: seconds before any rate is given.
        half_life: half-life of the moving average, in seconds.
    """

    def __init__(self, warmup: float = WARMUP_SECONDS, half_life: float = HALF_LIFE_SECONDS) -> None:
        self.warmup = warmup
        self.half_life = half_life
        self.rate: float | None = None
        self._last = (0.0, 0)

    def update(self, elapsed: float, done: int) -> None:
        """Take a sample: ``done`` bytes after ``elapsed`` seconds."""
        if self.rate is None:
            if elapsed >= self.warmup and elapsed > 0:
                self.rate = done / elapsed
                self._last = (elapsed, done)
            return
        last_time, last_done = self._last
        span = elapsed - last_time
        if span < _SAMPLE_SECONDS:
            return
        weight = 1.0 - 0.5 ** (span / self.half_life)
        self.rate += weight * ((done - last_done) / span - self.rate)
        self._last = (elapsed, done)

    def eta(self, remaining: int) -> float | None:
        """Seconds left for ``remaining`` bytes, or ``None`` without a rate."""
        if self.rate is None or self.rate <= 0:
            return None
        return max(0, remaining) / self.rate


class ByteProgress:
    """Counts bytes done out of a total and reports them (see the module docs).

    Args:
        label: the text before the counts.
        total: bytes expected (upload events carry their own).
        stream: where to draw (default stderr).
        live: draw while the work runs: ``None`` = when ``stream`` is a terminal,
            ``True`` = always (one line per update off a terminal), ``False`` = never
            (only the final line is logged).
        interval: least seconds between two redraws (default 0.2 on a terminal, 1 otherwise).
        clock: the monotonic clock (for :meth:`add`; upload events carry their elapsed time).
    """

    def __init__(
        self,
        label: str,
        total: int = 0,
        *,
        stream: TextIO | None = None,
        live: bool | None = None,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = max(0, total)
        self.done = 0
        self._stream = stream or sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self.live = self._tty if live is None else live
        self._interval = interval if interval is not None else (0.2 if self._tty else 1.0)
        self._clock = clock
        self._start = clock()
        self._elapsed = 0.0
        self._rate = RateEstimate()
        self._last_draw = float("-inf")  # the first update is always drawn
        self._ended = False
        self._lock = threading.Lock()

    def __call__(self, event: UploadEvent) -> None:
        """Take an upload event (the ``on_progress`` of ``HotLoader.publish``/``upload``).

        Events of other stages are left to the loader's log lines. The last upload
        event (every byte stored) draws the final line.
        """
        if event.stage != "upload":
            return
        with self._lock:
            if self._ended:
                return
            self.done, self.total = event.bytes_done, max(0, event.bytes_total)
            self._update(event.elapsed, final=self.done >= self.total)

    def add(self, nbytes: int) -> None:
        """Add ``nbytes`` done (a raw byte callback: the uploader's or the codec's ``on_progress``)."""
        with self._lock:
            if self._ended:
                return
            self.done += nbytes
            self._update(self._clock() - self._start, final=False)

    def _update(self, elapsed: float, *, final: bool) -> None:
        self._elapsed = max(self._elapsed, elapsed)
        self._rate.update(self._elapsed, self.done)
        if final:
            self._finish()
        elif self.live and self._elapsed - self._last_draw >= self._interval:
            self._last_draw = self._elapsed
            self._draw(self.line())

    def line(self) -> str:
        """The current progress as text: done/total and percent, then rate and ETA once known."""
        pct = 100.0 * self.done / self.total if self.total else 100.0
        text = f"{self.label}: {format_bytes(self.done)}/{format_bytes(self.total)} ({pct:.0f}%)"
        eta = self._rate.eta(self.total - self.done)
        if self._rate.rate is not None and eta is not None:
            text += f" {format_bytes(self._rate.rate)}/s ETA {format_seconds(eta)}"
        return text

    def final_line(self) -> str:
        """The text of the end: done/total, percent, the average rate and the duration."""
        pct = 100.0 * self.done / self.total if self.total else 100.0
        text = f"{self.label}: {format_bytes(self.done)}/{format_bytes(self.total)} ({pct:.0f}%)"
        if self._elapsed > 0:
            text += f" {format_bytes(self.done / self._elapsed)}/s in {_duration(self._elapsed)}"
        return text

    def _draw(self, text: str, *, end: str = "") -> None:
        if self._tty:
            self._stream.write("\r\x1b[K" + text + end)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def _finish(self) -> None:
        self._ended = True
        text = self.final_line()
        if self.live:
            self._draw(text, end="\n")
        else:
            log.info(text, extra={"progress": {"label": self.label, "done": self.done, "total": self.total}})

    def close(self) -> None:
        """Draw the final line (nothing when the last upload event already did)."""
        with self._lock:
            if self._ended:
                return
            self._elapsed = max(self._elapsed, self._clock() - self._start)
            self._finish()
