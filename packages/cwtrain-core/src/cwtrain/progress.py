"""Progress of long work: bytes, rate and ETA on a terminal, structured log events otherwise.

Library functions take an ``on_progress`` callback; the CLI passes a
:class:`ByteProgress` instance, which renders to stderr. Thread-safe: uploads call it
from worker threads.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TextIO

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

    On a terminal it redraws one stderr line at most every ``interval`` seconds;
    otherwise it logs an INFO event at most every ``log_interval`` seconds, with
    ``extra={"progress": {...}}`` for structured handlers.
    """

    def __init__(
        self,
        label: str,
        total: int,
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
        self._last = 0.0
        self._lock = threading.Lock()

    def __call__(self, nbytes: int) -> None:
        """Add ``nbytes`` done (the signature of an ``on_progress`` byte callback)."""
        with self._lock:
            self.done += nbytes
            now = time.monotonic()
            if now - self._last >= self._interval or self.done >= self.total:
                self._last = now
                self._render(now)

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

    def close(self) -> None:
        """Finish the line on a terminal."""
        with self._lock:
            self._render(time.monotonic())
            if self._tty:
                self._stream.write("\n")
                self._stream.flush()
