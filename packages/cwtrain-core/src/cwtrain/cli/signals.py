"""SIGTERM ends a command exactly as Ctrl-C does: one exception, the same clean-up, its own exit code.

Kubernetes stops a pod with SIGTERM; Python's default for it ends the process at once, with
no ``finally`` run: a multipart upload stays open, ``snapshot diff`` leaves its hidden
``.DIR.*.partial`` directory. :func:`cwtrain.cli.main` therefore runs every command inside
:func:`signals_interrupt`, which makes SIGTERM raise :class:`Terminated` in the main thread,
a :class:`KeyboardInterrupt`, so every path that cleans up after Ctrl-C (uploads cancel and
abort their unfinished multipart uploads, staged directories are removed, a hot-load being
waited for is named so it can be followed) does the same for SIGTERM::

    with signals_interrupt():
        return handler(args)          # SIGTERM -> Terminated(15), SIGINT -> KeyboardInterrupt

The exit code is the shell's convention, 128 + the signal number: 130 for SIGINT, 143 for
SIGTERM (:data:`cwtrain.cli.errors.ERROR_EXITS`). Commands that also stop on other signals
(``local up``: SIGHUP) install :func:`interrupt_on_signal` for them.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any, NoReturn

__all__ = ["Terminated", "exit_code", "interrupt_on_signal", "signals_interrupt"]


class Terminated(KeyboardInterrupt):
    """A signal other than SIGINT (SIGTERM, SIGHUP) asked the command to stop.

    A :class:`KeyboardInterrupt`, so it is cleaned up after exactly as Ctrl-C is.

    Attributes:
        signum: the signal number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.signum,))

    @property
    def name(self) -> str:
        """The signal's name (``"SIGTERM"``)."""
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"


def interrupt_on_signal(signum: int, frame: FrameType | None) -> NoReturn:
    """A signal handler: SIGINT raises :class:`KeyboardInterrupt`, any other signal :class:`Terminated`."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal number: 143 for :class:`Terminated` by SIGTERM, 130 for Ctrl-C."""
    return 128 + (interrupt.signum if isinstance(interrupt, Terminated) else int(signal.SIGINT))


@contextlib.contextmanager
def signals_interrupt(*signums: int) -> Iterator[None]:
    """Inside the block, ``signums`` (default SIGTERM) raise :class:`Terminated` in the main thread.

    Outside the main thread (where Python cannot install handlers) it changes nothing. The
    previous handlers come back on leaving.
    """
    chosen = signums or (signal.SIGTERM,)
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in chosen:
            previous[signum] = signal.signal(signum, interrupt_on_signal)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
