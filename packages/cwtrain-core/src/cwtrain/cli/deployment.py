"""The ``deployment`` command group: create, inspect and delete Dedicated Inference deployments.

::

    cwtrain deployment create -f deployment.json --wait     # → deployment view
    cwtrain deployment get ID                               # → deployment view
    cwtrain deployment list [--gateway ID]                  # → [deployment view, ...]
    cwtrain deployment delete ID --wait                     # → {"id", "result"}
    cwtrain deployment parameters --gateway GW              # → the API's JSON unchanged
                                                            #   (gatewayIds, runtimeParameters,
                                                            #    resourceParameters)
    cwtrain deployment base-checkpoint [ID] --out DIR       # → {"path", "source", "deployment_id",
                                                            #    "model", "files"}

Every command prints one JSON document on stdout and logs on stderr; exit 0 on
success, 1 on any cwtrain error (one ``error:`` line), 2 on a usage error. Request
files (``-`` = stdin) must be JSON objects without ``<placeholders>`` outside
``runtime.engineConfig`` / ``runtime.engineEnv``. See ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from cwtrain.cli.options import (
    DEPLOYMENT_ENV,
    add_create_command,
    add_delete_command,
    client_from_args,
    command_group,
    delete_resource,
    usage_error,
)
from cwtrain.cli.output import emit
from cwtrain.config import env_str
from cwtrain.errors import APIError, LifecycleError, TransportError
from cwtrain.infra import lifecycle
from cwtrain.infra.client import InferenceClient

__all__ = ["register"]

log = logging.getLogger("cwtrain.cli")


def register(subparsers: Any) -> None:
    """Add the ``deployment`` group to the ``cwtrain`` parser."""
    commands = command_group(subparsers, "deployment", "create, inspect and delete Dedicated Inference deployments")

    add_create_command(commands, "deployment", "CreateDeploymentRequest", _deployment_create, timeout=3600.0)

    p = commands.add_parser("get", help="show a deployment, its endpoints and rollout base URL")
    p.add_argument("id", metavar="ID")
    p.set_defaults(func=_deployment_get)

    p = commands.add_parser("list", help="every deployment (or those behind one gateway), as get shows them")
    p.add_argument("--gateway", metavar="ID", default=None, help="only deployments behind this gateway")
    p.set_defaults(func=_deployment_list)

    add_delete_command(commands, "deployment", _deployment_delete)

    p = commands.add_parser(
        "parameters", help="gateways, runtime versions, engineConfig keys and instance types a deployment may use"
    )
    p.add_argument("--gateway", action="append", default=[], metavar="ID", help="gateway id (repeatable)")
    p.set_defaults(func=_deployment_parameters)

    p = commands.add_parser(
        "base-checkpoint",
        help="copy the checkpoint a deployment was created with (its model source) into a directory",
        description=(
            "Copy the objects directly under the deployment's model source (spec.model: model_bucket and "
            "model_path in 'deployment get') from object storage (CW_S3_ENDPOINT, AWS_*) into DIR, through "
            "DIR.partial renamed when complete. DIR must not exist or be empty."
        ),
    )
    p.add_argument("id", metavar="ID", nargs="?", default=None, help=f"deployment id (default: ${DEPLOYMENT_ENV})")
    p.add_argument("--out", required=True, metavar="DIR", help="where to write it (new or empty)")
    p.set_defaults(func=_deployment_base_checkpoint)


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
    except (APIError, TransportError) as error:
        log.warning("cannot read deployment %s: %s", deployment_id, error)


def _deployment_get(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        emit(lifecycle.deployment_view(api, api.get_deployment(args.id)))
    return 0


def _deployment_list(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        deployments = api.list_deployments(args.gateway)
        gateways = {g.id: g for g in api.list_gateways()} if deployments else {}
        views = []
        for deployment in deployments:
            # the view of `deployment get`, from one listing of the gateways instead of one GET each
            found = tuple(
                dict.fromkeys(e for g in deployment.gateway_ids if g in gateways for e in gateways[g].endpoints)
            )
            url = lifecycle.deployment_base_url(api, deployment, found)
            views.append(deployment.to_json(endpoints=found, rollout_base_url=url))
        emit(views)
    return 0


def _deployment_delete(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        return delete_resource(args, api.delete_deployment, lifecycle.delete_deployment, api)


def _deployment_parameters(args: argparse.Namespace) -> int:
    with client_from_args(args) as api:
        emit(api.get_deployment_parameters(args.gateway or None))
    return 0


def _deployment_base_checkpoint(args: argparse.Namespace) -> int:
    from cwtrain.integrations.staging import fetch_base_checkpoint, refuse_unless_new

    refuse_unless_new(args.out, f"--out {args.out}")  # named as the option, before the deployment is read
    deployment_id = args.id or env_str(DEPLOYMENT_ENV)
    if not deployment_id:
        return usage_error(f"no deployment: pass ID or set {DEPLOYMENT_ENV}")
    with client_from_args(args) as api:
        emit(fetch_base_checkpoint(deployment_id, args.out, api=api).to_json())
    return 0
