"""The sampler's machinery: a private event-loop thread, a sequence-counting limiter, ``run_sync``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread", "SequenceLimiter", "run_sync"]

T = TypeVar("T")


def run_sync[R](coro: Coroutine[Any, Any, R]) -> R:
    """Run ``coro`` to completion from synchronous code, inside or outside a running loop.

    Outside a loop it is ``asyncio.run``; inside one (a framework calling a plain function
    from async code) it runs on a fresh loop in a new thread, and its result or exception
    comes back here.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: list[R] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coro))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name="cwtrain-rollout")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


class LoopThread:
    """A private event loop on a daemon thread (re-created after ``fork``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name="cwtrain-rollout-loop", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def here(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop())

    def stop(self) -> None:
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None or self._pid != os.getpid():
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not threading.current_thread():
            thread.join(timeout=10)
            loop.close()


class SequenceLimiter:
    """Counts sequences in flight: ``concurrency`` groups' worth (split groups count once).

    Waiters are served first come, first served, each woken only when its weight fits.
    """

    def __init__(self, concurrency: int, group_size: int) -> None:
        self.concurrency = concurrency
        self.capacity = concurrency * group_size
        self.used = 0
        self.peak = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def acquire(self, weight: int, group_size: int) -> int:
        if self.concurrency * group_size > self.capacity:
            self.capacity = self.concurrency * group_size
            self._wake()
        weight = min(weight, self.capacity)
        if not self._waiters and self.used + weight <= self.capacity:
            self._take(weight)
            return weight
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (weight, future)
        self._waiters.append(entry)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.release(weight)  # granted, then cancelled: give it back
            else:
                self._waiters.remove(entry)
            raise
        return weight

    def release(self, weight: int) -> None:
        self.used -= weight
        self._wake()

    def _take(self, weight: int) -> None:
        self.used += weight
        self.peak = max(self.peak, self.used)

    def _wake(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.capacity:
            weight, future = self._waiters.popleft()
            if not future.done():
                self._take(weight)
                future.set_result(None)
