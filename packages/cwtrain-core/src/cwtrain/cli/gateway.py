"""The ``gateway`` command group: create, inspect and delete gateways.

::

    cwtrain gateway create -f gateway.json --wait           # → gateway view
    cwtrain gateway get ID                                  # → gateway view
    cwtrain gateway list                                    # → [gateway view, ...]
    cwtrain gateway delete ID --wait                        # → {"id", "result"}
    cwtrain gateway parameters                              # → valid zones (the API's JSON)

Output and exit codes as for every group (see :mod:`cwtrain.cli`).
"""

from __future__ import annotations

import argparse
from typing import Any

from cwtrain.cli.options import (
    add_create_command,
    add_delete_command,
    client_from_args,
    command_group,
    delete_resource,
)
from cwtrain.cli.output import emit
from cwtrain.infra import lifecycle

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``gateway`` group to the ``cwtrain`` parser."""
    commands = command_group(subparsers, "gateway", "create, inspect and delete gateways")

    add_create_command(commands, "gateway", "CreateGatewayRequest", _gateway_create, timeout=600.0)

    p = commands.add_parser("get", help="show a gateway and its endpoints")
    p.add_argument("id", metavar="ID")
    p.set_defaults(func=_gateway_get)

    p = commands.add_parser("list", help="every gateway of the organisation, as get shows them")
    p.set_defaults(func=_gateway_list)

    add_delete_command(commands, "gateway", _gateway_delete)

    p = commands.add_parser("parameters", help="valid gateway zones")
    p.set_defaults(func=_gateway_parameters)


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


def _gateway_list(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        emit(api.list_gateways())
    return 0


def _gateway_delete(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        return delete_resource(args, api.delete_gateway, lifecycle.delete_gateway, api)


def _gateway_parameters(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        emit(api.get_gateway_parameters())
    return 0
