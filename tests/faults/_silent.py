"""A loopback server that never answers: an object store, or a canary endpoint, gone quiet."""

from __future__ import annotations

import socket
import threading


class Silent:
    """A loopback server that accepts connections, reads what it is sent and never answers.

    An object store that never answers (``endpoint_url``), or a canary endpoint gone quiet (``url``).
    """

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._server.getsockname()[1]}"

    @property
    def url(self) -> str:
        """An OpenAI base URL on it."""
        return self.endpoint_url + "/v1"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._conns.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._server.close()
        for conn in self._conns:
            conn.close()
