"""The inference gateway: an OpenAI-compatible front door routing across engine replicas.

One :class:`GatewayServer` per gateway resource, on its own loopback port; its URL is the
gateway's ``status.endpoints[0]``. It serves

- ``GET /v1/models``: a card for the ``spec.model.name`` of every deployment attached to the
  gateway (the card a replica of it gives, vLLM's; a minimal one while none answers);
- vLLM's routes outside ``/v1``: ``GET /health`` and ``GET``/``POST /ping`` (200 with an empty
  body when every model of the gateway, or the one routed to, has a routable replica; 503
  otherwise), ``GET /version`` and ``GET /metrics`` (relayed to a replica of the model routed
  to, else of the first model by name);
- ``POST /v1/*`` (``/v1/completions``, ``/v1/chat/completions``) and vLLM's ``POST /tokenize``
  and ``POST /detokenize`` at the root: the deployment is chosen by the gateway's routing
  (``bodyBasedRouting``: the body's ``model``; ``headerBasedRouting``: the named header;
  ``pathBasedRouting``: ``/<model>/v1/...``, ``/<model>/tokenize``), then the request goes to
  one of that deployment's routable replicas, unchanged (a ``Transfer-Encoding: chunked``
  body is read whole and sent on with its length), and the replica's answer comes back
  unchanged (its ``x-cwtrain-snapshot-identity`` header included). A stream (server-sent
  events, ``text/event-stream``) is relayed as it arrives, event by event; any other answer
  is read whole first. A replica that does not answer, or whose whole answer breaks off, is
  skipped for the next one (503 when none is left).

A stream that breaks off (the replica died, the connection dropped, it ended without
``data: [DONE]``) is never ended as if it were whole: the events relayed so far stand, a
half-sent event is dropped, and the stream ends as vLLM ends a stream whose generation
failed: ``data: {"error": {"message", "type": "InternalServerError", "param": null,
"code": 500}}`` and then ``data: [DONE]``. OpenAI clients raise on that event.

Auth, as vLLM's ``--api-key`` guards its server: only paths under ``/v1`` need a key
(``/health``, ``/ping``, ``/version``, ``/metrics``, ``/tokenize`` and ``/detokenize`` do
not; with path routing, the path after ``/<model>``). ``coreWeaveAuth`` gateways want
``Authorization: Bearer <the stack's API token>``; ``weightsAndBiasesAuth`` gateways accept
any non-empty bearer key. The key is checked before a byte of the body is read, and bodies
are bounded (:data:`MAX_BODY_BYTES`, 413; :mod:`cwtrain.serving`). The gateway speaks
to replicas with the replicas' own token (``replica_token``), never with the caller's key.
Errors use OpenAI's body ``{"error": {"message", "type", "code"}}`` with the HTTP status as
a number in ``code`` (``"model_not_found"`` for an unknown model, as OpenAI names it).
"""

from __future__ import annotations

import hmac
import http.client
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from cwtrain.jsondoc import load_json
from cwtrain.local.engine.completions import SSE_DONE, error_body, sse_event
from cwtrain.local.loopback import LoopbackHTTPServer
from cwtrain.serving import DEFAULT_MAX_BODY_BYTES, BackgroundServer, JSONHandler, RequestRefused

__all__ = ["MAX_BODY_BYTES", "PROBE_ROUTES", "ROOT_ROUTES", "GatewayServer", "Router"]

log = logging.getLogger("cwtrain.local.engine.gateway")

#: ``router(gateway_id) -> (gateway spec or None, {model name: [replica URL, ...]})``.
Router = Callable[[str], tuple[Mapping[str, Any] | None, Mapping[str, list[str]]]]

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}
#: Engine routes outside ``/v1`` that the gateway relays (vLLM's tokenizer endpoints).
ROOT_ROUTES = ("/tokenize", "/detokenize")
#: vLLM's routes outside ``/v1`` for probes and scrapers; like every path outside ``/v1``, no key needed.
PROBE_ROUTES = ("/health", "/ping", "/version", "/metrics")
_RELAY_READ = 64 * 1024
_EVENT_ENDS = (b"\n\n", b"\r\n\r\n")
_DONE_LINE = re.compile(rb"^data: ?\[DONE\]\r?$", re.MULTILINE)
#: The longest request body the gateway reads (and relays; replicas take as much).
MAX_BODY_BYTES = DEFAULT_MAX_BODY_BYTES


