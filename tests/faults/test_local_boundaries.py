"""The local stack's HTTP boundary: who may call it, what bodies it reads, which ids it looks up.

Every request here goes over a raw socket, so that headers can lie (a ``Content-Length``
of ``abc``, ``-1``, ``1e11``, a 1 GiB body never sent) and the answer's timing shows whether
the server tried to read what it should have refused:

- ``local-auth``: no token or a wrong one, to the control plane, a gateway and a replica
  (``/admin/hotload``, ``/admin/hotload/cancel``, ``/admin/weights``, ``/v1/completions``):
  401 in the server's error shape before a byte of the body is read, and the replica keeps
  its identity; the routes vLLM leaves open (``/health``, ``/tokenize``) answer without one.
- ``local-bodies``: malformed framings and oversized bodies: 400 or 413 at once, in the
  server's error shape, and the server goes on answering.
- ``deep-json``: a body nested 129, 900 and 100,000 levels deep: 400 in the server's error
  shape, and the server goes on answering.
- ``local-ids``: escaped ids holding ``?``, ``/``, ``%`` or control characters, and the
  reserved id ``parameters``: ``invalid_argument``, nothing looked up, deleted or created.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from cwtrain.local import LocalStack
from cwtrain.local.controlplane.server import API_PREFIX, MAX_BODY_BYTES
from cwtrain.local.stack import DeployedModel, gateway_request

pytestmark = [pytest.mark.faults, pytest.mark.e2e]

GIB = 1 << 30


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack(replicas=1) as local:
        yield local


@pytest.fixture(scope="module")
def target(stack: LocalStack) -> DeployedModel:
    return stack.deploy(name="boundary", replicas=1)


def _replica_url(stack: LocalStack, target: DeployedModel) -> str:
    process = stack.supervisor.slots[target.deployment_id][0].process
    assert process is not None
    return process.url


def _servers(stack: LocalStack, target: DeployedModel) -> dict[str, tuple[str, str, str]]:
    """name → (origin, a POST path, the token it accepts)."""
    gateway = target.base_url.removesuffix("/v1")
    return {
        "api": (stack.api_url, f"{API_PREFIX}/hotLoads", stack.token),
        "gateway": (gateway, "/v1/completions", stack.token),
        "replica": (_replica_url(stack, target), "/v1/completions", stack.replica_token),
    }


def _exchange(origin: str, head: str, body: bytes = b"", timeout: float = 10.0) -> tuple[int, dict[str, str], Any]:
    """Send ``head`` (request line and headers, no blank line) and ``body``; read one answer.

    The answer must come within ``timeout``: a server that waits for a body it should have
    refused fails here.
    """
    parts = urlsplit(origin)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n\r\n" + body)
        raw = b""
        while b"\r\n\r\n" not in raw:
            data = sock.recv(65536)
            assert data, f"the connection closed without an answer: {raw!r}"
            raw += data
        top, _, rest = raw.partition(b"\r\n\r\n")
        lines = top.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            data = sock.recv(65536)
            assert data, "the answer was cut short"
            rest += data
    return status, headers, json.loads(rest[:length]) if length else None


def _shape(name: str, status: int, doc: Any) -> str:
    """The error message, after checking the body has the server's error shape."""
    if name == "api":
        assert set(doc) == {"code", "message", "details"}, doc
        return str(doc["message"])
    assert set(doc) == {"error"} and {"message", "type", "code"} <= set(doc["error"]), doc
    return str(doc["error"]["message"])


def _head(method: str, path: str, *headers: str) -> str:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers])


@pytest.mark.fault_row("local-auth")
@pytest.mark.parametrize("server", ["api", "gateway", "replica"])
def test_no_token_is_401_before_a_byte_of_a_1_gib_body(server: str, stack: LocalStack, target: DeployedModel) -> None:
    origin, path, _ = _servers(stack, target)[server]
    for auth in ([], ["Authorization: Bearer wrong-token"], ["Authorization: Basic eDp5"]):
        started = time.monotonic()
        status, headers, doc = _exchange(
            origin, _head("POST", path, *auth, "Content-Type: application/json", f"Content-Length: {GIB}"), b"{"
        )
        assert status == 401, (server, auth, doc)
        assert time.monotonic() - started < 5 and headers.get("connection") == "close"
        assert "token" in _shape(server, status, doc).lower() or "key" in _shape(server, status, doc).lower()


@pytest.mark.fault_row("local-auth")
def test_replica_routes_need_the_replica_token(stack: LocalStack, target: DeployedModel) -> None:
    origin = _replica_url(stack, target)
    good = f"Authorization: Bearer {stack.replica_token}"
    _, _, health = _exchange(origin, _head("GET", "/health", good, "Connection: close"))
    identity = health["identity"]
    hot_load = json.dumps({"hot_load_id": "x", "identity": "evil", "chain": [{"identity": "evil", "type": "FULL"}]})
    attempts = [
        ("POST", "/admin/hotload", hot_load),
        ("POST", "/admin/hotload/cancel", json.dumps({"hot_load_id": "x"})),
        ("POST", "/v1/completions", json.dumps({"model": target.model, "prompt": "hi", "max_tokens": 1})),
        ("GET", "/admin/weights", ""),
        ("GET", "/v1/models", ""),
    ]
    for method, path, body in attempts:
        for auth in ([], [f"Authorization: Bearer {stack.token}"]):  # the API token is not the replica's
            head = _head(method, path, *auth, "Content-Type: application/json", f"Content-Length: {len(body)}")
            status, _, doc = _exchange(origin, head, body.encode())
            assert status == 401, (method, path, auth, doc)
            _shape("replica", status, doc)
    _, _, after = _exchange(origin, _head("GET", "/health", good, "Connection: close"))
    assert after["identity"] == identity and after["hot_load_id"] != "x"
    # what vLLM's --api-key leaves open needs no token here either (it guards /v1 only)
    status, _, open_health = _exchange(origin, _head("GET", "/health", "Connection: close"))
    assert status == 200 and open_health["identity"] == identity
    body = json.dumps({"model": target.model, "prompt": "hi"}).encode()
    head = _head(
        "POST", "/tokenize", "Content-Type: application/json", f"Content-Length: {len(body)}", "Connection: close"
    )
    status, _, tokens = _exchange(origin, head, body)
    assert status == 200 and tokens["count"] == len(tokens["tokens"])


