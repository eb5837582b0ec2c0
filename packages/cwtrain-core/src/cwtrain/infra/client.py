"""``InferenceClient``: the CoreWeave Dedicated Inference API v1alpha1 over REST/JSON.

One method per endpoint of service-api.md section 2, each returning frozen models
(:mod:`cwtrain.infra.models`)::

    from cwtrain.infra import InferenceClient

    with InferenceClient() as api:               # token from COREWEAVE_API_TOKEN / CW_API_TOKEN
        dep = api.get_deployment("3b1d2c54-...")
        for hot_load in api.list_hot_loads(dep.id):   # lazy, newest first
            print(hot_load.identity, hot_load.state.name)

Configuration (explicit argument, then environment variable, then default):

* origin: ``base_url=`` / ``--base-url``, ``COREWEAVE_API_URL``, ``https://api.coreweave.com``;
* token: ``token=`` / ``--token``, ``COREWEAVE_API_TOKEN``, ``CW_API_TOKEN``;
* extra headers: ``headers=``, else ``CWTRAIN_API_HEADERS`` (a JSON object, applied last,
  may replace ``Authorization``; with it a token is optional);
* TLS: verified unless ``verify=False`` or ``CWTRAIN_API_INSECURE=1``.

Errors: the service's code (Connect string or gRPC number) picks the
:class:`~cwtrain.errors.APIError` subclass; connection failures and non-JSON 2xx bodies
raise :class:`~cwtrain.errors.TransportError`, a branch of its own (the service never
answered, so it is not an ``APIError``). Tokens and header values never appear in logs
or errors.

Retries (section 10): reads and the creates that carry a client-chosen id are retried
on transport errors, 429 (honouring ``Retry-After``, capped at 30 s), ``unavailable``,
``deadline_exceeded`` and HTTP 500/502/503/504 unless the code is ``unimplemented``:
``max_retries`` attempts in all, sleeping ``base x (1 + U[0, 0.25))`` with ``base``
0.5 s doubling up to 8 s. DELETE and cancel are sent once.

Idempotent creates (section 7): the id is chosen (or taken from the request) and
logged before the first POST and reused on every retry. When the service answers
``already_exists``, the client fetches that id and returns it if its spec matches the
request (an earlier attempt whose response was lost created it); otherwise it raises
:class:`~cwtrain.errors.AlreadyExistsError` naming both.
"""

from __future__ import annotations

import logging
import random
import re
import ssl
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from cwtrain._version import USER_AGENT
from cwtrain.closing import Closing
from cwtrain.config import env_bool, env_str, environ_or
from cwtrain.errors import (
    AlreadyExistsError,
    APIError,
    ConfigError,
    NotFoundError,
    TransportError,
    UsageError,
    api_error,
    mask_url_userinfo,
)
from cwtrain.infra.enums import PromptCachePolicy, SnapshotType
from cwtrain.infra.models import Deployment, Gateway, HotLoad, HotLoadReplica, IncrementalSnapshotMetadata
from cwtrain.jsondoc import JSONDepthError, load_json

__all__ = [
    "API_PATH",
    "DEFAULT_BASE_URL",
    "TOKEN_ENV_VAR",
    "TOKEN_ENV_VARS",
    "InferenceClient",
    "token_from_env",
]

log = logging.getLogger(__name__)

#: The API origin used when neither an argument nor ``COREWEAVE_API_URL`` gives one.
DEFAULT_BASE_URL = "https://api.coreweave.com"
#: Path prefix of the inference API.
API_PATH = "/v1alpha1/inference"
#: The first-choice token variable.
TOKEN_ENV_VAR = "COREWEAVE_API_TOKEN"
#: Token variables in the order they are read.
TOKEN_ENV_VARS = ("COREWEAVE_API_TOKEN", "CW_API_TOKEN")

