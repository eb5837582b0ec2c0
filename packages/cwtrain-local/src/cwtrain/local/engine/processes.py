"""Engine replica processes: start, watch, hot-load, kill.

A :class:`ReplicaProcess` is one ``python -m cwtrain.local.engine.replica`` child (the replica
protocol: ``GET /health``, ``POST /admin/hotload``, ``GET /admin/weights``, the OpenAI
routes, each with the replica token) in its own process group, with its output in a log file. A background monitor
thread keeps :attr:`ReplicaProcess.health` fresh: fast while something is changing (the
replica is starting or loading a snapshot), slowly otherwise.

Every process started here is also recorded in a module-wide registry that an
``atexit`` hook kills, and the kernel kills it when the stack's process dies, SIGKILL
included (:func:`cwtrain.local.children.start_child`): nothing outlives the stack.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cwtrain.jsondoc import load_json
from cwtrain.local.children import start_child

__all__ = ["DEFAULT_REPLICA_COMMAND", "FAULT_KINDS", "TOKEN_VARIABLE", "ReplicaProcess", "kill_all"]

log = logging.getLogger("cwtrain.local.engine.processes")

#: The environment variable giving a replica the bearer token every request to it must carry.
TOKEN_VARIABLE = "CWTRAIN_LOCAL_REPLICA_TOKEN"
#: The faults a hot-load may ask a replica for (``"fault": {"kind"}``; :mod:`cwtrain.local.engine.replica`).
FAULT_KINDS = ("fail", "stay-behind", "serve-corrupt", "serve-previous")
#: argv prefix that starts one replica; the protocol's options are appended.
DEFAULT_REPLICA_COMMAND: tuple[str, ...] = (sys.executable, "-m", "cwtrain.local.engine.replica")

_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()


def _killpg(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def kill_all() -> None:
    """Kill every replica process group this interpreter started and has not reaped."""
    with _LIVE_LOCK:
        procs = list(_LIVE)
        _LIVE.clear()
    for proc in procs:
        _killpg(proc, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


atexit.register(kill_all)


class ReplicaProcess:
    """One engine replica child process and what it last said about itself.

    Args:
        name: the replica name (``--name``), also its row in hot-load listings.
        port: its loopback HTTP port.
        argv: the full command line.
        env: its environment.
        log_path: file receiving its stdout and stderr.
        on_change: called (from the monitor thread) when ``/health`` changes state or identity.
        token: the replica token sent on every request (``Authorization: Bearer``).
    """

    def __init__(
        self,
        name: str,
        port: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        on_change: Callable[[], None] | None = None,
        token: str | None = None,
    ) -> None:
        self.name = name
        self.token = token
        self.on_change = on_change
        self.port = port
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.started_at = time.monotonic()
        #: The last ``/health`` body with status 200, or ``None`` (down or still loading).
        self.health: dict[str, Any] | None = None
        #: Set once ``/health`` answered 200 at least once.
        self.ever_healthy = False
        #: Hot-load ids posted to this process.
        self.dispatched: set[str] = set()
        #: The hot-load id posted last (the only one the replica can still be loading).
        self.last_dispatched: str | None = None
        #: The hot-load id a cancel was last sent for.
        self.cancel_sent: str | None = None
        self.fast = threading.Event()
        self.fast.set()
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._monitor: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ReplicaProcess:
        """Start the process and its health monitor."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self._proc = start_child(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )
        with _LIVE_LOCK:
            _LIVE.add(self._proc)
        self._monitor = threading.Thread(target=self._watch, name=f"health-{self.name}", daemon=True)
        self._monitor.start()
        return self

    @property
    def pid(self) -> int | None:
        """The process id, if started."""
        return self._proc.pid if self._proc is not None else None

    def exit_code(self) -> int | None:
        """The exit status once the process ended, else ``None``."""
        return None if self._proc is None else self._proc.poll()

    def alive(self) -> bool:
        """Whether the process runs."""
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the replica's process group at once (fault injection)."""
        if self._proc is not None:
            _killpg(self._proc, signal.SIGKILL)

    def stop(self, timeout: float = 3.0) -> None:
        """Stop the monitor and the process group (SIGTERM, then SIGKILL)."""
        self.signal_stop()
        self.wait_stopped(timeout)

    def signal_stop(self) -> None:
        """First half of :meth:`stop`: ask the process to end, without waiting."""
        self._stop.set()
        self.fast.set()
        if self._proc is not None and self._proc.poll() is None:
            _killpg(self._proc, signal.SIGTERM)

    def wait_stopped(self, timeout: float = 3.0) -> None:
        """Second half of :meth:`stop`: wait, then SIGKILL what is left."""
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _killpg(proc, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            _killpg(proc, signal.SIGKILL)  # stragglers left in the group
            with _LIVE_LOCK:
                _LIVE.discard(proc)
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=2)
        self.health = None

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the replica's output (for error messages)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # ------------------------------------------------------------------ protocol

    def _request(self, method: str, path: str, body: Any = None, timeout: float = 2.0) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            raw = response.read()
            try:
                data = load_json(raw) if raw else {}
            except ValueError:
                data = {"raw": raw[:200].decode(errors="replace")}
            return response.status, data
        finally:
            conn.close()

    def poll_health(self) -> dict[str, Any] | None:
        """Ask ``/health`` once; updates :attr:`health` (``None`` unless 200)."""
        if not self.alive():
            self.health = None
            return None
        try:
            status, data = self._request("GET", "/health", timeout=2.0)
        except (OSError, http.client.HTTPException):
            return self.health if self.ever_healthy and self.alive() else None
        if status == 200 and isinstance(data, dict):
            self.health = data
            self.ever_healthy = True
        else:
            self.health = None
        return self.health

    def post_hot_load(
        self,
        hot_load_id: str,
        identity: str,
        chain: Sequence[Mapping[str, Any]],
        fault: Mapping[str, Any] | None = None,
    ) -> bool:
        """``POST /admin/hotload``; ``True`` when the replica accepted it (202).

        ``fault`` (tests) asks the replica to misbehave on this load (``{"kind", "reason"}``,
        see :mod:`cwtrain.local.engine.replica`).
        """
        body: dict[str, Any] = {
            "hot_load_id": hot_load_id,
            "identity": identity,
            "chain": [
                {"identity": link["identity"], "type": link["type"].removeprefix("SNAPSHOT_TYPE_")} for link in chain
            ],
        }
        if fault is not None:
            body["fault"] = dict(fault)
        try:
            status, data = self._request("POST", "/admin/hotload", body, timeout=5.0)
        except (OSError, http.client.HTTPException) as exc:
            log.debug("replica %s refused hot-load %s: %s", self.name, hot_load_id, exc)
            return False
        if status == 409:  # still busy with an earlier load; the supervisor asks again
            log.debug("replica %s is busy; hot-load %s waits: %s", self.name, hot_load_id, data)
            return False
        if status not in (200, 202):
            log.warning("replica %s answered hot-load %s with HTTP %s: %s", self.name, hot_load_id, status, data)
            return False
        self.dispatched.add(hot_load_id)
        self.last_dispatched = hot_load_id
        self.fast.set()
        if self.health is not None:  # what /health says next; avoids reading a stale READY
            self.health = {**self.health, "state": "UPDATING", "hot_load_id": hot_load_id}
        return True

    def cancel_hot_load(self, hot_load_id: str) -> bool:
        """``POST /admin/hotload/cancel`` (one attempt); ``True`` when the replica stopped loading it."""
        self.cancel_sent = hot_load_id
        try:
            status, data = self._request("POST", "/admin/hotload/cancel", {"hot_load_id": hot_load_id}, timeout=5.0)
        except (OSError, http.client.HTTPException) as exc:
            log.debug("replica %s: cancel of %s not sent: %s", self.name, hot_load_id, exc)
            return False
        self.fast.set()
        return status == 200 and isinstance(data, dict) and bool(data.get("canceled"))

    def _watch(self) -> None:
        seen: tuple[Any, ...] = ()
        while not self._stop.is_set():
            health = self.poll_health()
            now = (
                (None,) if health is None else (health.get("state"), health.get("identity"), health.get("hot_load_id"))
            )
            if now != seen and self.on_change is not None:
                self.on_change()
            seen = now
            busy = health is None or health.get("state") in ("UPDATING", "PENDING_UPDATE")
            if not busy:
                self.fast.clear()
            if not self.alive():
                return
            if busy or self.fast.is_set():
                self._stop.wait(0.03)
            else:
                self.fast.wait(0.5)