@pytest.mark.fault_row("local-bodies")
@pytest.mark.parametrize("server", ["api", "gateway", "replica"])
def test_malformed_and_oversized_bodies_are_400_or_413_at_once(
    server: str, stack: LocalStack, target: DeployedModel
) -> None:
    origin, path, token = _servers(stack, target)[server]
    auth = f"Authorization: Bearer {token}"
    cases: list[tuple[list[str], bytes, int]] = [
        (["Content-Length: abc"], b"{}", 400),
        (["Content-Length: -1"], b"{}", 400),
        (["Content-Length: 1e11"], b"{}", 400),
        (["Content-Length: 0x10"], b"{}", 400),
        (["Content-Length: 2", "Content-Length: 3"], b"{}", 400),
        (["Content-Length: 100000000000"], b"{}", 413),
        ([f"Content-Length: {MAX_BODY_BYTES * 8 + 1}"], b"{}", 413),
        (["Content-Length: 2", "Transfer-Encoding: chunked"], b"2\r\n{}\r\n0\r\n\r\n", 400),
        (["Transfer-Encoding: gzip"], b"{}", 400),
        (["Transfer-Encoding: chunked"], b"-1\r\n{}\r\n0\r\n\r\n", 400),
        (["Transfer-Encoding: chunked"], b"zz\r\n{}\r\n0\r\n\r\n", 400),
        (["Transfer-Encoding: chunked"], b"7fffffffffffffff\r\n{}", 413),
        (["Content-Length: 10", "Connection: close"], b"{}", 400),  # the client stops after 2 of 10 bytes
    ]
    for headers, body, expected in cases:
        started = time.monotonic()
        if "Connection: close" in headers:
            parts = urlsplit(origin)
            with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
                sock.sendall((_head("POST", path, auth, *headers) + "\r\n\r\n").encode() + body)
                sock.shutdown(socket.SHUT_WR)
                answer = b""
                while data := sock.recv(65536):
                    answer += data
            status = int(answer.split()[1])
            doc = json.loads(answer.partition(b"\r\n\r\n")[2])
        else:
            status, _, doc = _exchange(
                origin, _head("POST", path, auth, "Content-Type: application/json", *headers), body
            )
        assert status == expected, (server, headers, body, doc)
        assert time.monotonic() - started < 5
        _shape(server, status, doc)
    status, _, _ = _exchange(origin, _head("GET", "/health" if server == "replica" else "/v1/models", auth))
    if server == "api":
        status, _, _ = _exchange(origin, _head("GET", f"{API_PREFIX}/deployments/{target.deployment_id}", auth))
    assert status == 200  # still serving


@pytest.mark.fault_row("deep-json")
@pytest.mark.parametrize("server", ["api", "gateway", "replica"])
def test_a_deeply_nested_body_is_a_400_in_the_servers_shape(
    server: str, stack: LocalStack, target: DeployedModel
) -> None:
    origin, path, token = _servers(stack, target)[server]
    auth = f"Authorization: Bearer {token}"
    for depth in (100_000, 900, 129):
        body = ('{"model": "' + target.model + '", "prompt": ' + "[" * depth + "]" * depth + "}").encode()
        status, _, doc = _exchange(
            origin, _head("POST", path, auth, "Content-Type: application/json", f"Content-Length: {len(body)}"), body
        )
        assert status == 400, (server, depth, doc)
        assert "levels deep" in _shape(server, status, doc)
    status, _, _ = _exchange(origin, _head("GET", "/health" if server == "replica" else "/v1/models", auth))
    if server == "api":
        status, _, _ = _exchange(origin, _head("GET", f"{API_PREFIX}/deployments/{target.deployment_id}", auth))
    assert status == 200  # still serving


@pytest.mark.fault_row("local-ids")
def test_ids_that_are_not_one_plain_segment_are_invalid(stack: LocalStack, target: DeployedModel) -> None:
    dep = target.deployment_id
    bad = [f"{dep}?junk", f"{dep}/x", f"{dep}%41", f"{dep}\n", "x\x00", f"{dep} ", "\u202etxt.exe"]
    for kind in ("deployments", "gateways", "hotLoads"):
        for value in bad:
            for method in ("GET", "DELETE"):
                status, body = stack.api(method, f"/{kind}/{quote(value, safe='')}")
                assert (status, body["code"]) == (400, "invalid_argument"), (kind, value, method, body)
                assert "is not a valid id" in body["message"]
    status, body = stack.api("GET", f"/deployments/{dep}")
    assert status == 200 and body["deployment"]["status"]["status"] != "STATUS_DELETING"
    status, body = stack.api("GET", f"/deployments/{quote(dep + '%2Fx', safe='')}")
    assert (status, body["code"]) == (400, "invalid_argument")
    created = {"id": "parameters", **gateway_request(f"p-{uuid.uuid4().hex[:6]}", stack.region)}
    status, body = stack.api("POST", "/gateways", created)
    assert (status, body["code"]) == (400, "invalid_argument") and "reserved" in body["message"]
    status, body = stack.api("GET", "/gateways")
    assert all(g["spec"]["id"] != "parameters" for g in body["items"])
