"""The local control plane: CoreWeave's v1alpha1 inference API over loopback HTTP.

:class:`ControlPlaneServer` serves ``/v1alpha1/inference`` (``shared/spec/service-api.md``)
from a :class:`~cwtrain.local.controlplane.state.ControlPlaneState` on a loopback HTTP server in a
background thread (:mod:`cwtrain.serving`):

=======  ======================================  ==========================================
Method   Path                                    Answer
=======  ======================================  ==========================================
GET      ``/gateways`` (``updatedAfter``)        ``{"items": [gateway, ...]}``
POST     ``/gateways``                           ``{"gateway": ...}`` (client ``id``)
GET      ``/gateways/parameters``                ``{"zones": [...]}``
GET      ``/gateways/{id}``                      ``{"gateway": ...}``
DELETE   ``/gateways/{id}``                      ``{}`` (failed_precondition while attached)
GET      ``/deployments`` (``parentGatewayId``)  ``{"items": [deployment, ...]}``
POST     ``/deployments``                        ``{"deployment": ...}`` (client ``id``)
GET      ``/deployments/parameters``             ``gatewayIds``, ``runtimeParameters``, ...
                                                 (``gatewayIds`` repeated; see below)
GET      ``/deployments/{id}``                   ``{"deployment": ...}``
PATCH    ``/deployments/{id}``                   ``{"deployment": ...}`` (``hotLoad`` frozen)
DELETE   ``/deployments/{id}``                   ``{}``; STATUS_DELETING, then not_found
POST     ``/hotLoads``                           ``{"hotLoad": ...}`` (client ``hotLoadId``;
                                                 no ``promptCachePolicy``: PRESERVE echoed)
GET      ``/hotLoads``                           ``hotLoads[]``, ``nextPageToken``, newest first
GET      ``/hotLoads/{id}``                      ``{"hotLoad": ...}``
GET      ``/hotLoads/{id}/replicas``             ``replicas[]``, ``nextPageToken``
POST     ``/hotLoads/{id}:cancel``               ``{"hotLoad": ...}`` CANCELED (the service:
                                                 ``unimplemented``, see below)
=======  ======================================  ==========================================

``/deployments/parameters`` answers in the public API reference's shape
(:func:`cwtrain.local.controlplane.resources.deployment_parameters`)::

    {"gatewayIds": ["7f6c..."],
     "runtimeParameters": {"runtimeVersions": {"dynamo-vllm": {"versions": ["1.2.3", "1.3.0"]}, ...},
                           "runtimeConfigOptions": {"dynamo-vllm": {"allowedKeys": ["max-model-len", ...]}, ...},
                           "engineEnvOptions": {"dynamo-vllm": {"allowedNames": ["HF_HUB_OFFLINE", ...]}, ...}},
     "resourceParameters": {"instanceTypes": ["CPU_LOCAL", "H100_80GB_SXM5"]}}

A hot-load created without ``promptCachePolicy`` echoes ``PROMPT_CACHE_POLICY_PRESERVE``
(the public reference does not say what the service echoes; the spec's rule is that an
absent policy means PRESERVE). Cancel works here by default (``cancel_implemented``); the
service documents it as not implemented yet and answers ``unimplemented`` (HTTP 501), which
``LocalStack(cancel_implemented=False)`` reproduces.

Every call needs ``Authorization: Bearer <token>``: an admin token may write, a viewer
token may only read (``permission_denied`` otherwise), anything else is
``unauthenticated``; the token is checked before a byte of the body is read. Bodies are
bounded (:data:`MAX_BODY_BYTES`, 413) and framed strictly (400 for a ``Content-Length``
such as ``abc``, ``-1`` or ``1e11``; :mod:`cwtrain.serving`). Ids in paths are
matched segment by segment before they are unescaped, and an id that is not 1-128
characters of ``[A-Za-z0-9._-]`` (``x?junk``, ``a%2Fb``, control characters) is refused
with ``invalid_argument`` instead of being looked up. Errors are ``{"code": <Connect
code>, "message", "details": []}`` with the usual HTTP status. Armed
:class:`~cwtrain.local.harness.faults.APIFaults` apply after authentication, before routing.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from cwtrain.jsondoc import load_json
from cwtrain.local.controlplane.resources import ServiceError, check_resource_id
from cwtrain.local.controlplane.state import ControlPlaneState
from cwtrain.local.harness.faults import APIFaults
from cwtrain.local.loopback import LoopbackHTTPServer
from cwtrain.serving import BackgroundServer, JSONHandler, RequestRefused

__all__ = ["API_PREFIX", "MAX_BODY_BYTES", "ControlPlaneServer"]

log = logging.getLogger("cwtrain.local.controlplane.server")

#: Path prefix of the inference API.
API_PREFIX = "/v1alpha1/inference"
#: The longest request body the control plane reads (gRPC's default message limit).
MAX_BODY_BYTES = 4 << 20

Query = dict[str, list[str]]
Ids = list[str]
Route = tuple[str, re.Pattern[str], Callable[[ControlPlaneState, Ids, Query, Any], dict[str, Any]]]

_SEGMENT = r"([^/:]+)"


def _one(query: Query, key: str) -> str | None:
    values = query.get(key)
    return values[-1] if values else None


def _many(query: Query, key: str) -> list[str]:
    return [part for value in query.get(key, []) for part in value.split(",") if part]


_ROUTES: tuple[Route, ...] = (
    ("GET", re.compile(r"^/gateways/parameters$"), lambda s, m, q, b: s.gateway_parameters()),
    ("GET", re.compile(r"^/gateways$"), lambda s, m, q, b: s.list_gateways(_one(q, "updatedAfter"))),
    ("POST", re.compile(r"^/gateways$"), lambda s, m, q, b: s.create_gateway(b)),
    ("GET", re.compile(rf"^/gateways/{_SEGMENT}$"), lambda s, m, q, b: s.get_gateway(m[0])),
    ("DELETE", re.compile(rf"^/gateways/{_SEGMENT}$"), lambda s, m, q, b: s.delete_gateway(m[0])),
    (
        "GET",
        re.compile(r"^/deployments/parameters$"),
        lambda s, m, q, b: s.deployment_parameters(_many(q, "gatewayIds")),
    ),
    (
        "GET",
        re.compile(r"^/deployments$"),
        lambda s, m, q, b: s.list_deployments(_one(q, "parentGatewayId") or None, _one(q, "updatedAfter")),
    ),
    ("POST", re.compile(r"^/deployments$"), lambda s, m, q, b: s.create_deployment(b)),
    ("GET", re.compile(rf"^/deployments/{_SEGMENT}$"), lambda s, m, q, b: s.get_deployment(m[0])),
    ("PATCH", re.compile(rf"^/deployments/{_SEGMENT}$"), lambda s, m, q, b: s.update_deployment(m[0], b)),
    ("PUT", re.compile(rf"^/deployments/{_SEGMENT}$"), lambda s, m, q, b: s.update_deployment(m[0], b)),
    ("DELETE", re.compile(rf"^/deployments/{_SEGMENT}$"), lambda s, m, q, b: s.delete_deployment(m[0])),
    ("POST", re.compile(r"^/hotLoads$"), lambda s, m, q, b: s.create_hot_load(b)),
    (
        "GET",
        re.compile(r"^/hotLoads$"),
        lambda s, m, q, b: s.list_hot_loads(
            _one(q, "parentDeploymentId") or None, _one(q, "maxPageSize"), _one(q, "pageToken")
        ),
    ),
    ("POST", re.compile(rf"^/hotLoads/{_SEGMENT}:cancel$"), lambda s, m, q, b: s.cancel_hot_load(m[0])),
    ("GET", re.compile(rf"^/hotLoads/{_SEGMENT}$"), lambda s, m, q, b: s.get_hot_load(m[0])),
    (
        "GET",
        re.compile(rf"^/hotLoads/{_SEGMENT}/replicas$"),
        lambda s, m, q, b: s.list_replicas(m[0], _one(q, "maxPageSize"), _one(q, "pageToken")),
    ),
)


_KINDS = {"gateways": "gateway id", "deployments": "deployment id", "hotLoads": "hot-load id"}


class _Handler(JSONHandler):
    server: _Server
    max_body_bytes = MAX_BODY_BYTES

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("api: " + format, *args)

    def _drop(self) -> None:
        """Close the connection without an answer (the client sees a transport error)."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _auth(self, method: str) -> None:
        header = self.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ServiceError("unauthenticated", "missing bearer token (Authorization: Bearer <token>)")
        if token in self.server.admin_tokens:
            return
        if token in self.server.viewer_tokens:
            if method != "GET":
                raise ServiceError("permission_denied", "this call needs the Inference Admin role")
            return
        raise ServiceError("unauthenticated", "invalid or expired token")

    def authenticate(self) -> None:
        try:
            self._auth(self.command)
        except ServiceError as exc:
            raise RequestRefused(exc.http_status, exc.message, code=exc.code) from None

    def refusal_body(self, error: RequestRefused) -> Any:
        return {"code": error.code, "message": error.message, "details": []}

    def _handle(self, method: str) -> None:
        split = urlsplit(self.path)
        try:
            raw = self.read_body()  # authenticates first
        except RequestRefused as exc:
            self.refuse(exc)
            return
        if not split.path.startswith(API_PREFIX + "/"):
            path = unquote(split.path)
            self.send_json(404, ServiceError("not_found", f"no route for {method} {path[:200]}").body())
            return
        route = split.path[len(API_PREFIX) :].rstrip("/")  # still escaped: ids are unescaped per segment
        path = unquote(route)
        faults = self.server.faults.take(method, path)
        for fault in faults:
            if fault.kind == "delay":
                time.sleep(fault.seconds)
        drop = any(f.kind == "drop" for f in faults)
        try:
            for fault in faults:
                if fault.kind == "fail":
                    raise ServiceError(fault.code, fault.message, http_status=fault.http_status)
            status, payload = 200, self._route(method, route, parse_qs(split.query), raw)
        except ServiceError as exc:
            status, payload = exc.http_status, exc.body()
        except Exception as exc:
            log.exception("local control plane failed on %s %s", method, path)
            status, payload = 500, ServiceError("internal", f"internal error: {type(exc).__name__}").body()
        if drop:
            self._drop()
            return
        self.send_json(status, payload)

    def _route(self, method: str, route: str, query: Query, raw: bytes) -> dict[str, Any]:
        body: Any = None
        if method in ("POST", "PATCH", "PUT"):
            try:
                body = load_json(raw) if raw.strip() else {}
            except ValueError as exc:
                raise ServiceError("invalid_argument", f"request body is not valid JSON: {exc}") from None
            if not isinstance(body, dict):
                raise ServiceError("invalid_argument", "request body must be a JSON object")
        known = False
        for verb, pattern, handler in _ROUTES:
            match = pattern.match(route)
            if match is None:
                continue
            known = True
            what = _KINDS.get(route.split("/")[1], "id")
            ids = [check_resource_id(unquote(group), what) for group in match.groups()]
            if verb == method:
                return handler(self.server.state, ids, query, body)
        path = unquote(route)[:200]
        if known:
            raise ServiceError("unimplemented", f"method {method} is not supported on {path}", http_status=405)
        raise ServiceError("not_found", f"no route for {method} {API_PREFIX}{path}")

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_PUT(self) -> None:
        self._handle("PUT")


