"""Child processes of the local stack that cannot outlive it, whatever ends it (SIGKILL included).

Every process the stack starts (moto's S3 server, each engine replica) is started with
:func:`start_child`:

- in its **own process group** (``start_new_session``), so stopping it (``killpg``) also
  stops whatever it started, and a Ctrl-C in the terminal reaches only ``local up``, which
  then stops its children in order;
- with a **parent-death signal** on Linux (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, set in the
  child between fork and exec): the kernel SIGKILLs the child as soon as its parent is
  gone, however the parent ended. An ``atexit`` hook or a ``finally`` cannot do that for a
  parent that was SIGKILLed (as ``cwtrain local down --timeout`` does) or crashed. A child
  whose parent died between the fork and the ``prctl`` kills itself at once.

Why a parent-death signal and not a watchdog pipe: it needs no cooperation from the child
(moto's server runs unchanged), no thread in it and no file descriptor passed down, and it
fires from the kernel even while the child is busy or stopped. Its one catch is that Linux
ties it to the *thread* that forked the child, not to the process; so every child is
forked by one long-lived daemon thread of this module, and a child started from a
short-lived thread (a request handler, a test's helper) is not killed when that thread
ends. Elsewhere than Linux there is no such signal: the stack's ``atexit`` hooks still
stop children on a normal exit, but not after SIGKILL.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

__all__ = ["PDEATHSIG_SUPPORTED", "start_child"]

_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


# Resolved here, in the parent: the child runs no import or dlopen between fork and exec.
_PRCTL = _prctl()
#: Whether children get a parent-death signal here (Linux with a libc that has ``prctl``).
PDEATHSIG_SUPPORTED = _PRCTL is not None


def _die_with_parent(parent: int) -> Callable[[], None]:
    prctl = _PRCTL

    def in_child() -> None:  # between fork and exec: no allocation-heavy work, no imports
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return in_child


class _Spawner:
    """One daemon thread that forks every child, so the parent-death signal fires only with the process."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[Callable[[], subprocess.Popen[bytes]], Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        if threading.current_thread() is self._thread:
            return start()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="cwtrain-local-spawner", daemon=True)
                self._thread.start()
        done: Future[subprocess.Popen[bytes]] = Future()
        self._requests.put((start, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            start, done = self._requests.get()
            try:
                done.set_result(start())
            except BaseException as exc:  # handed to the caller's thread
                done.set_exception(exc)


_SPAWNER = _Spawner()


def start_child(argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **popen)`` in a process group of its own, killed by the kernel when
    this process dies (on Linux; see the module docstring).

    Args:
        argv: the command line.
        **popen: more ``Popen`` arguments (``stdout``, ``env``, ...); not ``start_new_session``
            nor ``preexec_fn``, which this function sets.
    """
    if "preexec_fn" in popen or "start_new_session" in popen:
        raise TypeError("start_child sets preexec_fn and start_new_session itself")
    hook = _die_with_parent(os.getpid()) if PDEATHSIG_SUPPORTED else None
    return _SPAWNER.run(lambda: subprocess.Popen(list(argv), start_new_session=True, preexec_fn=hook, **popen))
