"""The inference gateway: an OpenAI-compatible front door routing across engine replicas.

One :class:`GatewayServer` per gateway resource, on its own loopback port; its URL is the
gateway's ``status.endpoints[0]``. It serves

- ``GET /v1/models``: the ``spec.model.name`` of every deployment attached to the gateway;
- ``POST /v1/completions`` (and ``/v1/chat/completions``): the deployment is chosen by the
  gateway's routing (``bodyBasedRouting``: the body's ``model``; ``headerBasedRouting``:
  the named header; ``pathBasedRouting``: ``/<model>/v1/...``), then the request goes to
  that deployment's routable replicas round-robin, unchanged, and the replica's answer comes
  back unchanged (its ``x-cwtrain-snapshot-identity`` header included). A replica that does
  not answer is skipped for the next one.

Auth: ``coreWeaveAuth`` gateways want ``Authorization: Bearer <the stack's API token>``;
``weightsAndBiasesAuth`` gateways accept any non-empty bearer key. Errors use OpenAI's body
``{"error": {"message", "type", "code"}}``.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from cwtrain.local.loopback import BackgroundServer, JSONHandler, LoopbackHTTPServer

__all__ = ["GatewayServer", "Router"]

log = logging.getLogger("cwtrain.local.gateway")

#: ``router(gateway_id) -> (gateway spec or None, {model name: [replica URL, ...]})``.
Router = Callable[[str], tuple[Mapping[str, Any] | None, Mapping[str, list[str]]]]

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}


class _Handler(JSONHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("gateway %s: " + format, self.server.gateway_id, *args)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> None:
        body = {"error": {"message": message, "type": kind, "code": code or str(status)}}
        self.send_json(status, body, {"Retry-After": "1"} if status == 503 else None)

    def _serving(self) -> tuple[Mapping[str, Any], Mapping[str, list[str]]] | None:
        """The gateway's spec and routes, or ``None`` once an error was sent (not serving, not authorized)."""
        spec, models = self.server.router(self.server.gateway_id)
        if spec is None:
            self._error(503, "gateway is not serving", "server_error")
            return None
        if not self._authorized(spec):
            return None
        return spec, models

    def _authorized(self, spec: Mapping[str, Any]) -> bool:
        header = self.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            self._error(401, "missing bearer token (Authorization: Bearer <key>)", "authentication_error", "401")
            return False
        if "coreWeaveAuth" in spec and key not in self.server.tokens:
            self._error(401, "invalid API key", "authentication_error", "401")
            return False
        return True

    def do_GET(self) -> None:
        serving = self._serving()
        if serving is None:
            return
        _, models = serving
        path = urlsplit(self.path).path.rstrip("/")
        if path.endswith("/v1/models"):
            created = int(self.server.started)
            data = [
                {"id": m, "object": "model", "created": created, "owned_by": "cwtrain-local"} for m in sorted(models)
            ]
            self.send_json(200, {"object": "list", "data": data})
            return
        self._error(404, f"no route for GET {path}", code="404")

    def do_POST(self) -> None:
        raw = self.read_body()
        serving = self._serving()
        if serving is None:
            return
        spec, models = serving
        path = urlsplit(self.path).path
        model = self._model(spec, path, raw)
        if model is None:
            return
        if "pathBasedRouting" in spec:
            path = path[len(model) + 1 :]
        if not path.startswith("/v1/"):
            self._error(404, f"no route for POST {path}", code="404")
            return
        if model not in models:
            self._error(404, f"the model {model!r} does not exist on this gateway", code="model_not_found")
            return
        self._proxy(models[model], path, raw)

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
                self._error(404, "path routing expects /<model>/v1/...", code="404")
                return None
            return parts[1]
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._error(400, "request body is not JSON")
            return None
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str) or not model:
            self._error(400, "the request body needs a 'model'")
            return None
        return model

    def _proxy(self, replicas: list[str], path: str, raw: bytes) -> None:
        if not replicas:
            self._error(503, "no replica of this model is ready; retry shortly", "server_error", "503")
            return
        query = urlsplit(self.path).query
        target = path + (f"?{query}" if query else "")
        headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
        last = ""
        for url in replicas:
            parts = urlsplit(url)
            conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=600)
            try:
                conn.request("POST", target, body=raw, headers=headers)
                response = conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException) as exc:
                last = f"{url}: {exc}"
                log.info("gateway: replica %s did not answer (%s); trying the next one", url, exc)
                continue
            finally:
                conn.close()
            self.send_response(response.status)
            for key, value in response.getheaders():
                if key.lower() not in _HOP_HEADERS:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self._error(503, f"no replica answered ({last})", "server_error", "503")


class _Server(LoopbackHTTPServer):
    def __init__(self, port: int, gateway_id: str, router: Router, tokens: frozenset[str]) -> None:
        super().__init__(port, _Handler)
        self.gateway_id = gateway_id
        self.router = router
        self.tokens = tokens
        self.started = time.time()


class GatewayServer(BackgroundServer):
    """One gateway's HTTP server in a background thread; its :attr:`url` is the gateway's endpoint.

    Args:
        gateway_id: the gateway resource it serves.
        router: gives the gateway's spec and, per model name, the replica URLs to use.
        tokens: API tokens accepted by ``coreWeaveAuth`` gateways.
        port: the port (a free one when 0).
    """

    def __init__(self, gateway_id: str, router: Router, tokens: frozenset[str], port: int = 0) -> None:
        super().__init__(_Server(port, gateway_id, router, tokens), f"gateway-{gateway_id}")
