"""Deployment and gateway lifecycle: create, wait until READY, endpoints, delete.

Task helpers above :class:`~cwtrain.infra.client.InferenceClient` (service-api.md
sections 8 and 9)::

    from cwtrain.infra import InferenceClient, lifecycle

    api = InferenceClient()
    request = lifecycle.load_request("deployment.json")     # refuses <placeholders>
    dep = lifecycle.create_deployment(api, request)          # checks gateway zones first
    dep = lifecycle.wait_for_deployment(api, dep.id)         # READY, or LifecycleError
    base_url = lifecycle.deployment_base_url(api, dep)       # "https://…/v1" or None
    lifecycle.delete_deployment(api, dep.id)                 # waits until GET says NOT_FOUND

Waits poll inside one budget (:mod:`cwtrain.polling`): ``STATUS_ERROR`` (recoverable),
transient API errors and transport errors are logged and waited through; ``STATUS_FAILED`` and ``STATUS_DELETING`` end a READY wait at
once with the conditions' messages; a timeout says how long it waited and the last
conditions. There is no DELETED status: a resource is gone when GET answers NOT_FOUND.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from cwtrain.errors import (
    APIError,
    FailedPreconditionError,
    LifecycleError,
    NotFoundError,
    TransportError,
    UsageError,
    api_error,
)
from cwtrain.infra.client import InferenceClient
from cwtrain.infra.enums import ResourceStatus
from cwtrain.infra.models import Deployment, Gateway, describe_conditions
from cwtrain.jsondoc import load_json
from cwtrain.polling import Budget, poll

__all__ = [
    "LifecycleError",
    "check_gateway_zones",
    "create_deployment",
    "create_gateway",
    "delete_deployment",
    "delete_gateway",
    "deployment_base_url",
    "deployment_view",
    "endpoints",
    "find_placeholders",
    "load_request",
    "rollout_base_url",
    "wait_for_deployment",
    "wait_for_gateway",
]

log = logging.getLogger(__name__)

_PLACEHOLDER = re.compile(r"<[A-Za-z][^<>]*>")
_PLACEHOLDER_EXEMPT = (("runtime", "engineConfig"), ("runtime", "engineEnv"))
_ENABLE_HINT = "ask CoreWeave support to enable RL Rollouts for the organization"


# ------------------------------------------------------------------ request files


def load_request(source: str | Path, *, stdin: Any = None) -> dict[str, Any]:
    """Read a JSON request body from a file (``-`` = stdin) and refuse placeholders.

    Raises:
        UsageError: the file cannot be read, is not JSON (or nests deeper than
            :data:`cwtrain.jsondoc.MAX_DEPTH`) or not a JSON object, or a string value still
            holds a ``<placeholder>``.
    """
    name = str(source)
    try:
        text = (stdin or sys.stdin).read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read request file {name}: {exc}") from None
    try:
        body = load_json(text)
    except ValueError as exc:
        raise UsageError(f"request file {name} is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise UsageError(f"request file {name} must hold a JSON object, not {type(body).__name__}")
    refuse_placeholders(body, name)
    return body


def find_placeholders(body: Any) -> list[tuple[str, str]]:
    """``(path, value)`` of every string value that still holds a ``<placeholder>``.

    Keys, numbers and booleans are not checked, nor anything under
    ``runtime.engineConfig`` / ``runtime.engineEnv`` (where ``<think>`` is legitimate).
    Paths look like ``a.b[3].c``.
    """
    return list(_walk(body, ()))


def _walk(value: Any, path: tuple[str | int, ...]) -> Iterator[tuple[str, str]]:
    keys = tuple(p for p in path if isinstance(p, str))
    if any(keys[: len(exempt)] == exempt and len(path) >= 2 for exempt in _PLACEHOLDER_EXEMPT):
        return
    if isinstance(value, str):
        if _PLACEHOLDER.search(value):
            yield _format_path(path), value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, (*path, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, (*path, index))


def _format_path(path: tuple[str | int, ...]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "<root>"


def refuse_placeholders(body: Any, source: str = "the request") -> None:
    """Raise :class:`UsageError` listing up to five placeholders left in ``body``."""
    hits = find_placeholders(body)
    if hits:
        shown = ", ".join(f"{path} = {value!r}" for path, value in hits[:5])
        more = f" (and {len(hits) - 5} more)" if len(hits) > 5 else ""
        raise UsageError(f"fill in {source} first; it still has placeholders: {shown}{more}")


# ------------------------------------------------------------------------ creates


def check_gateway_zones(client: InferenceClient, gateway_ids: list[str]) -> list[Gateway]:
    """Refuse gateways that span more than one zone (hot-load needs a single zone)."""
    gateways = [client.get_gateway(g) for g in gateway_ids]
    zones = sorted({z for g in gateways for z in g.zones})
    if len(zones) > 1:
        listed = ", ".join(f"{g.id} {list(g.zones)}" for g in gateways)
        raise UsageError(
            f"hot-load needs every gateway of the deployment in one zone, but they span {zones} ({listed}); "
            "use gateways of a single zone"
        )
    return gateways


def create_deployment(
    client: InferenceClient,
    request: Mapping[str, Any],
    *,
    deployment_id: str | None = None,
    source: str = "the request",
) -> Deployment:
    """Create a deployment: refuse placeholders, check gateway zones, log the id, POST.

    Args:
        client: the API client.
        request: a CreateDeploymentRequest body.
        deployment_id: the id to use (else the body's ``id``, else a UUID4).
        source: how the request is named in errors (the file name).
    """
    refuse_placeholders(request, source)
    if not request.get("hotLoad"):
        log.warning(
            "%s has no hotLoad block: the deployment cannot hot-load, and hotLoad can only be set at creation", source
        )
    else:
        check_gateway_zones(client, [str(g) for g in request.get("gatewayIds") or []])
    try:
        return client.create_deployment(request, deployment_id=deployment_id)
    except APIError as error:
        if "not enabled" in error.message.lower() and "hot" in error.message.lower():
            raise api_error(
                error.code, f"{error.message}; {_ENABLE_HINT}", http_status=error.http_status, details=error.details
            ) from None
        raise


def create_gateway(
    client: InferenceClient, request: Mapping[str, Any], *, gateway_id: str | None = None, source: str = "the request"
) -> Gateway:
    """Create a gateway after refusing placeholders (the id is logged before the POST)."""
    refuse_placeholders(request, source)
    return client.create_gateway(request, gateway_id=gateway_id)


# -------------------------------------------------------------------------- waits


def _wait_ready[R: (Gateway, Deployment)](
    kind: str,
    get: Callable[[], R],
    resource_id: str,
    timeout: float,
    poll_interval: float,
    on_status: Callable[[R], None] | None,
) -> R:
    last: R | None = None
    last_error: APIError | TransportError | None = None
    for _ in poll(Budget(timeout), poll_interval):
        try:
            current = get()
        except NotFoundError:
            raise LifecycleError(f"{kind} {resource_id} does not exist (deleted while waiting?)") from None
        except (APIError, TransportError) as error:
            if not error.transient:
                raise
            last_error = error
            log.warning("%s %s: transient error while waiting (%s); still waiting", kind, resource_id, error)
        else:
            changed = last is None or current.status != last.status or current.conditions != last.conditions
            last = current
            if on_status is not None:
                on_status(current)
            if current.status is ResourceStatus.READY:
                return current
            if current.status in (ResourceStatus.FAILED, ResourceStatus.DELETING):
                raise LifecycleError(
                    f"{kind} {resource_id} is {current.status.name}: {describe_conditions(current.conditions)}"
                )
            if changed:
                level = logging.WARNING if current.status is ResourceStatus.ERROR else logging.INFO
                log.log(
                    level,
                    "%s %s is %s (%s)%s",
                    kind,
                    resource_id,
                    current.status.name,
                    describe_conditions(current.conditions),
                    "; waiting through it (recoverable)" if current.status is ResourceStatus.ERROR else "",
                )
    where = (
        f"last status {last.status.name} ({describe_conditions(last.conditions)})"
        if last is not None
        else f"no answer ({last_error})"
    )
    raise LifecycleError(f"{kind} {resource_id} was not READY after {timeout:g}s; {where}")


def wait_for_deployment(
    client: InferenceClient,
    deployment_id: str,
    *,
    timeout: float = 3600.0,
    poll_interval: float = 10.0,
    on_status: Callable[[Deployment], None] | None = None,
) -> Deployment:
    """Poll until the deployment is ``STATUS_READY``.

    Raises:
        LifecycleError: FAILED or DELETING (with the conditions' messages), gone, or the
            timeout passed (saying how long and the last conditions).
    """
    return _wait_ready(
        "deployment",
        lambda: client.get_deployment(deployment_id),
        deployment_id,
        timeout,
        poll_interval,
        on_status,
    )


def wait_for_gateway(
    client: InferenceClient,
    gateway_id: str,
    *,
    timeout: float = 600.0,
    poll_interval: float = 5.0,
    on_status: Callable[[Gateway], None] | None = None,
) -> Gateway:
    """Poll until the gateway is ``STATUS_READY`` (its endpoints appear then)."""
    return _wait_ready("gateway", lambda: client.get_gateway(gateway_id), gateway_id, timeout, poll_interval, on_status)


# ------------------------------------------------------------------------ deletes


def _delete(
    kind: str,
    send: Callable[[], None],
    get: Callable[[], object],
    resource_id: str,
    timeout: float,
    poll_interval: float,
    retry_precondition: bool,
) -> bool:
    accepted = False
    first = True
    for _ in poll(Budget(timeout), poll_interval):
        if not accepted:
            try:
                send()
                accepted = True
                log.info("%s %s: delete accepted; waiting until it is gone", kind, resource_id)
            except (APIError, TransportError) as error:
                if isinstance(error, NotFoundError) or error.http_status == 405:
                    # A 404/405 on DELETE is success only if GET agrees the resource is gone.
                    try:
                        get()
                    except NotFoundError:
                        return not first  # NOT_FOUND on the first DELETE: nothing existed
                    raise LifecycleError(
                        f"DELETE of {kind} {resource_id} answered {error}, but GET still finds it"
                    ) from None
                if isinstance(error, FailedPreconditionError) and retry_precondition:
                    log.info("%s %s: %s; retrying the delete", kind, resource_id, error)
                elif error.transient:
                    log.warning("%s %s: transient error on delete (%s); re-sending", kind, resource_id, error)
                else:
                    raise
            first = False
        if accepted:
            try:
                get()
            except NotFoundError:
                return True
            except (APIError, TransportError) as error:
                if not error.transient:
                    raise
                log.warning("%s %s: transient error while waiting for deletion (%s)", kind, resource_id, error)
                accepted = False  # re-send DELETE after a transient error
    raise LifecycleError(f"{kind} {resource_id} still exists after {timeout:g}s of deleting")


def delete_deployment(
    client: InferenceClient, deployment_id: str, *, timeout: float = 600.0, poll_interval: float = 5.0
) -> bool:
    """DELETE and wait until GET answers NOT_FOUND.

    Returns:
        ``False`` when nothing existed, else ``True`` once it is gone.

    Raises:
        LifecycleError: it still exists at the deadline.
    """
    return _delete(
        "deployment",
        lambda: client.delete_deployment(deployment_id),
        lambda: client.get_deployment(deployment_id),
        deployment_id,
        timeout,
        poll_interval,
        retry_precondition=False,
    )


def delete_gateway(
    client: InferenceClient, gateway_id: str, *, timeout: float = 600.0, poll_interval: float = 5.0
) -> bool:
    """DELETE (retrying while deployments are still attached) and wait until gone."""
    return _delete(
        "gateway",
        lambda: client.delete_gateway(gateway_id),
        lambda: client.get_gateway(gateway_id),
        gateway_id,
        timeout,
        poll_interval,
        retry_precondition=True,
    )


# ---------------------------------------------------------------- endpoints, views


def rollout_base_url(endpoint: str) -> str:
    """Normalise one gateway endpoint to an OpenAI base URL ending in ``/v1``.

    Strips whitespace and trailing ``/``, adds ``https://`` when there is no scheme,
    appends ``/v1`` unless present: ``"gw.example.com"`` → ``"https://gw.example.com/v1"``.
    """
    text = endpoint.strip().rstrip("/")
    if not text:
        raise UsageError("an empty gateway endpoint has no rollout base URL")
    if "://" not in text:
        text = "https://" + text
    if not text.endswith("/v1"):
        text += "/v1"
    return text


def endpoints(client: InferenceClient, deployment: Deployment) -> tuple[str, ...]:
    """The endpoints of the deployment's gateways, in gateway order, without duplicates.

    A gateway that cannot be read is skipped (logged).
    """
    found: list[str] = []
    for gateway_id in deployment.gateway_ids:
        try:
            gateway = client.get_gateway(gateway_id)
        except (APIError, TransportError) as error:
            log.warning("cannot read gateway %s of deployment %s: %s", gateway_id, deployment.id, error)
            continue
        for endpoint in gateway.endpoints:
            if endpoint not in found:
                found.append(endpoint)
    return tuple(found)


def deployment_base_url(
    client: InferenceClient, deployment: Deployment, found: tuple[str, ...] | None = None
) -> str | None:
    """The rollout base URL of a deployment (first endpoint), or ``None`` (logged)."""
    found = endpoints(client, deployment) if found is None else found
    for endpoint in found:
        if endpoint.strip():
            return rollout_base_url(endpoint)
    log.info("deployment %s has no gateway endpoint yet: no rollout base URL", deployment.id)
    return None


def deployment_view(client: InferenceClient, deployment: Deployment) -> dict[str, Any]:
    """The deployment view of interface.md section 1.2, with endpoints and base URL."""
    found = endpoints(client, deployment)
    return deployment.to_json(endpoints=found, rollout_base_url=deployment_base_url(client, deployment, found))
