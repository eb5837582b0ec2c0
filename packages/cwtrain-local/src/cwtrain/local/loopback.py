"""HTTP on 127.0.0.1 for the local stack's servers: one handler base, one server, one thread.

The control plane, every gateway and every replica answer over HTTP/1.1 on loopback;
this module is what they share::

    class Handler(JSONHandler):
        def do_GET(self) -> None:
            self.send_json(200, {"ok": True})

    server = BackgroundServer(LoopbackHTTPServer(0, Handler), name="api").start()
    print(server.url)          # http://127.0.0.1:<a free port>
    server.stop()              # stop serving, close the socket, join the thread

- :class:`JSONHandler`: keep-alive HTTP/1.1 with Nagle off, ``read_body``, ``send_body``,
  ``send_json`` (``Content-Type`` and ``Content-Length`` first, then any extra headers).
- :class:`LoopbackHTTPServer`: a threading server on ``127.0.0.1`` whose request threads
  never keep the process alive, with a backlog for bursts of connections.
- :class:`BackgroundServer`: serves one in a daemon thread (``start``/``stop``, ``port``, ``url``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["BackgroundServer", "JSONHandler", "LoopbackHTTPServer"]


class JSONHandler(BaseHTTPRequestHandler):
    """A request handler that answers with whole bodies of known length."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stall

    def read_body(self) -> bytes:
        """The request body (``Content-Length`` bytes; empty without one)."""
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

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


class LoopbackHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server on ``127.0.0.1`` (port 0: a free one).

    Args:
        port: the port to listen on.
        handler: the request handler class.
    """

    daemon_threads = True
    request_queue_size = 128  # the default backlog (5) drops bursts of parallel connections

    def __init__(self, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", port), handler)

    @property
    def port(self) -> int:
        """The listening port."""
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"


class BackgroundServer:
    """Serves a :class:`LoopbackHTTPServer` in a daemon thread.

    Args:
        server: the server (already listening).
        name: the thread's name.
    """

    def __init__(self, server: LoopbackHTTPServer, name: str) -> None:
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=name, daemon=True)

    @property
    def port(self) -> int:
        """The listening port."""
        return self._server.port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return self._server.url

    def start(self) -> Self:
        """Serve in the background."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
