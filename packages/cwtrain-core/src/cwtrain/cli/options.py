"""What the command groups share: argparse value types, the API client, command groups.

::

    p.add_argument("--timeout", type=positive_float, default=1800.0)   # finite > 0, else exit 2
    p.add_argument("--workers", type=positive_int, default=8)          # integer > 0, else exit 2
    commands = command_group(subparsers, "hotload", "publish snapshots and follow hot-loads")
    with client_from_args(args) as api: ...                             # --base-url / --token

    add_deployment_option(p)                       # --deployment ID, default $CWTRAIN_HOTLOAD_DEPLOYMENT_ID
    p.set_defaults(func=needs_deployment(handler))  # neither: one "error:" line, exit 2
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Callable
from typing import Any

from cwtrain.cli.output import emit
from cwtrain.config import env_str
from cwtrain.errors import NotFoundError
from cwtrain.infra.client import InferenceClient

__all__ = [
    "DEPLOYMENT_ENV",
    "add_delete_command",
    "add_deployment_option",
    "client_from_args",
    "command_group",
    "delete_resource",
    "needs_deployment",
    "no_deployment",
    "resolve_deployment",
    "usage_error",
    "positive_float",
    "positive_int",
]


#: The variable every ``--deployment`` option defaults to (``cwtrain local up`` exports it).
DEPLOYMENT_ENV = "CWTRAIN_HOTLOAD_DEPLOYMENT_ID"


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (else a usage error, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer > 0 (else a usage error, exit 2)."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def client_from_args(args: argparse.Namespace) -> InferenceClient:
    """An :class:`InferenceClient` from the global ``--base-url`` / ``--token`` options."""
    return InferenceClient(getattr(args, "token", None), base_url=getattr(args, "base_url", None))


def command_group(subparsers: Any, name: str, help_text: str, description: str | None = None) -> Any:
    """Add the group ``name`` (``cwtrain <name> <command>``); returns its command subparsers."""
    parser = subparsers.add_parser(name, help=help_text, description=description or help_text)
    commands = parser.add_subparsers(dest="command", metavar="<command>", parser_class=type(parser))
    commands.required = True
    return commands


def add_wait_options(parser: argparse.ArgumentParser, *, until: str, timeout: float, poll_interval: float) -> None:
    """``--wait`` (until ``until``), ``--timeout S`` and ``--poll-interval S`` with these defaults."""
    parser.add_argument("--wait", action="store_true", help=f"wait until {until}")
    parser.add_argument("--timeout", type=positive_float, default=timeout, help=f"seconds to wait ({timeout:g})")
    parser.add_argument(
        "--poll-interval", type=positive_float, default=poll_interval, help=f"seconds between polls ({poll_interval:g})"
    )


def add_create_command(
    commands: Any, resource: str, request: str, handler: Callable[[argparse.Namespace], int], *, timeout: float
) -> None:
    """The ``create -f FILE [--wait] [--timeout S] [--poll-interval S]`` command of a resource."""
    p = commands.add_parser("create", help=f"create a {resource} from a {request} JSON file")
    p.add_argument("-f", "--file", required=True, help="request JSON file, '-' for stdin")
    add_wait_options(p, until="STATUS_READY", timeout=timeout, poll_interval=10.0 if timeout > 600 else 5.0)
    p.set_defaults(func=handler)


def add_delete_command(commands: Any, resource: str, handler: Callable[[argparse.Namespace], int]) -> None:
    """The ``delete ID [--wait] [--timeout S] [--poll-interval S] [--ignore-not-found]`` command."""
    p = commands.add_parser("delete", help=f"delete a {resource}")
    p.add_argument("id", metavar="ID")
    add_wait_options(p, until="the API answers NOT_FOUND", timeout=600.0, poll_interval=5.0)
    p.add_argument("--ignore-not-found", action="store_true", help="exit 0 when it does not exist")
    p.set_defaults(func=handler)


def delete_resource(args: argparse.Namespace, send_once: Any, delete_and_wait: Any, api: InferenceClient) -> int:
    """Delete ``args.id`` (once, or until gone with ``--wait``) and print ``{"id", "result"}``."""
    try:
        if args.wait:
            existed = delete_and_wait(api, args.id, timeout=args.timeout, poll_interval=args.poll_interval)
            if not existed:
                raise NotFoundError("not_found", f"{args.id} does not exist")
            result = "deleted"
        else:
            send_once(args.id)
            result = "deleting"
    except NotFoundError:
        if not args.ignore_not_found:
            raise
        result = "not_found"
    emit({"id": args.id, "result": result})
    return 0


def add_deployment_option(parser: argparse.ArgumentParser | Any, help_text: str = "target deployment id") -> None:
    """Add ``--deployment ID``, defaulting to :data:`DEPLOYMENT_ENV` (resolved when the command runs)."""
    parser.add_argument("--deployment", metavar="ID", default=None, help=f"{help_text} (default: ${DEPLOYMENT_ENV})")


def resolve_deployment(args: argparse.Namespace) -> str | None:
    """``--deployment``, else :data:`DEPLOYMENT_ENV`, else ``None``; stores the result in ``args.deployment``."""
    if not getattr(args, "deployment", None):
        args.deployment = env_str(DEPLOYMENT_ENV)
    deployment: str | None = args.deployment
    return deployment


def usage_error(message: str) -> int:
    """A usage error found by a command: one ``error:`` line on stderr; returns exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    return 2


def no_deployment(alternative: str = "") -> int:
    """Report a missing deployment as a usage error: one ``error:`` line naming the option and the variable, exit 2."""
    return usage_error(f"no deployment: pass --deployment ID or set {DEPLOYMENT_ENV}{alternative}")


def needs_deployment(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a command handler: resolve ``--deployment`` first; without one, :func:`no_deployment` (exit 2)."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        if not resolve_deployment(args):
            return no_deployment()
        return handler(args)

    return run
