"""``cwtrain.serving``: ``JSONHandler.read_body`` (credentials first, ``Expect: 100-continue`` after the
checks, stalls, limits), ``check_bearer``, and servers that listen only where they are told."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from cwtrain.serving import BackgroundServer, GuardedHTTPServer, JSONHandler, RequestRefused


class _Handler(JSONHandler):
    max_body_bytes = 64
    body_timeout = 0.5

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def authenticate(self) -> None:
        if self.headers.get("Authorization") != "Bearer ok":
            raise RequestRefused(401, "no", code="unauthenticated")

    def do_POST(self) -> None:
        try:
            body = self.read_body()
        except RequestRefused as exc:
            self.refuse(exc)
            return
        self.send_json(200, {"got": body.decode()})


@pytest.fixture
def origin() -> Iterator[tuple[str, int]]:
    server = BackgroundServer(GuardedHTTPServer("127.0.0.1", 0, _Handler), "serving-test").start()
    yield "127.0.0.1", server.port
    server.stop()


def _answer(sock: socket.socket) -> tuple[int, Any]:
    raw = b""
    while b"\r\n\r\n" not in raw:
        data = sock.recv(4096)
        assert data, raw
        raw += data
    head, _, rest = raw.partition(b"\r\n\r\n")
    length = int(
        next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    )
    while len(rest) < length:
        rest += sock.recv(4096)
    return int(head.split()[1]), json.loads(rest[:length])


def test_expect_100_continue_only_after_the_checks(origin: tuple[str, int]) -> None:
    head = "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n"
    with socket.create_connection(origin, timeout=5) as sock:
        sock.sendall((head + "Authorization: Bearer ok\r\n\r\n").encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(b"hello")
        assert _answer(sock) == (200, {"got": "hello"})
    with socket.create_connection(origin, timeout=5) as sock:  # refused: no 100, the final answer at once
        sock.sendall((head + "\r\n").encode())
        status, doc = _answer(sock)
        assert status == 401 and doc["error"]["message"] == "no"
    with socket.create_connection(origin, timeout=5) as sock:  # too long: 413 before any byte is sent
        sock.sendall(
            b"POST / HTTP/1.1\r\nAuthorization: Bearer ok\r\nExpect: 100-continue\r\nContent-Length: 65\r\n\r\n"
        )
        assert _answer(sock)[0] == 413


def test_a_stalled_body_is_408_and_the_server_goes_on(origin: tuple[str, int]) -> None:
    with socket.create_connection(origin, timeout=5) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nAuthorization: Bearer ok\r\nContent-Length: 10\r\n\r\nabc")
        status, doc = _answer(sock)
        assert status == 408 and "stalled" in doc["error"]["message"]
    with socket.create_connection(origin, timeout=5) as sock:
        sock.sendall(
            b"POST / HTTP/1.1\r\nAuthorization: Bearer ok\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        )
        assert _answer(sock) == (200, {"got": "abc"})


def test_a_chunked_body_over_the_limit_is_413(origin: tuple[str, int]) -> None:
    with socket.create_connection(origin, timeout=5) as sock:
        chunk = b"20\r\n" + b"x" * 32 + b"\r\n"
        sock.sendall(b"POST / HTTP/1.1\r\nAuthorization: Bearer ok\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 3)
        status, doc = _answer(sock)
        assert status == 413 and "64 bytes" in doc["error"]["message"]


def test_check_bearer_takes_only_a_known_token() -> None:
    from email.message import Message

    from cwtrain.serving import check_bearer

    def headers(value: str | None) -> Message:
        message = Message()
        if value is not None:
            message["Authorization"] = value
        return message

    assert check_bearer(headers("Bearer ok"), {"other", "ok"}) == "ok"
    assert check_bearer(headers("bearer  ok "), {"ok"}) == "ok"
    for value in (None, "", "Bearer", "Bearer ", "Basic ok", "Bearer nope", "Bearer ok2"):
        with pytest.raises(RequestRefused) as info:
            check_bearer(headers(value), {"ok", ""})
        assert info.value.status == 401 and info.value.code == "unauthenticated"


def test_servers_listen_only_where_told() -> None:
    from cwtrain.serving import is_loopback, url_host

    server = GuardedHTTPServer("127.0.0.1", 0, _Handler)
    try:
        assert server.host == "127.0.0.1" and server.url == f"http://127.0.0.1:{server.port}"
    finally:
        server.server_close()
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5") and not is_loopback("node-7")
    assert url_host("::1") == "[::1]" and url_host("10.0.0.5") == "10.0.0.5"


def test_bind_address_is_where_the_advertised_name_leads_and_no_wider() -> None:
    from cwtrain.serving import bind_address

    assert bind_address("10.1.2.3") == "10.1.2.3" and bind_address("[::1]") == "::1"
    assert bind_address("localhost") == "127.0.0.1"
    assert bind_address(socket.gethostname()) == socket.gethostbyname(socket.gethostname())


def test_a_background_server_as_a_context_manager_starts_once_and_releases_its_port() -> None:
    with BackgroundServer(GuardedHTTPServer("127.0.0.1", 0, _Handler), "serving-test") as server:
        assert server.host == "127.0.0.1" and server.start() is server  # a second start does nothing
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ok\r\nContent-Length: 2\r\n\r\nhi")
            assert _answer(sock) == (200, {"got": "hi"})
        port = server.port
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