_GRPC_CODES = {
    1: "canceled",
    2: "unknown",
    3: "invalid_argument",
    4: "deadline_exceeded",
    5: "not_found",
    6: "already_exists",
    7: "permission_denied",
    8: "resource_exhausted",
    9: "failed_precondition",
    10: "aborted",
    11: "out_of_range",
    12: "unimplemented",
    13: "internal",
    14: "unavailable",
    15: "data_loss",
    16: "unauthenticated",
}
_HTTP_CODES = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "already_exists",
    412: "failed_precondition",
    429: "resource_exhausted",
    501: "unimplemented",
    503: "unavailable",
}
_PAGE_SIZE = 1000
_RETRY_AFTER_CAP = 30.0
#: RFC 9110 header names (tchar).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _unsendable(value: str) -> int | None:
    """Position of the first character an HTTP header value cannot carry (not printable ASCII), else ``None``."""
    return next((i for i, c in enumerate(value) if not " " <= c <= "~"), None)


def _check_headers(token: str | None, token_source: str, extra: Mapping[str, str]) -> None:
    """Refuse header names and values httpx could not send, without echoing a value (they are secrets)."""
    if token:
        position = _unsendable(token)
        if position is not None:
            raise ConfigError(
                f"the API token from {token_source} has a character an HTTP header cannot carry at position "
                f"{position + 1} (only printable ASCII is allowed); check the value"
            )
    for name, value in extra.items():
        if not _HEADER_NAME.fullmatch(name):
            raise ConfigError(
                f"API header name {name!r} (CWTRAIN_API_HEADERS or headers=) is not a valid HTTP header name"
            )
        position = _unsendable(value)
        if position is not None:
            raise ConfigError(
                f"the value of API header {name!r} (CWTRAIN_API_HEADERS or headers=) has a character an HTTP "
                f"header cannot carry at position {position + 1} (only printable ASCII is allowed)"
            )


def _check_origin(origin: str) -> str:
    """The origin, refused unless it is an http(s) URL with a host (a ConfigError, never httpx's own)."""
    try:
        url = httpx.URL(origin)
        valid = url.scheme in ("http", "https") and bool(url.host)
    except (httpx.InvalidURL, ValueError, TypeError):
        valid = False
    if not valid:
        raise ConfigError(
            f"API origin {mask_url_userinfo(origin)!r} is not an http(s) URL with a host; "
            "check --base-url / COREWEAVE_API_URL"
        )
    return origin


def token_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The first non-blank, stripped value of ``COREWEAVE_API_TOKEN``, then ``CW_API_TOKEN``."""
    for name in TOKEN_ENV_VARS:
        value = env_str(name, environ)
        if value:
            return value
    return None


def _token_variable(environ: Mapping[str, str] | None) -> str:
    """The variable :func:`token_from_env` took the token from (for messages)."""
    return next((name for name in TOKEN_ENV_VARS if env_str(name, environ)), TOKEN_ENV_VARS[0])


def headers_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``CWTRAIN_API_HEADERS``: a JSON object of extra headers, values coerced to strings.

    Raises:
        ConfigError: not JSON, or not an object (the value, usually a secret, is not echoed).
    """
    text = env_str("CWTRAIN_API_HEADERS", environ)
    if text is None:
        return {}
    try:
        value = load_json(text)
    except ValueError as exc:
        reason = f" ({exc})" if isinstance(exc, JSONDepthError) else ""
        raise ConfigError(
            f"CWTRAIN_API_HEADERS is not valid JSON{reason} (expected an object of header names)"
        ) from None
    if not isinstance(value, dict):
        raise ConfigError("CWTRAIN_API_HEADERS must be a JSON object of header names to values")
    return {str(k): str(v) for k, v in value.items()}


def _code_of(body: Any, status: int) -> str:
    code = body.get("code") if isinstance(body, Mapping) else None
    if isinstance(code, bool):
        code = None
    if isinstance(code, int) or (isinstance(code, str) and code.strip().isdigit()):
        return _GRPC_CODES.get(int(code), "unknown")
    if isinstance(code, str) and code.strip():
        return code.strip().lower()
    if status in _HTTP_CODES:
        return _HTTP_CODES[status]
    return "internal" if status >= 500 else "unknown"


