"""What the encoder, the decoders and the uploads share: threads, a byte budget, a parallel map.

::

    budget = MemoryBudget(memory_budget_from_env())   # CWTRAIN_HOTLOAD_MEMORY_BUDGET, default 1 GiB
    budget.acquire(nbytes); ...; budget.release(nbytes)
    results = run_parallel(fn, jobs, workers=None)     # in order; the earliest failure is raised
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from cwtrain.config import env_int

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "MemoryBudget",
    "default_workers",
    "memory_budget_from_env",
    "run_parallel",
]

#: The default of ``CWTRAIN_HOTLOAD_MEMORY_BUDGET``: bytes of encoded data in flight while
#: publishing, and of decoders while applying or verifying.
DEFAULT_MEMORY_BUDGET = 1 << 30


def memory_budget_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``CWTRAIN_HOTLOAD_MEMORY_BUDGET`` in bytes (default 1 GiB, at least 1 MiB)."""
    return env_int("CWTRAIN_HOTLOAD_MEMORY_BUDGET", DEFAULT_MEMORY_BUDGET, environ, minimum=1 << 20)


def default_workers() -> int:
    """Threads used when ``workers`` is not given: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class MemoryBudget:
    """Bytes that threads may hold at once; one holder is always let through.

    A request larger than the whole budget waits until nothing else is held, so work of
    any size makes progress one item at a time.

    Args:
        limit: the budget in bytes (default ``CWTRAIN_HOTLOAD_MEMORY_BUDGET``, 1 GiB).
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = max(1, memory_budget_from_env() if limit is None else limit)
        self._used = 0
        self._cond = threading.Condition()

    @property
    def used(self) -> int:
        """Bytes held now."""
        with self._cond:
            return self._used

    def acquire(self, nbytes: int, cancelled: threading.Event | None = None) -> bool:
        """Wait until ``nbytes`` fit (or nothing else is held), then hold them.

        Returns:
            ``True`` once held; ``False`` (nothing held) when ``cancelled`` was set while waiting.
        """
        with self._cond:
            while self._used and self._used + nbytes > self.limit:
                if cancelled is not None and cancelled.is_set():
                    return False
                self._cond.wait(0.5 if cancelled is not None else None)
            self._used += nbytes
            return True

    def release(self, nbytes: int) -> None:
        """Give back what :meth:`acquire` took."""
        with self._cond:
            self._used -= nbytes
            self._cond.notify_all()


def run_parallel[J, R](
    fn: Callable[[J], R], jobs: Sequence[J], workers: int | None, *, name: str = "cwtrain-work"
) -> list[R]:
    """``[fn(job) for job in jobs]`` on up to ``workers`` threads (default: CPUs), in order.

    At most twice ``workers`` jobs are queued; after the first failure no new job
    starts, the running ones finish, and the failure of the earliest job is raised.

    Args:
        fn: the work of one job.
        jobs: the jobs.
        workers: threads (``None``: :func:`default_workers`; 1: in this thread).
        name: the threads' name prefix.
    """
    count = workers if workers is not None else default_workers()
    if count <= 1 or len(jobs) <= 1:
        return [fn(job) for job in jobs]
    results: list[Any] = [None] * len(jobs)
    failures: dict[int, BaseException] = {}
    pending: dict[Future[R], int] = {}

    def collect(done: Iterable[Future[R]]) -> None:
        for future in done:
            position = pending.pop(future)
            error = future.exception()
            if error is not None:
                failures[position] = error
            else:
                results[position] = future.result()

    with ThreadPoolExecutor(min(count, len(jobs)), thread_name_prefix=name) as pool:
        for position, job in enumerate(jobs):
            if failures:
                break
            pending[pool.submit(fn, job)] = position
            if len(pending) >= 2 * count:
                done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                collect(done)
        collect(wait(list(pending)).done)
    if failures:
        raise failures[min(failures)]
    return results