class _Server(LoopbackHTTPServer):
    def __init__(
        self,
        port: int,
        state: ControlPlaneState,
        admin_tokens: frozenset[str],
        viewer_tokens: frozenset[str],
        faults: APIFaults,
    ) -> None:
        super().__init__(port, _Handler)
        self.state = state
        self.admin_tokens = admin_tokens
        self.viewer_tokens = viewer_tokens
        self.faults = faults


class ControlPlaneServer(BackgroundServer):
    """The v1alpha1 inference API on ``127.0.0.1`` in a background thread.

    Its :attr:`url` (``http://127.0.0.1:<port>``) is the value of ``COREWEAVE_API_URL``.

    Args:
        state: the resources and rules it serves.
        tokens: bearer tokens with the Inference Admin role.
        viewer_tokens: bearer tokens with the Inference Viewer role (reads only).
        port: the port (a free one when 0).
        faults: armed API faults (a fresh, empty set when ``None``).
    """

    def __init__(
        self,
        state: ControlPlaneState,
        tokens: Iterable[str],
        *,
        viewer_tokens: Iterable[str] = (),
        port: int = 0,
        faults: APIFaults | None = None,
    ) -> None:
        self.state = state
        self.faults = faults or APIFaults()
        server = _Server(port, state, frozenset(tokens), frozenset(viewer_tokens), self.faults)
        super().__init__(server, "cwtrain-local-api")
