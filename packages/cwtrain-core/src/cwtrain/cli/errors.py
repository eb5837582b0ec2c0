"""How a ``cwtrain`` command ends on an error: one table from error types to exit codes.

:func:`cwtrain.cli.main` hands every exception a command raises to :func:`fail`, which
finds the first matching row of :data:`ERROR_EXITS`, writes one line to stderr and
returns the exit code::

    try:
        return handler(args)
    except BaseException as exc:
        code = fail(exc, debug=debug)
        if code is None:
            raise                               # no row: a bug, shown with its traceback
        return code

The table, in words (first match wins)::

    error                                          exit  stderr
    KeyboardInterrupt                              130   error: interrupted
    any CWTrainError (API, transport, snapshot,    1     error: <message on one line>
      hot-load, lifecycle, usage, configuration)
    OSError                                        1     error: <message on one line>
    object-store and credential errors             1     error: <message on one line>
      (botocore, boto3, s3transfer)
    anything else                                  -     raised: a bug, with its traceback

With ``-v`` or ``CWTRAIN_DEBUG`` the traceback is logged before the line (not for an
interrupt). Usage errors found by argparse (unknown command, bad option value) exit 2
before any command runs (:class:`cwtrain.cli.CLIParser`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from cwtrain.errors import CWTrainError

__all__ = ["ERROR_EXITS", "ErrorExit", "fail", "find_exit", "is_store_error", "one_line"]

log = logging.getLogger("cwtrain.cli")

_STORE_MODULES = ("botocore", "boto3", "s3transfer")


def is_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the object-store client or its credential chain."""
    return type(exc).__module__.startswith(_STORE_MODULES)


def one_line(exc: BaseException) -> str:
    """The error's message with every run of whitespace made one space (its type name if empty)."""
    return " ".join((str(exc) or type(exc).__name__).split())


@dataclass(frozen=True)
class ErrorExit:
    """One row of the table.

    Attributes:
        what: the errors of the row, in words.
        matches: whether an exception belongs to the row.
        code: the exit code.
        message: the text after ``error:``.
        traceback: whether ``-v`` / ``CWTRAIN_DEBUG`` log the traceback first.
    """

    what: str
    matches: Callable[[BaseException], bool]
    code: int
    message: Callable[[BaseException], str] = one_line
    traceback: bool = True


#: The rows, first match wins; an exception no row matches is a bug and is re-raised.
ERROR_EXITS: tuple[ErrorExit, ...] = (
    ErrorExit(
        "interrupted (Ctrl-C, SIGINT)",
        lambda exc: isinstance(exc, KeyboardInterrupt),
        130,
        lambda exc: "interrupted",
        traceback=False,
    ),
    ErrorExit("any cwtrain error", lambda exc: isinstance(exc, CWTrainError), 1),
    ErrorExit("an operating-system error (files, sockets)", lambda exc: isinstance(exc, OSError), 1),
    ErrorExit("an object-store client or credential error", is_store_error, 1),
)


def find_exit(exc: BaseException) -> ErrorExit | None:
    """The first row of :data:`ERROR_EXITS` that matches ``exc``, else ``None``."""
    return next((row for row in ERROR_EXITS if row.matches(exc)), None)


def fail(exc: BaseException, *, debug: bool, stream: TextIO | None = None) -> int | None:
    """Report ``exc`` as its row says and return the exit code; ``None`` when no row matches.

    Args:
        exc: the exception a command raised.
        debug: log the traceback first (``-v`` / ``CWTRAIN_DEBUG``), where the row allows.
        stream: where the ``error:`` line goes (default stderr).
    """
    row = find_exit(exc)
    if row is None:
        return None
    if debug and row.traceback:
        log.error("command failed", exc_info=exc)
    print(f"error: {row.message(exc)}", file=stream or sys.stderr)
    return row.code
