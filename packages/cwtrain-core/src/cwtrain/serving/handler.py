"""The guarded request handler: credentials before a byte of the body, bounded bodies, JSON answers.

:class:`JSONHandler` is a keep-alive HTTP/1.1 handler (Nagle off) whose every request body is
read by :meth:`~JSONHandler.read_body`, the one place for the checks::

    class Handler(JSONHandler):
        max_body_bytes = 4 << 20                  # longer bodies: 413, unread

        def authenticate(self) -> None:           # runs first in read_body
            check_bearer(self.headers, {"s3cret"})

        def refusal_body(self, error: RequestRefused) -> Any:
            return {"code": error.code, "message": error.message}   # the server's error shape

        def do_POST(self) -> None:
            try:
                raw = self.read_body()
            except RequestRefused as error:
                self.refuse(error)                # closes the connection when the body was not read
                return
            self.send_json(200, {"got": len(raw)})

``read_body`` refuses (:class:`RequestRefused`) a request whose ``authenticate`` refuses it,
a ``Content-Length`` that is not one decimal number (``abc``, ``-1``, ``1e11``; 400), two
framings at once (400), a declared or accumulated length over ``max_body_bytes`` (413), a
malformed chunked framing (400), a body that ends early (400) or stalls for
``body_timeout`` seconds (408). ``Expect: 100-continue`` is answered only once the request
passed those checks, so a refused client never sends its body. Answers: ``send_body``,
``send_json`` (``Content-Type`` and ``Content-Length`` first, then any extra headers) and
``send_stream`` (a body of unknown length sent as it is produced, in HTTP/1.1 chunks:
server-sent events, a relayed stream).
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Iterable, Mapping
from email.message import Message
from http.server import BaseHTTPRequestHandler
from typing import Any

__all__ = ["DEFAULT_MAX_BODY_BYTES", "BodyError", "JSONHandler", "RequestRefused", "check_bearer"]

#: The default ``JSONHandler.max_body_bytes``.
DEFAULT_MAX_BODY_BYTES = 32 << 20
_DIGITS = re.compile(r"[0-9]{1,20}")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_MAX_TRAILER_LINES = 64


class RequestRefused(Exception):
    """A request answered with an error before it was handled: credentials, framing, size.

    Attributes:
        status: the HTTP status to answer (400, 401, 403, 408, 413, ...).
        message: what was wrong, for the error body.
        code: a short code for the body (a Connect code for the control plane).
    """

    def __init__(self, status: int, message: str, *, code: str = "invalid_argument") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


class BodyError(RequestRefused):
    """A request body that cannot be read: bad framing (400), too long (413), too slow (408)."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(status, message, code="deadline_exceeded" if status == 408 else "invalid_argument")


