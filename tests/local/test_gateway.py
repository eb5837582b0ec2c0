"""The inference gateway on its own: routing, fail-over to the next replica, 503s, headers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from cwtrain.local.engine.gateway import GatewayServer
from cwtrain.local.harness.objectstore import free_port

SPEC = {"id": "gw", "coreWeaveAuth": {}, "bodyBasedRouting": {"apiType": "API_TYPE_OPENAI"}}
AUTH = {"Authorization": "Bearer secret"}


RELEASE = threading.Event()  # the streaming stub sends its second event only once this is set


class _Stub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        card = {"id": "tiny-model", "object": "model", "owned_by": "vllm", "root": "s3://m/tiny", "max_model_len": 256}
        data = json.dumps({"object": "list", "data": [card]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if json.loads(body).get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("x-cwtrain-snapshot-identity", "v7")
            self.end_headers()
            for event in (b'data: {"n":1}\n\n', b'data: {"n":2}\n\n', b"data: [DONE]\n\n"):
                self.wfile.write(b"%x\r\n%b\r\n" % (len(event), event))
                if event.startswith(b'data: {"n":1}'):
                    RELEASE.wait(10)
            self.wfile.write(b"0\r\n\r\n")
            return
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


def test_streams_are_relayed_as_they_arrive_and_root_routes_pass(replica: str) -> None:
    gateway = _gateway({"tiny-model": [replica]})
    RELEASE.clear()
    try:
        body = {"model": "tiny-model", "prompt": "x", "stream": True}
        with httpx.stream("POST", gateway.url + "/v1/completions", json=body, headers=AUTH, timeout=30) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
            assert response.headers["transfer-encoding"] == "chunked" and "content-length" not in response.headers
            assert response.headers["x-cwtrain-snapshot-identity"] == "v7"
            lines = response.iter_lines()
            # the first event arrives while the replica still holds back the second one
            assert next(line for line in lines if line) == 'data: {"n":1}'
            RELEASE.set()
            assert [line for line in lines if line] == ['data: {"n":2}', "data: [DONE]"]
        for path in ("/tokenize", "/detokenize"):
            answer = httpx.post(gateway.url + path, json={"model": "tiny-model", "tokens": [1]}, headers=AUTH)
            assert answer.json()["path"] == path
        assert httpx.post(gateway.url + "/other", json={"model": "tiny-model"}, headers=AUTH).status_code == 404
        # a chunked request body is read whole and sent on with its length
        chunked = httpx.post(
            gateway.url + "/v1/chat/completions", content=iter([b'{"model": "tiny-', b'model", "n": 1}']), headers=AUTH
        )
        assert chunked.status_code == 200 and chunked.json()["echo"] == {"model": "tiny-model", "n": 1}
        card = httpx.get(gateway.url + "/v1/models", headers=AUTH).json()["data"][0]
        assert card["root"] == "s3://m/tiny" and card["max_model_len"] == 256 and card["owned_by"] == "vllm"
    finally:
        RELEASE.set()
        gateway.stop()
