"""Where a publish spends its time: per-stage wall time, CPU time and bytes, measured in place.

Pass a :class:`StageStats` to the code that runs the stages and read it afterwards::

    from cwtrain.hotload.codec.stages import StageStats

    stats = StageStats()
    store.upload_tensors(new, "run-v000008", previous_identity="run-v000007", base=served, stats=stats)
    for name, figures in stats.figures().items():
        print(name, figures.nbytes, figures.cpu_seconds, figures.busy_seconds)

The stages the library reports (each only where it runs):

========== ==================================================================
``gather`` tensors to host bytes (:func:`~cwtrain.hotload.format.tensors.to_tensor_data`)
``read``   tensor bytes into the encoder's chunk buffers (``pread`` for files)
``xor``    XOR against the base and "is any bit set" on each chunk
``adler``  Adler-32 of the new bytes
``zstd``   compression of the XOR (frames of changed tensors only)
``sha256`` the SHA-256 of each uploaded object (recorded in its metadata)
========== ==================================================================

Callers may add their own (``bench/pipeline.py`` times each S3 request as ``upload``
or ``requests`` from botocore's events). Bytes are what entered the stage: for the
encoder's stages, bytes of the new tensors; for ``sha256``, bytes of the objects.

**Cost.** Nothing is measured unless a ``StageStats`` is passed: the code paths test
``stats is not None``. When on, each measurement reads two clocks
(:func:`time.perf_counter` and :func:`time.thread_time`) and appends one record under a
lock; the encoder measures once per stage per 1 MiB chunk, about 1 % of its work.

**What the figures mean.** ``cpu_seconds`` is the thread CPU time inside the stage,
summed over threads (compression with zstd's own worker threads, for tensors above
:data:`~cwtrain.hotload.codec.encode.BIG_TENSOR_BYTES`, is not seen by the calling thread's
clock). ``seconds`` is the wall time inside the stage summed over threads;
``busy_seconds`` the wall time during which at least one thread was inside it (the
union of the intervals): for a link, how long it carried data.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Mark", "StageFigures", "StageStats"]

#: A point in time as ``(perf_counter(), thread_time())`` of the thread that took it.
Mark = tuple[float, float]


@dataclass(frozen=True)
class StageFigures:
    """What one stage did.

    Attributes:
        calls: measurements recorded.
        nbytes: bytes that entered the stage.
        seconds: wall time inside the stage, summed over threads.
        cpu_seconds: thread CPU time inside the stage, summed over threads.
        busy_seconds: wall time with at least one thread inside the stage.
        first: ``perf_counter()`` at the first entry (``0.0`` if none).
        last: ``perf_counter()`` at the last exit (``0.0`` if none).
    """

    calls: int
    nbytes: int
    seconds: float
    cpu_seconds: float
    busy_seconds: float
    first: float
    last: float


class StageStats:
    """Per-stage wall time, CPU time and bytes; thread-safe, filled in by the code that runs the stages."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, list[tuple[int, float, float, float]]] = {}

    @staticmethod
    def clock() -> Mark:
        """Now, as this thread sees it: ``(perf_counter(), thread_time())``."""
        return time.perf_counter(), time.thread_time()

    def record(self, stage: str, nbytes: int, start: Mark, end: Mark) -> None:
        """Record that ``nbytes`` went through ``stage`` between two marks taken on one thread."""
        entry = (nbytes, start[0], end[0], end[1] - start[1])
        with self._lock:
            self._records.setdefault(stage, []).append(entry)

    def lap(self, stage: str, nbytes: int, since: Mark) -> Mark:
        """Record ``stage`` from ``since`` until now; returns now (the next stage's start)."""
        now = self.clock()
        self.record(stage, nbytes, since, now)
        return now

    @contextmanager
    def measure(self, stage: str, nbytes: int = 0) -> Iterator[None]:
        """Record the ``with`` block as ``stage`` (also when it raises)."""
        start = self.clock()
        try:
            yield
        finally:
            self.record(stage, nbytes, start, self.clock())

    def intervals(self, stage: str) -> list[tuple[float, float]]:
        """``(start, end)`` of every measurement of ``stage`` (``perf_counter()`` values), by start."""
        with self._lock:
            entries = list(self._records.get(stage, ()))
        return sorted((start, end) for _, start, end, _ in entries)

    def busy_between(self, stage: str, start: float, end: float) -> float:
        """Wall time within ``[start, end]`` with at least one thread inside ``stage``."""
        busy = 0.0
        edge = start
        for lo, hi in self.intervals(stage):
            lo, hi = max(lo, edge), min(hi, end)
            if hi > lo:
                busy += hi - lo
                edge = hi
        return busy

    def figures(self) -> dict[str, StageFigures]:
        """Every stage's figures, in the order stages were first recorded."""
        with self._lock:
            records = {stage: list(entries) for stage, entries in self._records.items()}
        return {stage: _figures(entries) for stage, entries in records.items()}

    def as_dict(self) -> dict[str, dict[str, float]]:
        """:meth:`figures` as plain numbers (for JSON)."""
        return {
            stage: {
                "calls": f.calls,
                "bytes": f.nbytes,
                "seconds": f.seconds,
                "cpu_seconds": f.cpu_seconds,
                "busy_seconds": f.busy_seconds,
                "first": f.first,
                "last": f.last,
            }
            for stage, f in self.figures().items()
        }


def _figures(entries: list[tuple[int, float, float, float]]) -> StageFigures:
    if not entries:
        return StageFigures(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0)
    busy = 0.0
    edge = float("-inf")
    for _, start, end, _ in sorted(entries, key=lambda e: e[1]):
        if end <= edge:
            continue
        busy += end - max(start, edge)
        edge = end
    return StageFigures(
        calls=len(entries),
        nbytes=sum(e[0] for e in entries),
        seconds=sum(e[2] - e[1] for e in entries),
        cpu_seconds=sum(e[3] for e in entries),
        busy_seconds=busy,
        first=min(e[1] for e in entries),
        last=max(e[2] for e in entries),
    )
