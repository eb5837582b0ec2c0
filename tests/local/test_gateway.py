"""The inference gateway on its own: routing, fail-over to the next replica, 503s, headers."""

from __future__ import annotations

import json
import socket
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


# ------------------------------------------------------------------ broken upstream answers (#26 item 7)

EVENTS = [b'data: {"id":"c","choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'] * 2


class _Breaking(BaseHTTPRequestHandler):
    """A replica whose answer breaks off; the request's ``"break"`` says how."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self) -> None:
        how = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))["break"]
        self.send_response(200)
        if how == "cut-mid-body":  # a whole answer of known length, cut short
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "4096")
            self.end_headers()
            self.wfile.write(b'{"choices": [{"index": 0, "text": "ab')
        elif how == "chunked-json-cut":  # a whole answer sent in chunks, cut short
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(b'{"choices": [{"index": 0, "text": "ab", ')
        else:  # a stream: two events, then it breaks
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in EVENTS:
                self._chunk(event)
            if how == "cut-mid-event":
                self._chunk(b'data: {"id":"c","choices":[{"index":0,"te')
            elif how == "ends-without-done":
                self.wfile.write(b"0\r\n\r\n")  # a clean end of the chunked body, but no [DONE]
                self.wfile.flush()
                return
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)  # the replica process died


@pytest.fixture
def breaking() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Breaking)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.faults
@pytest.mark.fault_row("broken-stream")
@pytest.mark.parametrize("how", ["cut-after-events", "cut-mid-event", "ends-without-done"])
def test_a_broken_stream_ends_with_vllms_error_event_not_as_if_whole(how: str, breaking: str) -> None:
    gateway = _gateway({"tiny-model": [breaking]})
    try:
        body = {"model": "tiny-model", "prompt": "x", "stream": True, "break": how}
        with httpx.stream("POST", gateway.url + "/v1/completions", json=body, headers=AUTH, timeout=30) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        # the whole events as they came, never the half event; then vLLM's error event and [DONE]
        assert lines[:2] == [event.decode().strip() for event in EVENTS]
        assert len(lines) == 4 and lines[3] == "data: [DONE]", lines
        error = json.loads(lines[2].removeprefix("data: "))["error"]
        assert error["type"] == "InternalServerError" and error["code"] == 500 and error["param"] is None
        assert "incomplete" in error["message"]
        # the openai client (as vLLM's own clients) raises on it instead of returning a short text
        import openai

        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="secret", max_retries=0)
        stream = client.completions.create(model="tiny-model", prompt="x", stream=True, extra_body={"break": how})
        with pytest.raises(openai.APIError, match="incomplete"):
            for _ in stream:
                pass
    finally:
        gateway.stop()


@pytest.mark.faults
@pytest.mark.fault_row("broken-stream")
@pytest.mark.parametrize("how", ["cut-mid-body", "chunked-json-cut"])
def test_a_broken_whole_answer_is_an_error_status(how: str, breaking: str) -> None:
    gateway = _gateway({"tiny-model": [breaking]})
    try:
        answer = httpx.post(
            gateway.url + "/v1/completions", json={"model": "tiny-model", "prompt": "x", "break": how}, headers=AUTH
        )
        assert answer.status_code >= 500, answer.text
        assert set(answer.json()["error"]) >= {"message", "type", "code"}
    finally:
        gateway.stop()


@pytest.mark.faults
@pytest.mark.fault_row("broken-stream")
def test_the_sampler_never_takes_a_broken_answer_for_a_completion(breaking: str) -> None:
    from cwtrain.integrations.rollout import CompletionSampler, RolloutConfig, RolloutError, SamplingParams

    gateway = _gateway({"tiny-model": [breaking]})

    class BreakingSampler(CompletionSampler):
        def _body(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return {**super()._body(*args, **kwargs), "break": "chunked-json-cut"}

    async def no_sleep(seconds: float) -> None:
        return None

    config = RolloutConfig(gateway.url + "/v1", "tiny-model", api_key="secret", max_attempts=2)
    try:
        with BreakingSampler(config, sleep=no_sleep) as sampler, pytest.raises(RolloutError, match="after 2 attempts"):
            sampler.sample_groups_sync([[1, 2, 3]], 1, SamplingParams(max_tokens=4))
    finally:
        gateway.stop()
