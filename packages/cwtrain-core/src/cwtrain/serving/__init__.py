"""Guarded HTTP servers: credentials first, bounded bodies, bound to one address, in a background thread.

Every HTTP server cwtrain runs (the local stack's control plane, gateways and replicas;
NeMo-RL's Gym model endpoint) is built from these pieces, so each one checks credentials
before it reads a byte of a body, bounds bodies, and listens only where it is told::

    from cwtrain.serving import BackgroundServer, GuardedHTTPServer, JSONHandler, RequestRefused, check_bearer

    class Handler(JSONHandler):
        max_body_bytes = 4 << 20                      # longer bodies: 413, unread

        def authenticate(self) -> None:               # first step of read_body
            check_bearer(self.headers, self.server.tokens)

        def do_POST(self) -> None:
            try:
                raw = self.read_body()
            except RequestRefused as error:
                self.refuse(error)
                return
            self.send_json(200, {"got": len(raw)})

    server = BackgroundServer(GuardedHTTPServer("127.0.0.1", 0, Handler), name="api").start()
    print(server.url)          # http://127.0.0.1:<a free port>
    server.stop()              # stop serving, close the socket, join the thread

- :class:`JSONHandler`, :class:`RequestRefused`, :class:`BodyError`, :func:`check_bearer`:
  the handler side (:mod:`cwtrain.serving.handler` has the rules ``read_body`` applies).
- :class:`GuardedHTTPServer`, :class:`BackgroundServer`, :func:`bind_address` (listen only
  where callers are told to reach it), :func:`is_loopback`: the server side.
"""

from __future__ import annotations

from cwtrain.serving.handler import DEFAULT_MAX_BODY_BYTES, BodyError, JSONHandler, RequestRefused, check_bearer
from cwtrain.serving.server import LOOPBACK, BackgroundServer, GuardedHTTPServer, bind_address, is_loopback, url_host

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "LOOPBACK",
    "BackgroundServer",
    "BodyError",
    "GuardedHTTPServer",
    "JSONHandler",
    "RequestRefused",
    "bind_address",
    "check_bearer",
    "is_loopback",
    "url_host",
]
