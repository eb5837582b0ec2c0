"""A loopback S3 proxy that runs a test's action when a chosen request arrives, and checks bodies like S3.

Tests point a path-style client at :attr:`TamperProxy.endpoint_url`; each request is read
whole, handed to the actions registered for its operation (which may change files on
disk, hold the request, or change its body), then forwarded to the real server::

    with TamperProxy(s3_server.endpoint_url) as proxy:
        proxy.on("UploadPart", lambda request: shard.write_bytes(other), times=1)
        upload_snapshot(snap, ..., s3=s3_client(proxy.endpoint_url))

Like S3 (and unlike moto), the proxy refuses a PutObject or UploadPart whose
``x-amz-checksum-sha256`` does not match the body it received: ``400 BadDigest``.
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

__all__ = ["Request", "TamperProxy", "operation_of"]


def operation_of(method: str, path: str) -> str:
    """The S3 operation of a path-style request (the ones uploads send)."""
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


Action = Callable[[Request], None]


class TamperProxy:
    """A threaded loopback proxy that runs actions on chosen operations, then forwards."""

    def __init__(self, upstream: str) -> None:
        up = urlsplit(upstream)
        self._upstream = (up.hostname or "127.0.0.1", up.port or 80)
        self._actions: list[tuple[str, Action, list[int | None]]] = []
        self.seen: list[Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def on(self, operation: str, action: Action, *, times: int | None = None) -> None:
        """Run ``action`` on each request of ``operation`` (the first ``times`` of them, else all)."""
        with self._lock:
            self._actions.append((operation, action, [times]))

    def operations(self) -> list[str]:
        with self._lock:
            return [request.operation for request in self.seen]

    def _run_actions(self, request: Request) -> None:
        with self._lock:
            self.seen.append(request)
            chosen = []
            for operation, action, left in self._actions:
                if operation == request.operation and left[0] != 0:
                    if left[0] is not None:
                        left[0] -= 1
                    chosen.append(action)
        for action in chosen:
            action(request)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _error(self, status: int, code: str) -> None:
                payload = f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code></Error>'.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items()}
                request = Request(operation_of(self.command, self.path), self.path, headers, body)
                proxy._run_actions(request)
                claimed = {k.lower(): v for k, v in headers.items()}.get("x-amz-checksum-sha256")
                if claimed and base64.b64encode(hashlib.sha256(request.body).digest()).decode() != claimed:
                    self._error(400, "BadDigest")
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

    def __enter__(self) -> TamperProxy:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
