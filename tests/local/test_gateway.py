"""The inference gateway on its own: routing, fail-over to the next replica, 503s, headers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from cwtrain.local.gateway import GatewayServer
from cwtrain.local.objectstore import free_port

SPEC = {"id": "gw", "coreWeaveAuth": {}, "bodyBasedRouting": {"apiType": "API_TYPE_OPENAI"}}
AUTH = {"Authorization": "Bearer secret"}


class _Stub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = json.dumps({"echo": json.loads(body), "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("x-cwtrain-snapshot-identity", "v7")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def replica() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _gateway(models: Mapping[str, list[str]]) -> GatewayServer:
    return GatewayServer("gw", lambda gateway_id: (SPEC, dict(models)), frozenset({"secret"})).start()


def test_fails_over_to_the_next_replica_and_keeps_headers(replica: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    gateway = _gateway({"tiny-model": [dead, replica]})
    try:
        body = {"model": "tiny-model", "prompt": [1, 2, 3], "n": 2}
        response = httpx.post(gateway.url + "/v1/completions", json=body, headers=AUTH)
        assert response.status_code == 200
        assert response.json() == {"echo": body, "path": "/v1/completions"}
        assert response.headers["x-cwtrain-snapshot-identity"] == "v7"
    finally:
        gateway.stop()


def test_no_replica_means_503_with_retry_after() -> None:
    gateway = _gateway({"tiny-model": [], "other-model": [f"http://127.0.0.1:{free_port()}"]})
    try:
        for model in ("tiny-model", "other-model"):
            response = httpx.post(gateway.url + "/v1/completions", json={"model": model}, headers=AUTH)
            assert response.status_code == 503 and response.headers["Retry-After"] == "1"
            assert response.json()["error"]["type"] == "server_error"
        bad_json = httpx.post(gateway.url + "/v1/completions", content=b"{", headers=AUTH)
        assert bad_json.status_code == 400
        models = httpx.get(gateway.url + "/v1/models", headers=AUTH).json()["data"]
        assert [m["id"] for m in models] == ["other-model", "tiny-model"]
    finally:
        gateway.stop()
