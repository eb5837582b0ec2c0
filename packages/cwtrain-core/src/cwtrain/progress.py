"""Progress of long work: bytes, rate and ETA on a terminal, structured log events otherwise.

The library reports progress through ``on_progress`` callbacks that receive
:class:`~cwtrain.hotload.follow.ProgressEvent` objects (``HotLoader.publish``,
``upload``, ``wait``). :class:`ByteProgress` is the terminal display the CLI passes
there; it draws the upload events::

    from cwtrain.progress import ByteProgress

    progress = ByteProgress("uploading run1-v000007")
    loader.publish("ckpt/step-7", "run1-v000007", on_progress=progress)
    # uploading run1-v000007: 1.5 GiB/3.0 GiB (50%) 210.4 MiB/s ETA 7s

Lower layers that count raw bytes (the uploader's and the codec's byte callbacks) feed
:meth:`ByteProgress.add` instead, and :meth:`ByteProgress.close` ends the line. Both
entry points are thread-safe: uploads report from worker threads.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from cwtrain.hotload.follow import ProgressEvent

__all__ = ["ByteProgress", "format_bytes", "format_seconds"]

log = logging.getLogger("cwtrain.progress")


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


class ByteProgress:
    """Counts bytes done out of a total and reports them.

    On a terminal it redraws one stderr line at most every ``interval`` seconds, and
    ends the line at the last upload event or :meth:`close`; otherwise it logs an INFO
    event at most every ``log_interval`` seconds and once all is done, with
    ``extra={"progress": {...}}`` for structured handlers. Reaching the total is drawn
    once; later calls (a million zero-byte tensors) are throttled like any other.

    Args:
        label: the text before the counts.
        total: bytes expected (upload events carry their own).
        stream: where to draw (default stderr).
        interval: seconds between redraws on a terminal.
        log_interval: seconds between log events otherwise.
    """

    def __init__(
        self,
        label: str,
        total: int = 0,
        *,
        stream: TextIO | None = None,
        interval: float = 0.2,
        log_interval: float = 10.0,
    ) -> None:
        self.label = label
        self.total = max(0, total)
        self.done = 0
        self._stream = stream or sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._interval = interval if self._tty else log_interval
        self._start = time.monotonic()
        self._last = float("-inf")  # the first update is always drawn
        self._ended = False
        self._reached = False
        self._lock = threading.Lock()

    def __call__(self, event: ProgressEvent) -> None:
        """Draw an upload event (the ``on_progress`` of ``HotLoader.publish``/``upload``).

        Events of other stages are left to the loader's log lines. The last upload
        event (every byte stored) is always drawn and, on a terminal, ends the line.
        """
        if event.stage != "upload":
            return
        with self._lock:
            if self._ended:
                return
            self.done, self.total = event.bytes_done, max(0, event.bytes_total)
            self._update(final=self.done >= self.total)

    def add(self, nbytes: int) -> None:
        """Add ``nbytes`` done (a raw byte callback: the uploader's or the codec's ``on_progress``)."""
        with self._lock:
            self.done += nbytes
            self._update(final=False)

    def _update(self, *, final: bool) -> None:
        now = time.monotonic()
        reached = self.done >= self.total and not self._reached  # drawn once, not on every later call
        if final or reached or now - self._last >= self._interval:
            self._reached = self._reached or reached
            self._last = now
            self._render(now)
        if final:
            self._end_line()

    def line(self, now: float | None = None) -> str:
        """The current progress as text: done/total, percent, rate, ETA."""
        elapsed = max(1e-9, (now or time.monotonic()) - self._start)
        rate = self.done / elapsed
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        return (
            f"{self.label}: {format_bytes(self.done)}/{format_bytes(self.total)} ({pct:.0f}%) "
            f"{format_bytes(rate)}/s ETA {format_seconds(eta)}"
        )

    def _render(self, now: float) -> None:
        text = self.line(now)
        if self._tty:
            self._stream.write("\r\x1b[K" + text)
            self._stream.flush()
        else:
            log.info(text, extra={"progress": {"label": self.label, "done": self.done, "total": self.total}})

    def _end_line(self) -> None:
        self._ended = True
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()

    def close(self) -> None:
        """Draw the final state and finish the line on a terminal (nothing when already ended)."""
        with self._lock:
            if self._ended:
                return
            self._render(time.monotonic())
            self._end_line()