def _error_from_response(response: httpx.Response) -> APIError:
    try:
        body: Any = load_json(response.content)
    except ValueError:
        body = None
    if isinstance(body, Mapping):
        message = str(body.get("message") or "")
        details = body.get("details") if isinstance(body.get("details"), list) else None
    else:
        message = " ".join(response.text.split())[:500]
        details = None
    if not message:
        message = f"HTTP {response.status_code}"
    return api_error(_code_of(body, response.status_code), message, http_status=response.status_code, details=details)


def _retryable(error: APIError | TransportError) -> bool:
    return error.transient or error.http_status == 429


def _retry_after(response: httpx.Response | None) -> float | None:
    if response is None:
        return None
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return min(_RETRY_AFTER_CAP, max(0.0, float(value)))
    except ValueError:
        return None


class InferenceClient(Closing):
    """Client of the Dedicated Inference API v1alpha1 (gateways, deployments, hot-loads).

    Args:
        token: bearer token; else ``COREWEAVE_API_TOKEN``, then ``CW_API_TOKEN``.
        base_url: API origin; else ``COREWEAVE_API_URL``, else :data:`DEFAULT_BASE_URL`.
        timeout: seconds per request.
        max_retries: attempts per retryable call, the first included.
        transport: an httpx transport (tests pass ``httpx.MockTransport``).
        user_agent: the ``User-Agent`` header.
        headers: extra headers applied last (else ``CWTRAIN_API_HEADERS``); may replace
            ``Authorization``.
        verify: TLS verification, or a CA bundle path; ``CWTRAIN_API_INSECURE=1`` turns it off.

    Raises:
        ConfigError: (a ``ValueError``) neither a token nor an ``Authorization`` header.
    """

    def __init__(
        self,
        token: str | None = None,
        *,
        base_url: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 4,
        transport: httpx.BaseTransport | None = None,
        user_agent: str = USER_AGENT,
        headers: Mapping[str, str] | None = None,
        verify: bool | str = True,
    ) -> None:
        environ = environ_or(None)
        origin = (base_url or "").strip() or env_str("COREWEAVE_API_URL", environ) or DEFAULT_BASE_URL
        self.base_url = _check_origin(origin).rstrip("/")
        self._shown_url = mask_url_userinfo(self.base_url)
        self.timeout = timeout
        self.max_retries = max(1, int(max_retries))
        #: Sleep function between retries (tests replace it).
        self.sleep: Callable[[float], None] = time.sleep
        #: First backoff in seconds; doubles up to :attr:`backoff_max`.
        self.backoff_base = 0.5
        self.backoff_max = 8.0
        resolved = (token or "").strip() or token_from_env(environ)
        extra = {str(k): str(v) for k, v in headers.items()} if headers is not None else headers_from_env(environ)
        token_source = "--token / token=" if (token or "").strip() else _token_variable(environ)
        _check_headers(resolved, token_source, extra)
        if not resolved and not extra:
            raise ConfigError(
                "no API token: pass --token or set COREWEAVE_API_TOKEN (or CW_API_TOKEN); "
                "or give the headers to send in CWTRAIN_API_HEADERS"
            )
        # Values long enough to be secrets (masking one-letter values would garble every message).
        self._secrets = [v for v in (resolved or "", *extra.values()) if len(v) >= 8]
        all_headers = {"Accept": "application/json", "User-Agent": user_agent}
        if resolved:
            all_headers["Authorization"] = f"Bearer {resolved}"
        for key, value in extra.items():
            for existing in [k for k in all_headers if k.lower() == key.lower()]:
                del all_headers[existing]
            all_headers[key] = value
        if verify is True and env_bool("CWTRAIN_API_INSECURE", False, environ):
            log.warning("CWTRAIN_API_INSECURE is set: TLS certificates of the API are not verified")
            verify = False
        elif verify is False:
            log.warning("verify=False: TLS certificates of the API at %s are not verified (development only)", origin)
        tls: bool | ssl.SSLContext = verify if isinstance(verify, bool) else ssl.create_default_context(cafile=verify)
        self._http = httpx.Client(
            base_url=self.base_url + API_PATH,
            headers=all_headers,
            timeout=timeout,
            transport=transport,
            verify=tls,
        )

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __repr__(self) -> str:
        return f"InferenceClient(base_url={self._shown_url!r})"

    def _mask(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _send(self, method: str, path: str, params: Any, body: Any) -> Any:
        """One attempt: the parsed JSON body, else an :class:`APIError` or a :class:`TransportError`."""
        try:
            response = self._http.request(method, path, params=params, json=body)
        except httpx.HTTPError as exc:
            raise TransportError(
                self._mask(
                    f"cannot reach the API: {method} {self._shown_url}{API_PATH}{path} failed ({exc or type(exc).__name__}); "
                    "check --base-url / COREWEAVE_API_URL and the network"
                )
            ) from None
        log.debug("%s %s -> HTTP %d", method, path, response.status_code)
        if response.status_code >= 400:
            error = _error_from_response(response)
            error.retry_after = _retry_after(response)
            raise error
        if not response.content.strip():
            return {}
        try:
            return load_json(response.content)
        except ValueError as exc:
            raise TransportError(
                f"{method} {path} answered HTTP {response.status_code} with a body that is not JSON ({exc})",
                http_status=response.status_code,
            ) from None

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        body: Any = None,
        retry: bool = True,
    ) -> dict[str, Any]:
        attempts = self.max_retries if retry else 1
        delay = self.backoff_base
        for attempt in range(1, attempts + 1):
            try:
                result = self._send(method, path, params, body)
            except (APIError, TransportError) as error:
                if attempt >= attempts or not _retryable(error):
                    raise
                wait = delay * (1 + random.uniform(0, 0.25))
                hinted = error.retry_after if isinstance(error, APIError) else None
                if hinted is not None:
                    wait = max(wait, hinted)
                log.info("%s %s: %s; retry %d/%d in %.1fs", method, path, error, attempt, attempts - 1, wait)
                self.sleep(wait)
                delay = min(delay * 2, self.backoff_max)
                continue
            return result if isinstance(result, dict) else {"value": result}
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ gateways

    def list_gateways(self, *, updated_after: datetime | None = None) -> list[Gateway]:
        """All gateways of the organisation."""
        params = {"updatedAfter": updated_after.isoformat()} if updated_after else None
        data = self._request("GET", "/gateways", params=params)
        return [Gateway.from_api(item) for item in _items(data, "gateways")]

    def get_gateway(self, gateway_id: str) -> Gateway:
        """One gateway; :class:`~cwtrain.errors.NotFoundError` when it does not exist."""
        return Gateway.from_api(self._request("GET", "/gateways/" + _resource(gateway_id, "gateway")))

    def create_gateway(self, request: Mapping[str, Any], *, gateway_id: str | None = None) -> Gateway:
        """Create a gateway from a CreateGatewayRequest body, idempotently.

        Args:
            request: ``name``, ``zones``, one auth and one routing block; an ``id`` in it is used.
            gateway_id: the id to create (else the request's, else a new UUID4).
        """
        return self._create("gateway", request, gateway_id, Gateway.from_api, self.get_gateway, self.list_gateways)

    def delete_gateway(self, gateway_id: str) -> None:
        """Send one DELETE (see :func:`cwtrain.infra.lifecycle.delete_gateway` for the wait)."""
        self._request("DELETE", "/gateways/" + _resource(gateway_id, "gateway"), retry=False)

    def get_gateway_parameters(self) -> dict[str, Any]:
        """The valid gateway parameters (zones), as the API returns them."""
        return self._request("GET", "/gateways/parameters")

    # --------------------------------------------------------------- deployments

    def list_deployments(
        self, gateway_id: str | None = None, *, updated_after: datetime | None = None
    ) -> list[Deployment]:
        """All deployments, or those behind one gateway."""
        params: dict[str, str] = {}
        if gateway_id:
            params["parentGatewayId"] = gateway_id
        if updated_after:
            params["updatedAfter"] = updated_after.isoformat()
        data = self._request("GET", "/deployments", params=params or None)
        return [Deployment.from_api(item) for item in _items(data, "deployments")]

    def get_deployment(self, deployment_id: str) -> Deployment:
        """One deployment; :class:`~cwtrain.errors.NotFoundError` when it does not exist."""
        return Deployment.from_api(self._request("GET", "/deployments/" + _resource(deployment_id, "deployment")))

    def create_deployment(self, request: Mapping[str, Any], *, deployment_id: str | None = None) -> Deployment:
        """Create a deployment from a CreateDeploymentRequest body, idempotently.

        Prefer :func:`cwtrain.infra.lifecycle.create_deployment`, which also refuses
        placeholders and checks the gateways' zones.

        Args:
            request: the CreateDeploymentRequest; an ``id`` in it is used.
            deployment_id: the id to create (else the request's, else a new UUID4).
        """
        return self._create(
            "deployment", request, deployment_id, Deployment.from_api, self.get_deployment, self.list_deployments
        )

    def delete_deployment(self, deployment_id: str) -> None:
        """Send one DELETE (see :func:`cwtrain.infra.lifecycle.delete_deployment` for the wait)."""
        self._request("DELETE", "/deployments/" + _resource(deployment_id, "deployment"), retry=False)

    def get_deployment_parameters(self, gateway_ids: Sequence[str] | None = None) -> dict[str, Any]:
        """Allowed ``runtime.engine``/``version``/``engineEnv`` values, as the API returns them."""
        params = [("gatewayIds", g) for g in gateway_ids or ()]
        return self._request("GET", "/deployments/parameters", params=params or None)

    def _create[R: (Gateway, Deployment)](
        self,
        kind: str,
        request: Mapping[str, Any],
        resource_id: str | None,
        from_api: Callable[[dict[str, Any]], R],
        get: Callable[[str], R],
        list_all: Callable[[], Sequence[R]],
    ) -> R:
        """POST ``/{kind}s`` under the chosen id; an existing one of the same name is adopted."""
        body = dict(request)
        body["id"] = resource_id or str(body.get("id") or "") or str(uuid.uuid4())
        log.info("creating %s %r with id %s", kind, body.get("name"), body["id"])
        try:
            return from_api(self._request("POST", f"/{kind}s", body=body))
        except AlreadyExistsError as error:
            return self._adopt(kind, body, error, get, list_all)

    def _adopt[R: (Gateway, Deployment)](
        self,
        kind: str,
        body: Mapping[str, Any],
        error: AlreadyExistsError,
        get: Callable[[str], R],
        list_all: Callable[[], Sequence[R]],
    ) -> R:
        rid, name = str(body["id"]), str(body.get("name") or "")
        try:
            existing = get(rid)
        except NotFoundError:
            owner = ""
            try:
                owner = next((r.id for r in list_all() if r.name == name), "")
            except (APIError, TransportError) as exc:
                log.debug("could not list %ss to name the owner of %r: %s", kind, name, exc)
            raise AlreadyExistsError(
                "already_exists",
                f"the {kind} name {name!r} belongs to another {kind}"
                + (f" ({owner})" if owner else "")
                + f"; choose another name or delete that {kind}",
                http_status=error.http_status,
                details=error.details,
            ) from None
        if existing.name == name:
            log.info("%s %s already exists with the same name (an earlier attempt created it); using it", kind, rid)
            return existing
        raise AlreadyExistsError(
            "already_exists",
            f"{kind} id {rid} is taken by {kind} {existing.name!r}, not {name!r}; choose another id",
            http_status=error.http_status,
            details=error.details,
        )

    # ----------------------------------------------------------------- hot-loads

    def create_hot_load(
        self,
        deployment_id: str,
        identity: str,
        *,
        snapshot_type: SnapshotType = SnapshotType.FULL,
        incremental: IncrementalSnapshotMetadata | None = None,
        prompt_cache_policy: PromptCachePolicy | None = PromptCachePolicy.UNSPECIFIED,
        hot_load_id: str | None = None,
    ) -> HotLoad:
        """Create a hot-load, idempotently (the same ``hotLoadId`` on every retry).

        Args:
            deployment_id: the target deployment.
            identity: the snapshot identity (one path segment under the deployment's prefix).
            snapshot_type: FULL or INCREMENTAL.
            incremental: required for INCREMENTAL, refused for FULL.
            prompt_cache_policy: UNSPECIFIED or ``None`` omits the field (server default PRESERVE).
            hot_load_id: the permanent id; a new UUID4 when not given.

        Raises:
            UsageError: (a ``ValueError``) a type/metadata mismatch, before any request.
            HotLoadInProgressError: another hot-load is unfinished (see ``HotLoader.trigger``).
            AlreadyExistsError: the id is taken by a hot-load with another spec.
        """
        snapshot_type = SnapshotType.parse(snapshot_type)
        if snapshot_type is SnapshotType.UNSPECIFIED:
            raise UsageError("a hot-load needs a snapshot type: FULL or INCREMENTAL")
        if snapshot_type is SnapshotType.INCREMENTAL and incremental is None:
            raise UsageError(
                f"an INCREMENTAL hot-load of {identity!r} needs incremental metadata (the previous snapshot identity)"
            )
        if snapshot_type is SnapshotType.FULL and incremental is not None:
            raise UsageError(f"a FULL hot-load of {identity!r} takes no incremental metadata (no previous identity)")
        if not deployment_id or not identity:
            raise UsageError("a hot-load needs a deployment id and a snapshot identity")
        body: dict[str, Any] = {
            "deploymentId": deployment_id,
            "hotLoadId": hot_load_id or str(uuid.uuid4()),
            "identity": identity,
            "type": snapshot_type.wire,
        }
        if incremental is not None:
            body["incrementalSnapshotMetadata"] = incremental.to_wire()
        policy = PromptCachePolicy.parse(prompt_cache_policy)
        if policy is not PromptCachePolicy.UNSPECIFIED:
            body["promptCachePolicy"] = policy.wire
        log.info(
            "creating %s hot-load %s of %r on deployment %s",
            snapshot_type.name,
            body["hotLoadId"],
            identity,
            deployment_id,
        )
        try:
            return HotLoad.from_api(self._request("POST", "/hotLoads", body=body))
        except AlreadyExistsError as error:
            existing = self.get_hot_load(body["hotLoadId"])
            problems = _hot_load_mismatch(existing, deployment_id, identity, snapshot_type, incremental, policy)
            if problems:
                raise AlreadyExistsError(
                    "already_exists",
                    f"hot-load ID conflict: {body['hotLoadId']} exists with another spec ({'; '.join(problems)})",
                    http_status=error.http_status,
                    details=error.details,
                ) from None
            log.info("hot-load %s already exists with the same spec (an earlier attempt); using it", existing.id)
            return existing

    def get_hot_load(self, hot_load_id: str) -> HotLoad:
        """One hot-load."""
        return HotLoad.from_api(self._request("GET", f"/hotLoads/{_seg(hot_load_id)}"))

    def list_hot_loads(self, deployment_id: str | None = None, *, page_size: int = _PAGE_SIZE) -> Iterator[HotLoad]:
        """Hot-loads, newest first, fetched page by page only as far as the caller iterates.

        Args:
            deployment_id: only this deployment's (also filtered client-side by ``spec.deploymentId``).
            page_size: ``maxPageSize`` (the service caps it at 1000).
        """
        params: dict[str, Any] = {"maxPageSize": page_size}
        if deployment_id:
            params["parentDeploymentId"] = deployment_id
        for item in self._pages("/hotLoads", params, "hotLoads"):
            hot_load = HotLoad.from_api(item)
            if deployment_id and hot_load.deployment_id and hot_load.deployment_id != deployment_id:
                continue
            yield hot_load

    def list_hot_load_replicas(self, hot_load_id: str, *, page_size: int = _PAGE_SIZE) -> list[HotLoadReplica]:
        """Every replica of a hot-load (all pages)."""
        items = self._pages(f"/hotLoads/{_seg(hot_load_id)}/replicas", {"maxPageSize": page_size}, "replicas")
        return [HotLoadReplica.from_api(item) for item in items]

    def cancel_hot_load(self, hot_load_id: str) -> HotLoad:
        """Ask to cancel a hot-load (never retried; the service answers ``unimplemented`` today)."""
        return HotLoad.from_api(self._request("POST", f"/hotLoads/{_seg(hot_load_id)}:cancel", body={}, retry=False))

    def _pages(self, path: str, params: dict[str, Any], key: str) -> Iterator[Mapping[str, Any]]:
        seen: set[str] = set()
        token = ""
        while True:
            query = dict(params)
            if token:
                query["pageToken"] = token
            data = self._request("GET", path, params=query)
            for item in data.get(key) or []:
                if isinstance(item, Mapping):
                    yield item
            token = str(data.get("nextPageToken") or "")
            if not token:
                return
            if token in seen:
                raise APIError("internal", f"GET {path} repeated the page token {token!r}; stopping")
            seen.add(token)


