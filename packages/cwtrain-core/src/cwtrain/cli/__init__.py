"""The ``cwtrain`` command line: ``cwtrain [global options] <group> <command> [options]``.

Groups register themselves: core's from :data:`CORE_GROUPS`, other distributions
through the ``cwtrain.cli`` entry-point group (``cwtrain-local`` adds ``local`` and
``demo``, ``cwtrain-gym`` adds ``gym``). A group module exposes
``register(subparsers)``, which adds its parsers and sets ``func`` on each command to
a ``handler(args) -> int``. Registration must stay cheap: heavy imports (torch, the
local stack) happen inside handlers. A group of :data:`OPTIONAL_GROUPS` whose package is
not installed (or does not load) is still listed, and running it says what to install
(``error: cwtrain demo needs cwtrain-local, which is not installed; install it from a
cwtrain checkout: pip install ./packages/cwtrain-local``, exit 1); a missing optional dependency (torch, ...) met while a
command runs is one line with its install line too (:mod:`cwtrain.cli.errors`).

Output rules: stdout carries exactly one JSON document (see
:func:`cwtrain.cli.output.emit`), stderr logs and progress. Other distributions' groups
build on what this package exports: :func:`command_group`, :func:`positive_int`,
:func:`positive_float`, :func:`client_from_args` and :func:`emit`. Exit codes: 0 success,
1 any failure (a :class:`~cwtrain.errors.CWTrainError`, ``OSError``, object-store or
credential error, or a bug, each one ``error:`` line with secrets masked), 130
interrupted (Ctrl-C), 143 terminated (SIGTERM, handled exactly as Ctrl-C:
:mod:`cwtrain.cli.signals`; the table is :data:`cwtrain.cli.errors.ERROR_EXITS`), 2 usage
error found by argparse. Tracebacks only with ``-v`` or ``CWTRAIN_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import sys
from collections.abc import Sequence
from importlib import import_module
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, NoReturn

from cwtrain._version import __version__
from cwtrain.cli.errors import fail, known_secrets, one_line
from cwtrain.cli.signals import Terminated, interrupt_on_signal, signals_interrupt
from cwtrain.config import env_bool
from cwtrain.errors import UsageError
from cwtrain.lazy import lazy_exports

if TYPE_CHECKING:
    from cwtrain.cli.options import client_from_args, command_group, positive_float, positive_int
    from cwtrain.cli.output import emit

__all__ = [
    "CORE_GROUPS",
    "OPTIONAL_GROUPS",
    "CLIParser",
    "Terminated",
    "build_parser",
    "client_from_args",
    "command_group",
    "emit",
    "interrupt_on_signal",
    "main",
    "positive_float",
    "positive_int",
]

#: What other distributions' command groups build on (``cwtrain local``, ``cwtrain gym``),
#: resolved on first use.
_LAZY = {
    "client_from_args": "cwtrain.cli.options",
    "command_group": "cwtrain.cli.options",
    "positive_float": "cwtrain.cli.options",
    "positive_int": "cwtrain.cli.options",
    "emit": "cwtrain.cli.output",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

log = logging.getLogger("cwtrain.cli")

#: Core command groups, as modules with a ``register(subparsers)`` function.
CORE_GROUPS = (
    "cwtrain.cli.deployment",
    "cwtrain.cli.gateway",
    "cwtrain.cli.hotload",
    "cwtrain.cli.snapshot",
)

_QUIET_LOGGERS = ("httpx", "httpcore", "botocore", "boto3", "s3transfer", "urllib3")

#: Command groups other distributions add, and the package each comes from.
OPTIONAL_GROUPS = {"local": "cwtrain-local", "demo": "cwtrain-local", "gym": "cwtrain-gym"}


class CLIParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line plus the usage, exit code 2.

    An option the command does not have is named before anything else argparse would
    report (a required option missing, a bad value), with the closest option it has::

        cwtrain hotload publish: error: unrecognized argument --checkpiont (did you mean --checkpoint?)
    """

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(  # type: ignore[override]  # typeshed's overloads; same behaviour
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        unknown = self._unknown_options(sys.argv[1:] if args is None else list(args))
        if unknown:
            self.error(_unrecognized(unknown, self._long_options()))
        return super().parse_known_args(args, namespace)

    def _long_options(self) -> list[str]:
        return [option for action in self._actions for option in action.option_strings if option.startswith("--")]

    def _unknown_options(self, args: Sequence[str]) -> list[str]:
        """The option-like arguments this parser would not recognise, up to its subcommand (if any)."""
        if "-" not in self.prefix_chars:  # a stand-in that takes everything (_add_missing_group)
            return []
        known = {option for action in self._actions for option in action.option_strings}
        commands = {
            name for action in self._actions if action.nargs == argparse.PARSER for name in action.choices or ()
        }
        unknown: list[str] = []
        for arg in args:
            if arg == "--" or arg in commands:
                break  # the rest is positional, or the subcommand's to judge
            if not _OPTION_LIKE.match(arg) or " " in arg:  # argparse takes these as values
                continue
            name = arg.split("=", 1)[0] if arg.startswith("--") else arg
            if name in known or (not arg.startswith("--") and arg[:2] in known):  # -fFILE
                continue
            if arg.startswith("--") and self.allow_abbrev and any(option.startswith(name) for option in known):
                continue  # an abbreviation (or an ambiguous one, which argparse reports)
            unknown.append(name)
        return unknown


#: What argparse would take for an option (``-x``, ``--name``); ``-1`` and ``-.5`` are values.
_OPTION_LIKE = re.compile(r"^--?[A-Za-z]")


def _unrecognized(unknown: Sequence[str], options: Sequence[str]) -> str:
    """``unrecognized argument --checkpiont (did you mean --checkpoint?)``, for each unknown option."""
    named = []
    for name in unknown:
        close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
        named.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return f"unrecognized argument{'s' if len(named) > 1 else ''} {', '.join(named)}"


def build_parser() -> CLIParser:
    """The full parser with every installed command group registered."""
    parser = CLIParser(
        prog="cwtrain",
        description=(
            "Train with reinforcement learning against a CoreWeave Dedicated Inference "
            "deployment: manage deployments, publish weights by checkpoint hot-load, run "
            "the local stack and its demo."
        ),
        epilog="Environment: COREWEAVE_API_TOKEN, COREWEAVE_API_URL, AWS_REGION, CW_S3_ENDPOINT "
        "(see docs/configuration.md). Output: one JSON document on stdout; logs on stderr.",
    )
    parser.add_argument("--version", action="version", version=f"cwtrain {__version__}")
    parser.add_argument("--base-url", help="API origin (else COREWEAVE_API_URL, else https://api.coreweave.com)")
    parser.add_argument("--token", help="API token (else COREWEAVE_API_TOKEN, then CW_API_TOKEN)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logs and tracebacks")
    groups = parser.add_subparsers(dest="group", metavar="<group>", parser_class=CLIParser)
    groups.required = True
    for module_name in CORE_GROUPS:
        try:
            module = import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # a group not built yet
        module.register(groups)
    broken: dict[str, str] = {}
    for ep in entry_points(group="cwtrain.cli"):
        try:
            register = ep.load()
        except ImportError as exc:  # a plug-in whose own dependencies are missing
            log.debug("skipping command group %s: %s", ep.name, exc)
            broken[str(getattr(ep.dist, "name", ep.name))] = one_line(exc)
            continue
        register(groups)
    for name, package in OPTIONAL_GROUPS.items():
        if name not in groups.choices:
            _add_missing_group(groups, name, package, broken.get(package))
    return parser


def _add_missing_group(groups: Any, name: str, package: str, reason: str | None) -> None:
    """A stand-in for a group whose package is missing: listed in ``--help``, running it says what to install."""
    from cwtrain.integrations.frameworks import install_line

    fix = install_line(package)
    state = f"is installed but does not load ({reason})" if reason else "is not installed"
    message = f"cwtrain {name} needs {package}, which {state}; install it from a cwtrain checkout: {fix}"
    stand_in = groups.add_parser(
        name, help=f"(needs {package}: {fix})", description=message, add_help=False, prefix_chars="\0"
    )
    stand_in.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def missing(args: argparse.Namespace) -> int:
        raise UsageError(message)

    stand_in.set_defaults(func=missing)


def _configure_logging(verbose: bool) -> None:
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s" if not verbose else "%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting (testable in-process)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return int(exc.code) if isinstance(exc.code, int) else 2
    debug = bool(args.verbose)
    try:
        debug = env_bool("CWTRAIN_DEBUG", False) or debug  # a bad value is a ConfigError naming it
        _configure_logging(debug)
        handler: Any = getattr(args, "func", None)
        if handler is None:
            parser.parse_args([*(argv or sys.argv[1:]), "--help"])
            return 2
        with signals_interrupt():  # SIGTERM stops a command as Ctrl-C does (cwtrain.cli.signals)
            return int(handler(args))
    except BaseException as exc:
        code = fail(exc, debug=debug, secrets=known_secrets(getattr(args, "token", None)))
        if code is None:
            raise
        return code
