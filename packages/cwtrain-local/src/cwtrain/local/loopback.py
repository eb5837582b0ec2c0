"""The local stack's servers listen on 127.0.0.1 only: :class:`LoopbackHTTPServer`.

The control plane, every gateway and every replica are :class:`cwtrain.serving.JSONHandler`
servers (credentials before a byte of a body, bounded bodies; see :mod:`cwtrain.serving`)
bound to loopback::

    server = BackgroundServer(LoopbackHTTPServer(0, Handler), name="api").start()
    print(server.url)          # http://127.0.0.1:<a free port>
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

from cwtrain.serving import LOOPBACK, GuardedHTTPServer

__all__ = ["LoopbackHTTPServer"]


class LoopbackHTTPServer(GuardedHTTPServer):
    """A :class:`~cwtrain.serving.GuardedHTTPServer` on ``127.0.0.1`` (port 0: a free one).

    Args:
        port: the port to listen on.
        handler: the request handler class.
    """

    def __init__(self, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(LOOPBACK, port, handler)