def _seg(value: str) -> str:
    """One URL path segment, percent-encoded: ``?``, ``#``, ``%`` and ``:`` in an id stay in the id.

    Ids never contain ``/`` and are never ``.`` or ``..``: those are refused rather than escaped.
    """
    text = str(value).strip()
    if not text or "/" in text or text in (".", ".."):
        raise UsageError(f"{value!r} is not a valid resource id")
    return quote(text, safe="")


def _resource(value: str, kind: str) -> str:
    """:func:`_seg` for a deployment or gateway id: ``parameters`` names their parameters endpoint."""
    if str(value).strip() == "parameters":
        raise UsageError(
            f"'parameters' is not a {kind} id: GET /{kind}s/parameters is the parameters endpoint "
            f"(cwtrain {kind} parameters)"
        )
    return _seg(value)


def _items(data: Mapping[str, Any], fallback: str) -> list[Mapping[str, Any]]:
    items = data.get("items")
    if items is None:
        items = data.get(fallback)
    return [i for i in items or [] if isinstance(i, Mapping)]


def _hot_load_mismatch(
    existing: HotLoad,
    deployment_id: str,
    identity: str,
    snapshot_type: SnapshotType,
    incremental: IncrementalSnapshotMetadata | None,
    policy: PromptCachePolicy,
) -> list[str]:
    problems = []
    if existing.deployment_id != deployment_id:
        problems.append(f"deployment {existing.deployment_id} != {deployment_id}")
    if existing.identity != identity:
        problems.append(f"identity {existing.identity!r} != {identity!r}")
    if existing.type is not snapshot_type:
        problems.append(f"type {existing.type.name} != {snapshot_type.name}")
    if existing.incremental_snapshot_metadata != incremental:
        problems.append(
            f"incremental metadata {existing.previous_identity!r} != {getattr(incremental, 'previous_snapshot_identity', None)!r}"
        )
    wanted = PromptCachePolicy.PRESERVE if policy is PromptCachePolicy.UNSPECIFIED else policy
    if existing.effective_prompt_cache_policy is not wanted:
        problems.append(f"prompt cache policy {existing.effective_prompt_cache_policy.name} != {wanted.name}")
    return problems
