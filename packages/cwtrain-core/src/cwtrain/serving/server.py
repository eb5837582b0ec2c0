"""The guarded server: threads that never keep the process alive, bound to one address, served in the background."""

from __future__ import annotations

import ipaddress
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

__all__ = ["LOOPBACK", "BackgroundServer", "GuardedHTTPServer", "bind_address", "is_loopback", "url_host"]

#: The IPv4 loopback address, where servers that only this machine calls listen.
LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) names this machine's loopback interface."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_address(advertise: str) -> str:
    """Where to listen so that callers of ``advertise`` reach the server, and no wider: the
    address itself for an IP address, loopback for ``localhost``, else the address the host
    name resolves to."""
    bare = advertise.strip("[]")
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        pass
    if is_loopback(bare):
        return LOOPBACK
    return socket.gethostbyname(bare)


def url_host(host: str) -> str:
    """``host`` as a URL writes it (an IPv6 address in brackets)."""
    bare = host.strip("[]")
    try:
        return f"[{bare}]" if ipaddress.ip_address(bare).version == 6 else bare
    except ValueError:
        return host


class GuardedHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server on one address (IPv4 or IPv6); port 0 takes a free one.

    Its request threads never keep the process alive, and its backlog takes bursts of
    parallel connections. It listens only where it is told: never every interface unless
    ``host`` says ``0.0.0.0`` or ``::``.

    Args:
        host: the address to listen on.
        port: the port (0: a free one).
        handler: the request handler class (a :class:`~cwtrain.serving.JSONHandler`).
    """

    daemon_threads = True
    request_queue_size = 128  # the default backlog (5) drops bursts of parallel connections

    def __init__(self, host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        bare = host.strip("[]")
        try:
            self.address_family = socket.AF_INET6 if ipaddress.ip_address(bare).version == 6 else socket.AF_INET
        except ValueError:  # a host name: the family of its first address
            self.address_family = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)[0][0]
        super().__init__((bare, port), handler)

    @property
    def host(self) -> str:
        """The address it listens on."""
        return str(self.server_address[0])

    @property
    def port(self) -> int:
        """The listening port."""
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        """``http://<host>:<port>``."""
        return f"http://{url_host(self.host)}:{self.port}"


class BackgroundServer:
    """Serves a :class:`GuardedHTTPServer` in a daemon thread (or in the caller's: :meth:`serve_forever`).

    ``with server:`` starts it and stops it on the way out.

    Args:
        server: the server (already listening).
        name: the thread's name.
    """

    def __init__(self, server: GuardedHTTPServer, name: str) -> None:
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=name, daemon=True)

    @property
    def host(self) -> str:
        """The address it listens on."""
        return self._server.host

    @property
    def port(self) -> int:
        """The listening port."""
        return self._server.port

    @property
    def url(self) -> str:
        """``http://<host>:<port>``."""
        return self._server.url

    def start(self) -> Self:
        """Serve in the background (a second call does nothing)."""
        if self._thread.ident is None:
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread instead, until interrupted (then :meth:`stop`)."""
        self._server.serve_forever()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        started = self._thread.is_alive()
        if started:
            self._server.shutdown()
        self._server.server_close()
        if started:
            self._thread.join(timeout=5)
