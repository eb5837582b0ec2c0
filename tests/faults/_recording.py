"""Helpers of the bad-input and secrets rows: a loopback HTTP server that records every request,
an in-process CLI runner that captures stdout and stderr, and the shared hypothesis settings.

The recording server answers every request ``503 unavailable`` (so a client that did send
something fails fast) and keeps ``(method, path)`` of each one; a test asserts the list stayed
empty to prove that refused input never reached the network.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from cwtrain.cli import main

FUZZ = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
#: Examples that go through ``cwtrain.cli.main`` (each builds the parser: ~0.2 s).
FUZZ_CLI = settings(FUZZ, max_examples=20)
TOKEN = "t0k3n-bad-input"

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


class RecordingServer:
    """A loopback HTTP server recording ``(method, path)`` of every request it gets.

    Args:
        canned: ``GET`` paths answered ``200`` with the given JSON body instead of ``503``.
    """

    def __init__(self, canned: dict[str, Any] | None = None) -> None:
        self.requests: list[tuple[str, str]] = []
        self.canned = dict(canned or {})
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                owner.requests.append((self.command, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                canned = owner.canned.get(self.path) if self.command == "GET" else None
                answer = canned if canned is not None else {"code": "unavailable", "message": "recording server"}
                body = json.dumps(answer).encode()
                self.send_response(200 if canned is not None else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _record

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="recording-server", daemon=True)

    def __enter__(self) -> RecordingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _ThisThread(io.TextIOBase):
    """A stream that keeps what this thread writes and passes other threads' writes on.

    Servers of a local stack may still print from their threads (a broken pipe of a dropped
    connection); that is not the command's output.
    """

    def __init__(self, passthrough: Any) -> None:
        self.captured = io.StringIO()
        self._passthrough = passthrough
        self._owner = threading.get_ident()

    def write(self, text: str) -> int:
        target = self.captured if threading.get_ident() == self._owner else self._passthrough
        return target.write(text)  # type: ignore[no-any-return]

    def flush(self) -> None:
        self._passthrough.flush()


def run_cli(argv: Sequence[str]) -> tuple[int, str, str]:
    """``cwtrain.cli.main(argv)`` in-process: ``(exit code, stdout, stderr)`` of this thread."""
    out, err = _ThisThread(sys.stdout), _ThisThread(sys.stderr)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):  # type: ignore[type-var]
        code = main(list(argv))
    return code, out.captured.getvalue(), err.captured.getvalue()


def one_error_line(err: str) -> str:
    """The single ``error:`` line of a failed command (and no traceback)."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


def is_json_object(data: bytes) -> bool:
    """Whether ``data`` is UTF-8 JSON holding an object."""
    try:
        return isinstance(json.loads(data.decode("utf-8")), dict)
    except ValueError:
        return False
