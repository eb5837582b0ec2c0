"""A loopback HTTP proxy in front of moto's S3 server: refuse chosen operations, or act on them.

Tests point a path-style S3 client at :attr:`S3Proxy.endpoint_url`. Each request is read
whole and recorded (:attr:`S3Proxy.seen`); the actions registered for its operation run
(they may change files on disk, hold the request, or replace its body); a rule may then
answer with an S3 error (a real HTTP response with an S3 XML error body); otherwise the
request is forwarded to the real server::

    with S3Proxy(s3_server.endpoint_url) as proxy:
        proxy.refuse("CreateMultipartUpload", 403, "AccessDenied")
        proxy.on("UploadPart", lambda request: shard.write_bytes(other), times=1)
        s3 = s3_client(proxy.endpoint_url)

Like S3 (and unlike moto), the proxy refuses a PutObject or UploadPart whose
``x-amz-checksum-sha256`` does not match the body it forwards: ``400 BadDigest``.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import parse_qs, urlsplit

__all__ = ["Request", "S3Proxy", "operation_of"]


def operation_of(method: str, path: str) -> str:
    """The S3 operation of a path-style request (the ones cwtrain sends)."""
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
    return "GetObject" if method == "GET" else f"{method} {parts.path}"


@dataclass
class Request:
    """One request as the proxy received it; an action may replace :attr:`body`."""

    operation: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def key(self) -> str:
        """The object key (path-style: after the bucket)."""
        return urlsplit(self.path).path.lstrip("/").partition("/")[2]


#: ``rule(operation, path, headers)``: ``(status, code)`` to refuse the request, or ``None``.
Rule = Callable[[str, str, dict[str, str]], "tuple[int, str] | None"]
Action = Callable[[Request], None]


def _take(left: list[int | None]) -> bool:
    """Whether a ``times`` counter still allows one more use (and count it)."""
    if left[0] == 0:
        return False
    if left[0] is not None:
        left[0] -= 1
    return True


class S3Proxy:
    """A threaded loopback proxy with injectable actions and S3 error answers."""

    def __init__(self, upstream: str) -> None:
        up = urlsplit(upstream)
        self._upstream = (up.hostname or "127.0.0.1", up.port or 80)
        self._rules: list[Rule] = []
        self._actions: list[tuple[str, Action, list[int | None]]] = []
        self.seen: list[Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def refuse(self, operation: str, status: int, code: str, *, times: int | None = None) -> None:
        """Answer ``operation`` with ``status``/``code`` (``times`` times, else always)."""
        left: list[int | None] = [times]

        def rule(op: str, path: str, headers: dict[str, str]) -> tuple[int, str] | None:
            return (status, code) if op == operation and _take(left) else None

        self.add_rule(rule)

    def add_rule(self, rule: Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def on(self, operation: str, action: Action, *, times: int | None = None) -> None:
        """Run ``action`` on each request of ``operation`` (the first ``times`` of them, else all)."""
        with self._lock:
            self._actions.append((operation, action, [times]))

    def operations(self) -> list[str]:
        with self._lock:
            return [request.operation for request in self.seen]

    def count(self, operation: str) -> int:
        return self.operations().count(operation)

    def _receive(self, request: Request) -> tuple[int, str] | None:
        """Record the request, run its actions, then the rules: the error to answer, if any."""
        with self._lock:
            self.seen.append(request)
            actions = [action for op, action, left in self._actions if op == request.operation and _take(left)]
            rules = list(self._rules)
        for action in actions:
            action(request)
        for rule in rules:
            answer = rule(request.operation, request.path, request.headers)
            if answer is not None:
                return answer
        claimed = {k.lower(): v for k, v in request.headers.items()}.get("x-amz-checksum-sha256")
        if claimed and base64.b64encode(hashlib.sha256(request.body).digest()).decode() != claimed:
            return 400, "BadDigest"
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _error(self, status: int, code: str) -> None:
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

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items()}
                request = Request(operation_of(self.command, self.path), self.path, headers, body)
                answer = proxy._receive(request)
                if answer is not None:
                    self._error(*answer)
                    return
                conn = http.client.HTTPConnection(*proxy._upstream, timeout=120)
                try:
                    forward = {k: v for k, v in headers.items() if k.lower() not in ("expect", "connection")}
                    forward["Content-Length"] = str(len(request.body))
                    conn.request(self.command, self.path, body=request.body, headers=forward)
                    response = conn.getresponse()
                    data = response.read()
                    self.send_response(response.status)
                    for key, value in response.getheaders():
                        if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(key, value)
                    size = response.getheader("Content-Length") if self.command == "HEAD" else None
                    self.send_header("Content-Length", size or str(len(data)))
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