class _Handler(JSONHandler):
    server: _Server
    max_body_bytes = MAX_BODY_BYTES
    _routing: tuple[Mapping[str, Any], Mapping[str, list[str]]] = ({}, {})

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("gateway %s: " + format, self.server.gateway_id, *args)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> None:
        body = {"error": {"message": message, "type": kind, "code": code or status}}
        self.send_json(status, body, {"Retry-After": "1"} if status == 503 else None)

    def refusal_body(self, error: RequestRefused) -> Any:
        kind = "authentication_error" if error.status == 401 else "server_error" if error.status >= 500 else None
        return {"error": {"message": error.message, "type": kind or "invalid_request_error", "code": error.status}}

    def _route(self, spec: Mapping[str, Any]) -> tuple[str | None, str]:
        """The model named by the path (path routing) and the path after it."""
        path = urlsplit(self.path).path
        if "pathBasedRouting" in spec:
            parts = path.split("/", 2)
            if len(parts) == 3 and parts[1]:
                return parts[1], "/" + parts[2]
        return None, path

    def refuse(self, error: RequestRefused, headers: Mapping[str, str] | None = None) -> None:
        super().refuse(error, {"Retry-After": "1"} if error.status == 503 else headers)

    def authenticate(self) -> None:
        """The gateway must serve and the bearer key must be accepted (before any body byte is read)."""
        spec, models = self.server.router(self.server.gateway_id)
        if spec is None:
            raise RequestRefused(503, "gateway is not serving", code="503")
        self._routing = (spec, models)
        if not (urlsplit(self.path).path.startswith("/v1") or self._route(spec)[1].startswith("/v1")):
            return  # as vLLM's --api-key: only /v1 is guarded (with path routing, /<model>/v1 too)
        header = self.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise RequestRefused(401, "missing bearer token (Authorization: Bearer <key>)", code="401")
        if "coreWeaveAuth" in spec and not any(
            hmac.compare_digest(key.encode(), token.encode()) for token in self.server.tokens
        ):
            raise RequestRefused(401, "invalid API key", code="401")

    def _body(self) -> bytes | None:
        """The authenticated request's body, or ``None`` once the refusal was sent."""
        try:
            return self.read_body()
        except RequestRefused as exc:
            self.refuse(exc)
            return None

    def do_GET(self) -> None:
        if self._body() is None:
            return
        spec, models = self._routing
        path = urlsplit(self.path).path.rstrip("/")
        if path.endswith("/v1/models"):
            self.send_json(200, {"object": "list", "data": [self._card(m, models[m]) for m in sorted(models)]})
            return
        model, route = self._route(spec)
        if route in PROBE_ROUTES:
            self._probe(route, model, models)
            return
        self._error(404, f"no route for GET {path}")

    def _probe(self, route: str, model: str | None, models: Mapping[str, list[str]]) -> None:
        """``/health`` and ``/ping`` answered here; ``/version`` and ``/metrics`` relayed to a replica."""
        if model is None and "headerBasedRouting" in self._routing[0]:
            model = self.headers.get(str(self._routing[0]["headerBasedRouting"].get("headerName", ""))) or None
        if model is not None and model not in models:
            self._error(404, f"the model {model!r} does not exist on this gateway", code="model_not_found")
            return
        chosen = [model] if model is not None else sorted(models)
        if route in ("/health", "/ping"):
            down = [m for m in chosen if not models[m]]
            if down or not chosen:
                self._error(503, f"no replica of {', '.join(down) or 'any model'} is ready", "server_error")
            else:
                self.send_body(200, b"", content_type="application/json")
            return
        ready = [m for m in chosen if models[m]]
        if not ready:
            self._error(503, "no replica is ready; retry shortly", "server_error")
            return
        self._proxy(models[ready[0]], route, None, method="GET")

    def _card(self, model: str, replicas: list[str]) -> dict[str, Any]:
        """The model's card as a replica gives it, else a minimal vLLM-shaped one."""
        for url in replicas[:2]:
            parts = urlsplit(url)
            conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=5)
            try:
                conn.request("GET", "/v1/models", headers=self._replica_auth())
                response = conn.getresponse()
                doc = load_json(response.read()) if response.status == 200 else {}
                for card in doc.get("data") or []:
                    if isinstance(card, dict) and card.get("id") == model:
                        return card
            except (OSError, http.client.HTTPException, ValueError):
                continue
            finally:
                conn.close()
        created = int(self.server.started)
        return {"id": model, "object": "model", "created": created, "owned_by": "vllm", "root": model, "parent": None}

    def do_POST(self) -> None:
        raw = self._body()
        if raw is None:
            return
        spec, models = self._routing
        path = urlsplit(self.path).path
        model, route = self._route(spec)
        if route == "/ping":  # vLLM answers POST /ping as GET
            self._probe(route, model, models)
            return
        model = self._model(spec, path, raw)
        if model is None:
            return
        if "pathBasedRouting" in spec:
            path = path[len(model) + 1 :]
        if not path.startswith("/v1/") and path not in ROOT_ROUTES:
            self._error(404, f"no route for POST {path}")
            return
        if model not in models:
            self._error(404, f"the model {model!r} does not exist on this gateway", code="model_not_found")
            return
        self._proxy(models[model], path, raw)

    def _replica_auth(self) -> dict[str, str]:
        token = self.server.replica_token
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _model(self, spec: Mapping[str, Any], path: str, raw: bytes) -> str | None:
        if "headerBasedRouting" in spec:
            header = str(spec["headerBasedRouting"].get("headerName", ""))
            value = self.headers.get(header)
            if not value:
                self._error(400, f"missing routing header {header}")
            return value
        if "pathBasedRouting" in spec:
            parts = path.split("/")
            if len(parts) < 3 or not parts[1]:
                self._error(404, "path routing expects /<model>/v1/...")
                return None
            return parts[1]
        try:
            body = load_json(raw or b"{}")
        except ValueError as exc:
            self._error(400, f"request body is not JSON: {exc}")
            return None
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str) or not model:
            self._error(400, "the request body needs a 'model'")
            return None
        return model

    def _proxy(self, replicas: list[str], path: str, raw: bytes | None, *, method: str = "POST") -> None:
        if not replicas:
            self._error(503, "no replica of this model is ready; retry shortly", "server_error")
            return
        query = urlsplit(self.path).query
        target = path + (f"?{query}" if query else "")
        headers = {"Content-Type": self.headers.get("Content-Type", "application/json"), **self._replica_auth()}
        last = ""
        for url in replicas:
            parts = urlsplit(url)
            conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=600)
            try:
                conn.request(method, target, body=raw, headers=headers)
                response = conn.getresponse()
                content_type = response.getheader("Content-Type") or "application/json"
                streamed = content_type.split(";")[0].strip().lower() == "text/event-stream"
                body = None if streamed else response.read()  # a whole answer: all of it, or an error
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                last = f"{url}: {exc or type(exc).__name__}"
                log.info("gateway: replica %s did not answer whole (%s); trying the next one", url, last)
                continue
            relayed = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_HEADERS | {"content-type"}}
            try:
                if body is not None:
                    self.send_body(response.status, body, content_type=content_type, headers=relayed)
                else:
                    events = _relay_events(response, url)
                    self.send_stream(response.status, events, content_type=content_type, headers=relayed)
            finally:
                conn.close()
            return
        self._error(503, f"no replica answered ({last})", "server_error")


