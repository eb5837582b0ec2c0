"""The ``deployment`` and ``gateway`` command groups.

::

    cwtrain deployment create -f deployment.json --wait     # → deployment view
    cwtrain deployment get ID                               # → deployment view
    cwtrain deployment delete ID --wait                     # → {"id", "result"}
    cwtrain deployment parameters --gateway GW              # → the API's JSON unchanged
    cwtrain gateway create -f gateway.json --wait           # → gateway view
    cwtrain gateway get|delete ID / gateway parameters

Every command prints one JSON document on stdout and logs on stderr; exit 0 on
success, 1 on any cwtrain error (one ``error:`` line), 2 on a usage error. Request
files (``-`` = stdin) must be JSON objects without ``<placeholders>`` outside
``runtime.engineConfig`` / ``runtime.engineEnv``. See ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import Any

from cwtrain.cli.output import emit
from cwtrain.errors import APIError, LifecycleError, NotFoundError
from cwtrain.infra import lifecycle
from cwtrain.infra.client import InferenceClient

__all__ = ["client_from_args", "positive_float", "positive_int", "register"]

log = logging.getLogger("cwtrain.cli")


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


def register(subparsers: Any) -> None:
    """Add the ``deployment`` and ``gateway`` groups to the ``cwtrain`` parser."""
    _register_deployment(subparsers)
    _register_gateway(subparsers)


def _group(subparsers: Any, name: str, help_text: str) -> Any:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    commands = parser.add_subparsers(dest="command", metavar="<command>", parser_class=type(parser))
    commands.required = True
    return commands


def _register_deployment(subparsers: Any) -> None:
    commands = _group(subparsers, "deployment", "create, inspect and delete Dedicated Inference deployments")

    p = commands.add_parser("create", help="create a deployment from a CreateDeploymentRequest JSON file")
    p.add_argument("-f", "--file", required=True, help="request JSON file, '-' for stdin")
    p.add_argument("--wait", action="store_true", help="wait until STATUS_READY")
    p.add_argument("--timeout", type=positive_float, default=3600.0, help="seconds to wait (3600)")
    p.add_argument("--poll-interval", type=positive_float, default=10.0, help="seconds between polls (10)")
    p.set_defaults(func=_deployment_create)

    p = commands.add_parser("get", help="show a deployment, its endpoints and rollout base URL")
    p.add_argument("id", metavar="ID")
    p.set_defaults(func=_deployment_get)

    p = commands.add_parser("delete", help="delete a deployment")
    p.add_argument("id", metavar="ID")
    p.add_argument("--wait", action="store_true", help="wait until the API answers NOT_FOUND")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds to wait (600)")
    p.add_argument("--poll-interval", type=positive_float, default=5.0, help="seconds between polls (5)")
    p.add_argument("--ignore-not-found", action="store_true", help="exit 0 when it does not exist")
    p.set_defaults(func=_deployment_delete)

    p = commands.add_parser("parameters", help="allowed engines, versions and engineEnv names")
    p.add_argument("--gateway", action="append", default=[], metavar="ID", help="gateway id (repeatable)")
    p.set_defaults(func=_deployment_parameters)


def _register_gateway(subparsers: Any) -> None:
    commands = _group(subparsers, "gateway", "create, inspect and delete gateways")

    p = commands.add_parser("create", help="create a gateway from a CreateGatewayRequest JSON file")
    p.add_argument("-f", "--file", required=True, help="request JSON file, '-' for stdin")
    p.add_argument("--wait", action="store_true", help="wait until STATUS_READY")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds to wait (600)")
    p.add_argument("--poll-interval", type=positive_float, default=5.0, help="seconds between polls (5)")
    p.set_defaults(func=_gateway_create)

    p = commands.add_parser("get", help="show a gateway and its endpoints")
    p.add_argument("id", metavar="ID")
    p.set_defaults(func=_gateway_get)

    p = commands.add_parser("delete", help="delete a gateway")
    p.add_argument("id", metavar="ID")
    p.add_argument("--wait", action="store_true", help="wait until the API answers NOT_FOUND")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds to wait (600)")
    p.add_argument("--poll-interval", type=positive_float, default=5.0, help="seconds between polls (5)")
    p.add_argument("--ignore-not-found", action="store_true", help="exit 0 when it does not exist")
    p.set_defaults(func=_gateway_delete)

    p = commands.add_parser("parameters", help="valid gateway zones")
    p.set_defaults(func=_gateway_parameters)


# ------------------------------------------------------------------- deployment


def _deployment_create(args: argparse.Namespace) -> int:
    request = lifecycle.load_request(args.file)
    source = "stdin" if args.file == "-" else args.file
    with client_from_args(args) as api:
        deployment = lifecycle.create_deployment(api, request, source=source)
        if args.wait:
            try:
                deployment = lifecycle.wait_for_deployment(
                    api, deployment.id, timeout=args.timeout, poll_interval=args.poll_interval
                )
            except LifecycleError as error:
                _emit_latest(api, deployment.id)
                print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
                return 1
        emit(lifecycle.deployment_view(api, deployment))
    return 0


def _emit_latest(api: InferenceClient, deployment_id: str) -> None:
    try:
        emit(lifecycle.deployment_view(api, api.get_deployment(deployment_id)))
    except APIError as error:
        log.warning("cannot read deployment %s: %s", deployment_id, error)


def _deployment_get(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        emit(lifecycle.deployment_view(api, api.get_deployment(args.id)))
    return 0


def _deployment_delete(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        return _delete(args, api.delete_deployment, lifecycle.delete_deployment, api)


def _deployment_parameters(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        emit(api.get_deployment_parameters(args.gateway or None))
    return 0


# ---------------------------------------------------------------------- gateway


def _gateway_create(args: argparse.Namespace) -> int:
    request = lifecycle.load_request(args.file)
    source = "stdin" if args.file == "-" else args.file
    with client_from_args(args) as api:
        gateway = lifecycle.create_gateway(api, request, source=source)
        if args.wait:
            gateway = lifecycle.wait_for_gateway(
                api, gateway.id, timeout=args.timeout, poll_interval=args.poll_interval
            )
        emit(gateway)
    return 0


def _gateway_get(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        emit(api.get_gateway(args.id))
    return 0


def _gateway_delete(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        return _delete(args, api.delete_gateway, lifecycle.delete_gateway, api)


def _gateway_parameters(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        emit(api.get_gateway_parameters())
    return 0


def _delete(args: argparse.Namespace, send_once: Any, delete_and_wait: Any, api: InferenceClient) -> int:
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
