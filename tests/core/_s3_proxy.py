"""A loopback HTTP proxy in front of moto's S3 server that can refuse chosen S3 operations.

Tests point a path-style S3 client at :attr:`S3Proxy.endpoint_url`; every request is
forwarded to the real server unless a rule matches, in which case the proxy answers with
the rule's S3 error (a real HTTP response with an S3 XML error body)::

    with S3Proxy(s3_server.endpoint_url) as proxy:
        proxy.refuse("CreateMultipartUpload", 403, "AccessDenied")
        s3 = s3_client(proxy.endpoint_url)
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import parse_qs, urlsplit

__all__ = ["S3Proxy", "operation_of"]


def operation_of(method: str, path: str, headers: dict[str, str]) -> str:
    """The S3 operation of a path-style request (the few the tests need)."""
    parts = urlsplit(path)
    query = parse_qs(parts.query, keep_blank_values=True)
    has_key = parts.path.strip("/").count("/") >= 1
    if method == "GET" and not has_key:
        return "ListMultipartUploads" if "uploads" in query else "ListObjectsV2"
    if method == "HEAD":
        return "HeadObject" if has_key else "HeadBucket"
    if method == "POST" and "uploads" in query:
        return "CreateMultipartUpload"
    if method == "POST" and "uploadId" in query:
        return "CompleteMultipartUpload"
    if method == "DELETE" and "uploadId" in query:
        return "AbortMultipartUpload"
    if method == "PUT" and "partNumber" in query:
        return "UploadPart"
    if method == "PUT" and has_key:
        return "PutObject"
    if method == "GET" and "uploadId" in query:
        return "ListParts"
    if method == "GET":
        return "GetObject"
    return f"{method} {parts.path}"


Rule = Callable[[str, str, dict[str, str]], "tuple[int, str] | None"]


class S3Proxy:
    """A threaded loopback proxy with injectable S3 error answers."""

    def __init__(self, upstream: str) -> None:
        up = urlsplit(upstream)
        self._upstream = (up.hostname or "127.0.0.1", up.port or 80)
        self._rules: list[Rule] = []
        self.seen: list[tuple[str, dict[str, str]]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def refuse(self, operation: str, status: int, code: str, *, times: int | None = None) -> None:
        """Answer ``operation`` with ``status``/``code`` (``times`` times, else always)."""
        left = [times]

        def rule(op: str, path: str, headers: dict[str, str]) -> tuple[int, str] | None:
            if op != operation or left[0] == 0:
                return None
            if left[0] is not None:
                left[0] -= 1
            return status, code

        self.add_rule(rule)

    def add_rule(self, rule: Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def count(self, operation: str) -> int:
        with self._lock:
            return sum(1 for op, _ in self.seen if op == operation)

    def _decide(self, op: str, path: str, headers: dict[str, str]) -> tuple[int, str] | None:
        with self._lock:
            self.seen.append((op, headers))
            rules = list(self._rules)
        for rule in rules:
            answer = rule(op, path, headers)
            if answer is not None:
                return answer
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                body = self._body()
                headers = {k: v for k, v in self.headers.items()}
                op = operation_of(self.command, self.path, headers)
                answer = proxy._decide(op, self.path, headers)
                if answer is not None:
                    status, code = answer
                    payload = (
                        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                        f"<Message>refused by the test proxy</Message></Error>"
                    ).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(0 if self.command == "HEAD" else len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(*proxy._upstream, timeout=60)
                try:
                    forward = {k: v for k, v in headers.items() if k.lower() not in ("expect", "connection")}
                    conn.request(self.command, self.path, body=body, headers=forward)
                    response = conn.getresponse()
                    data = response.read()
                    self.send_response(response.status)
                    for key, value in response.getheaders():
                        if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(key, value)
                    length = response.getheader("Content-Length") if self.command == "HEAD" else None
                    self.send_header("Content-Length", length or str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        return Handler

    def __enter__(self) -> S3Proxy:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