class JSONHandler(BaseHTTPRequestHandler):
    """A request handler that answers with whole bodies of known length, or streams.

    Attributes:
        max_body_bytes: the longest request body read; a longer one is refused (413) unread.
        body_timeout: seconds a body may pause before the request is refused (408).
    """

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stall
    max_body_bytes = DEFAULT_MAX_BODY_BYTES
    body_timeout = 30.0
    _body_pending = False

    def handle_one_request(self) -> None:
        self._body_pending = False
        super().handle_one_request()

    def handle_expect_100(self) -> bool:
        """Defer ``100 Continue`` to :meth:`read_body`, after the request passed its checks."""
        return True

    def authenticate(self) -> None:
        """Check the request's credentials; the first step of :meth:`read_body`.

        Raises:
            RequestRefused: the request is not allowed (the default allows every request).
        """

    def refusal_body(self, error: RequestRefused) -> Any:
        """The JSON body answering a refused request (override for the server's error shape)."""
        return {"error": {"message": error.message, "type": "invalid_request_error", "code": error.status}}

    def refuse(self, error: RequestRefused, headers: Mapping[str, str] | None = None) -> None:
        """Answer ``error`` in the server's shape; the connection closes when a body was left unread."""
        extra = dict(headers or {})
        if self._body_pending or error.status in (400, 408, 413):
            self.close_connection = True
            extra["Connection"] = "close"
        self.send_json(error.status, self.refusal_body(error), extra)

    def read_body(self) -> bytes:
        """The request body, after :meth:`authenticate`: ``Content-Length`` bytes, or every chunk.

        Empty without either header. Nothing of the body is read before the credentials
        and the declared framing and length were checked.

        Raises:
            RequestRefused: ``authenticate`` refused the request, or the body cannot be
                read (:class:`BodyError`: malformed framing or length, too long, too slow).
                The connection is closed after the answer whenever body bytes may be left.
        """
        self._body_pending = self._declares_body()
        self.authenticate()
        chunked, length = self._framing()
        if self.headers.get("Expect", "").lower() == "100-continue" and self.request_version >= "HTTP/1.1":
            self.send_response_only(100)
            self.end_headers()
        self.connection.settimeout(self.body_timeout)
        try:
            body = self._read_chunked() if chunked else self._read_exactly(length)
        except TimeoutError:
            raise BodyError(f"the request body stalled for {self.body_timeout:g} s", status=408) from None
        finally:
            self.connection.settimeout(self.timeout)
        self._body_pending = False
        return body

    def _declares_body(self) -> bool:
        return bool(self.headers.get("Transfer-Encoding")) or (self.headers.get("Content-Length", "0").strip() != "0")

    def _framing(self) -> tuple[bool, int]:
        """``(chunked, Content-Length)``, checked against the limit before any body byte is read."""
        encodings = [
            token.strip().lower()
            for value in self.headers.get_all("Transfer-Encoding", [])
            for token in value.split(",")
            if token.strip()
        ]
        lengths = {v.strip() for v in self.headers.get_all("Content-Length", [])}
        if encodings:
            if encodings != ["chunked"]:
                raise BodyError(f"Transfer-Encoding {', '.join(encodings)!r} is not supported (only chunked)")
            if lengths:
                raise BodyError("a request may not have both Content-Length and Transfer-Encoding")
            return True, 0
        if not lengths:
            return False, 0
        if len(lengths) > 1:
            raise BodyError(f"conflicting Content-Length headers: {', '.join(sorted(lengths))}")
        text = lengths.pop()
        if not _DIGITS.fullmatch(text):
            raise BodyError(f"Content-Length {text[:40]!r} is not a number of bytes")
        length = int(text)
        if length > self.max_body_bytes:
            raise BodyError(
                f"the request body ({length} bytes) is longer than this server accepts ({self.max_body_bytes} bytes)",
                status=413,
            )
        return False, length

    def _read_exactly(self, length: int) -> bytes:
        if not length:
            return b""
        data = self.rfile.read(length)
        if len(data) != length:
            raise BodyError(f"the request body ended after {len(data)} of {length} bytes")
        return data

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            size_text = line.split(b";", 1)[0].strip()
            if not line.endswith(b"\n") or not _CHUNK_SIZE.fullmatch(size_text):
                raise BodyError(f"malformed chunk size line {line[:40]!r}")
            size = int(size_text, 16)
            if size == 0:
                for _ in range(_MAX_TRAILER_LINES):  # trailer fields, up to the blank line
                    if not self.rfile.readline(1024).strip():
                        return b"".join(parts)
                raise BodyError("too many trailer lines after the last chunk")
            total += size
            if total > self.max_body_bytes:
                raise BodyError(
                    f"the chunked request body is longer than this server accepts ({self.max_body_bytes} bytes)",
                    status=413,
                )
            parts.append(self._read_exactly(size))
            if self.rfile.readline(8).strip():
                raise BodyError("a chunk is longer than its size line says")

    def send_body(
        self,
        status: int,
        body: bytes,
        *,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Answer ``status`` with ``body``: ``Content-Type``, ``Content-Length``, then ``headers``."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        """Answer ``status`` with ``payload`` as JSON."""
        self.send_body(status, json.dumps(payload).encode(), headers=headers)

    def send_stream(
        self,
        status: int,
        parts: Iterable[bytes],
        *,
        content_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Answer ``status`` with a body sent part by part as ``parts`` yields it (chunked encoding).

        Each part goes out (and is flushed) as soon as it is produced. A client that goes
        away stops the iteration (``parts`` is closed) and the connection. An HTTP/1.0
        client gets the parts unframed and the connection closed at the end.
        """
        chunked = self.request_version != "HTTP/1.0"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        iterator = iter(parts)
        try:
            for part in iterator:
                if part:
                    self.wfile.write(b"%x\r\n%b\r\n" % (len(part), part) if chunked else part)
                    self.wfile.flush()
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except OSError:  # the client hung up
            self.close_connection = True
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()


def check_bearer(headers: Message, tokens: Iterable[str]) -> str:
    """The request's bearer token when it is one of ``tokens`` (compared in constant time).

    Raises:
        RequestRefused: (401, code ``unauthenticated``) no ``Authorization: Bearer <token>``
            header, or a token that is none of ``tokens``.
    """
    scheme, _, token = (headers.get("Authorization") or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise RequestRefused(401, "missing bearer token (Authorization: Bearer <token>)", code="unauthenticated")
    given = token.encode()
    if not any(hmac.compare_digest(given, known.encode()) for known in tokens if known):
        raise RequestRefused(401, "invalid bearer token", code="unauthenticated")
    return token