def _event_end(data: bytes) -> int:
    """Where the last whole event of ``data`` ends (0: no whole event yet)."""
    return max((data.rfind(end) + len(end) for end in _EVENT_ENDS if end in data), default=0)


def _relay_events(response: http.client.HTTPResponse, url: str) -> Iterator[bytes]:
    """A stream's whole events as they arrive; a stream that breaks off before ``data: [DONE]``
    ends with vLLM's error event and ``[DONE]`` (a half-sent event is dropped)."""
    pending = b""
    done = False
    try:
        while data := response.read1(_RELAY_READ):
            pending += data
            cut = _event_end(pending)
            if cut:
                events, pending = pending[:cut], pending[cut:]
                done = done or _DONE_LINE.search(events) is not None
                yield events
        reason = f"the replica's stream ended without data: [DONE] ({len(pending)} bytes of a half event dropped)"
    except (OSError, http.client.HTTPException) as exc:
        reason = f"the replica's stream broke off ({exc or type(exc).__name__})"
    if done:
        return
    log.warning("gateway: %s from %s; ending the client's stream with an error event", reason, url)
    yield sse_event(error_body(f"{reason}; the completion is incomplete: retry the request", 500)) + SSE_DONE


class _Server(LoopbackHTTPServer):
    def __init__(
        self, port: int, gateway_id: str, router: Router, tokens: frozenset[str], replica_token: str | None
    ) -> None:
        super().__init__(port, _Handler)
        self.gateway_id = gateway_id
        self.router = router
        self.tokens = tokens
        self.replica_token = replica_token
        self.started = time.time()


class GatewayServer(BackgroundServer):
    """One gateway's HTTP server in a background thread; its :attr:`url` is the gateway's endpoint.

    Args:
        gateway_id: the gateway resource it serves.
        router: gives the gateway's spec and, per model name, the replica URLs to use.
        tokens: API tokens accepted by ``coreWeaveAuth`` gateways.
        port: the port (a free one when 0).
        replica_token: the bearer token replicas accept (sent on every relayed request).
    """

    def __init__(
        self,
        gateway_id: str,
        router: Router,
        tokens: frozenset[str],
        port: int = 0,
        *,
        replica_token: str | None = None,
    ) -> None:
        super().__init__(_Server(port, gateway_id, router, tokens, replica_token), f"gateway-{gateway_id}")
