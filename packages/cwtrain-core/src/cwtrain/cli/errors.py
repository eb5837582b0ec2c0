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
    SIGTERM (cwtrain.cli.signals.Terminated)       143   error: terminated (SIGTERM)
    KeyboardInterrupt (Ctrl-C, SIGINT)             130   error: interrupted
    any CWTrainError (API, transport, snapshot,    1     error: <message on one line>
      hot-load, lifecycle, usage, configuration)
    OSError                                        1     error: <message on one line>
    object-store and credential errors             1     error: <message on one line>
      (botocore, boto3, s3transfer)
    a missing optional package or dependency       1     error: <message>; <what to install>
      (ImportError naming a fix, or a
      ModuleNotFoundError of torch, ray, ...)
    a name that is not valid UTF-8 met where       1     error: a file or directory name is not valid UTF-8 ...
      cwtrain does not check it first
    any other Exception (a bug)                    1     error: internal error (<type>: <message>); ...

So every failure, whatever the input, is one ``error:`` line and exit 1 (2 for usage
errors argparse finds before any command runs, :class:`cwtrain.cli.CLIParser`). With
``-v`` or ``CWTRAIN_DEBUG`` the traceback is logged before the line (not for an
interrupt); the last row asks for it, since that row means a bug to report.

Every line is masked (:func:`cwtrain.errors.mask_secrets`): each form of each secret
the command could know (``--token``, the secret variables of
:data:`cwtrain.config.VARIABLES`, the values of ``CWTRAIN_API_HEADERS``, the AWS keys;
:func:`known_secrets`), the userinfo of URLs, bearer tokens and S3 signature parts.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TextIO

from cwtrain.cli.signals import Terminated
from cwtrain.cli.signals import exit_code as signal_exit_code
from cwtrain.config import VARIABLES
from cwtrain.errors import CWTrainError, mask_secrets
from cwtrain.jsondoc import load_json

__all__ = [
    "ERROR_EXITS",
    "ErrorExit",
    "fail",
    "find_exit",
    "is_store_error",
    "known_secrets",
    "missing_hint",
    "one_line",
]

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

    def exit_code(self, exc: BaseException) -> int:
        """The exit code for ``exc`` (an interrupt's depends on its signal: 128 + its number)."""
        return signal_exit_code(exc) if isinstance(exc, KeyboardInterrupt) else self.code


def missing_hint(exc: BaseException) -> str | None:
    """What to install for an ``ImportError`` of an optional dependency, else ``None``.

    A ``ModuleNotFoundError`` of a known optional module gets its install line
    (:func:`cwtrain.integrations.frameworks.missing_module_hint`); an ``ImportError``
    whose message already names a ``pip install`` (``frameworks.require``) is its own fix.
    """
    if not isinstance(exc, ImportError):
        return None
    if "pip install" in str(exc):
        return ""
    from cwtrain.integrations.frameworks import missing_module_hint

    return missing_module_hint(exc.name) if isinstance(exc, ModuleNotFoundError) else None


def _missing_message(exc: BaseException) -> str:
    hint = missing_hint(exc)
    return one_line(exc) + (f"; {hint}" if hint else "")


#: The rows, first match wins; an exception no row matches is a bug and is re-raised.
ERROR_EXITS: tuple[ErrorExit, ...] = (
    ErrorExit(
        "terminated (SIGTERM, and SIGHUP where a command stops on it)",
        lambda exc: isinstance(exc, Terminated),
        143,
        lambda exc: f"terminated ({exc.name if isinstance(exc, Terminated) else 'signal'})",
        traceback=False,
    ),
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
    ErrorExit(
        "a missing optional package or dependency", lambda exc: missing_hint(exc) is not None, 1, _missing_message
    ),
    ErrorExit(
        "a file or directory name that is not valid UTF-8",
        lambda exc: isinstance(exc, UnicodeEncodeError) and "surrogates not allowed" in str(exc),
        1,
        lambda exc: (
            f"a file or directory name is not valid UTF-8 ({one_line(exc)}): rename it; cwtrain's file names "
            "become object keys, index entries and JSON, which are UTF-8"
        ),
    ),
    ErrorExit(
        "any other exception: a bug",
        lambda exc: isinstance(exc, Exception),
        1,
        lambda exc: (
            f"internal error ({type(exc).__name__}: {one_line(exc)}); this is a bug in cwtrain: "
            "rerun with -v and report the traceback"
        ),
    ),
)

#: Secrets the store client reads from the environment (not cwtrain's own variables).
_STORE_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def known_secrets(token: str | None = None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every secret value a command could have seen: ``token`` (``--token``), the variables
    :data:`cwtrain.config.VARIABLES` marks secret, each value of ``CWTRAIN_API_HEADERS``
    (read leniently: a bad value is still masked whole) and the AWS keys."""
    environ = os.environ if environ is None else environ
    values = [token or ""]
    values += [environ.get(var.name, "") for var in VARIABLES.values() if var.secret]
    values += [environ.get(name, "") for name in _STORE_SECRETS]
    try:
        headers = load_json(environ.get("CWTRAIN_API_HEADERS") or "{}")
    except ValueError:
        headers = None
    if isinstance(headers, dict):
        values += [str(value) for value in headers.values()]
    return [value for value in values if value]


def find_exit(exc: BaseException) -> ErrorExit | None:
    """The first row of :data:`ERROR_EXITS` that matches ``exc``, else ``None``."""
    return next((row for row in ERROR_EXITS if row.matches(exc)), None)


def fail(exc: BaseException, *, debug: bool, stream: TextIO | None = None, secrets: Iterable[str] = ()) -> int | None:
    """Report ``exc`` as its row says and return the exit code; ``None`` when no row matches.

    Only exceptions that are not ``Exception`` (``SystemExit``, ``GeneratorExit``) match no
    row.

    Args:
        exc: the exception a command raised.
        debug: log the traceback first (``-v`` / ``CWTRAIN_DEBUG``), where the row allows.
        stream: where the ``error:`` line goes (default stderr).
        secrets: values masked in every form (:func:`cwtrain.errors.mask_secrets`).
    """
    row = find_exit(exc)
    if row is None:
        return None
    if debug and row.traceback:
        log.error("command failed", exc_info=exc)
    line = " ".join(mask_secrets(row.message(exc), secrets).split())
    print(f"error: {line}", file=stream or sys.stderr)
    return row.exit_code(exc)
