"""Fault injection for the local stack, so reliability is tested rather than hoped for.

Everything is reached through ``stack.faults`` (a :class:`Faults`):

API faults (:class:`APIFaults`, applied by the control plane before it routes a request;
``method`` and ``path`` narrow a rule: ``path`` is a regular expression searched in the
path after ``/v1alpha1/inference``, e.g. ``r"^/hotLoads$"``)::

    stack.faults.api.fail_next(2, code="unavailable")            # 503 {"code": "unavailable", ...}
    stack.faults.api.fail_next(1, code="internal", http_status=502, method="POST")
    stack.faults.api.delay_next(1, seconds=2.0, path=r"^/hotLoads")
    stack.faults.api.drop_next(1, method="POST", path=r"^/hotLoads$")  # acts, then closes without answering

Object store: clients reach moto through :class:`S3Proxy`, a loopback TCP proxy that can
cut a connection after K bytes sent upstream (an upload interrupted mid-body)::

    stack.faults.s3.cut_next(after_bytes=64 * 1024, count=1)

Replicas and stored bytes::

    stack.faults.kill_replica(deployment_id, index=0)             # SIGKILL now; restarted cold
    stack.faults.kill_replica_during_next_hot_load(deployment_id)
    stack.faults.flip_byte(bucket, key, offset=-1)                # corrupt one stored byte

A replica that misbehaves on one hot-load (:class:`ReplicaFaults`, at ``stack.faults.replicas``;
``identity`` picks the hot-load of one version, else the next one that reaches the replica;
``n`` how many hot-loads it affects; ``deployment_id`` narrows it to one deployment)::

    stack.faults.replicas.fail_load(index=1)                      # ERROR with a reason: the hot-load FAILED
    stack.faults.replicas.stay_behind(index=1, identity="run-v000007")  # says done, serves the old identity
    stack.faults.replicas.serve_wrong_weights(index=1, weights="corrupt")  # new identity, corrupted lm_head
    stack.faults.replicas.serve_wrong_weights(index=1, weights="previous")  # new identity, the old weights

The replica still reads and verifies the snapshot; only what it does afterwards is wrong (see
:mod:`cwtrain.local.engine.replica`). After a FAILED hot-load the replicas that switched keep
serving the new identity beside the one that failed (no rollback,
:mod:`cwtrain.local.controlplane.supervisor`), so the fleet serves a mix until a later hot-load.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cwtrain.errors import UsageError
from cwtrain.local.controlplane.supervisor import ReplicaFault

if TYPE_CHECKING:
    from cwtrain.local.controlplane.supervisor import Supervisor

__all__ = ["APIFaults", "Fault", "Faults", "ReplicaFaults", "S3Proxy"]


@dataclass
class Fault:
    """One armed API fault rule.

    Attributes:
        kind: ``"fail"`` (answer an error without acting), ``"delay"`` (sleep, then go on)
            or ``"drop"`` (act, then close the connection without an answer).
        remaining: how many more matching calls it affects.
        method: HTTP method to match, or ``None`` for any.
        path: regular expression searched in the API path, or ``None`` for any.
        code: Connect code of a ``fail``.
        http_status: HTTP status of a ``fail`` (the code's usual one when ``None``).
        message: message of a ``fail``.
        seconds: sleep of a ``delay``.
    """

    kind: str
    remaining: int
    method: str | None = None
    path: str | None = None
    code: str = "unavailable"
    http_status: int | None = None
    message: str = "injected fault"
    seconds: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        """Whether this rule applies to ``method path``."""
        if self.method is not None and self.method.upper() != method.upper():
            return False
        return self.path is None or re.search(self.path, path) is not None


class APIFaults:
    """Armed API faults; thread-safe. The control plane calls :meth:`take` per request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[Fault] = []
        #: Every fault that fired, as ``(kind, method, path)``.
        self.fired: list[tuple[str, str, str]] = []

    def _arm(self, fault: Fault) -> Fault:
        if fault.remaining < 1:
            raise UsageError(f"a fault needs n >= 1 (got {fault.remaining})")
        with self._lock:
            self._rules.append(fault)
        return fault

    def fail_next(
        self,
        n: int = 1,
        *,
        code: str = "unavailable",
        http_status: int | None = None,
        message: str | None = None,
        method: str | None = None,
        path: str | None = None,
    ) -> Fault:
        """Answer the next ``n`` matching calls with an error, without acting on them."""
        text = message or f"injected fault: {code}"
        return self._arm(Fault("fail", n, method, path, code=code, http_status=http_status, message=text))

    def delay_next(
        self, n: int = 1, seconds: float = 1.0, *, method: str | None = None, path: str | None = None
    ) -> Fault:
        """Sleep ``seconds`` before handling each of the next ``n`` matching calls."""
        return self._arm(Fault("delay", n, method, path, seconds=seconds))

    def drop_next(self, n: int = 1, *, method: str | None = None, path: str | None = None) -> Fault:
        """Act on the next ``n`` matching calls, then close the connection without answering."""
        return self._arm(Fault("drop", n, method, path))

    def clear(self) -> None:
        """Disarm every rule."""
        with self._lock:
            self._rules.clear()

    def pending(self) -> list[Fault]:
        """Rules still armed."""
        with self._lock:
            return list(self._rules)

    def take(self, method: str, path: str) -> list[Fault]:
        """The rules that fire for this call (at most one per kind); counts are consumed."""
        fired: list[Fault] = []
        with self._lock:
            for rule in list(self._rules):
                if rule.kind in {f.kind for f in fired} or not rule.matches(method, path):
                    continue
                rule.remaining -= 1
                if rule.remaining <= 0:
                    self._rules.remove(rule)
                fired.append(rule)
                self.fired.append((rule.kind, method, path))
        return fired


class S3Proxy:
    """A loopback TCP proxy in front of the object store that can cut connections.

    Args:
        target_port: the object store's port on 127.0.0.1.
        port: the proxy's port (a free one when 0).
    """

    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", port))
        self._listener.settimeout(0.2)
        self._lock = threading.Lock()
        self._cuts: list[int] = []  # byte thresholds, one per connection to cut
        self._conns: set[socket.socket] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="s3-proxy", daemon=True)
        #: How many connections were cut.
        self.cut_count = 0

    @property
    def port(self) -> int:
        """The proxy's port."""
        return int(self._listener.getsockname()[1])

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``: what clients use as the S3 endpoint."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Proxy:
        """Accept connections in the background."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and close every open connection."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.close()

    def cut_next(self, after_bytes: int, count: int = 1) -> None:
        """Cut the next ``count`` connections that send more than ``after_bytes`` upstream.

        Bytes are counted per connection from the moment this is called; a connection
        past the threshold is closed in both directions, so an upload in it fails
        mid-body.
        """
        if after_bytes < 0 or count < 1:
            raise UsageError("cut_next needs after_bytes >= 0 and count >= 1")
        with self._lock:
            self._cuts.extend([after_bytes] * count)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self._conns.update((client, upstream))
            sent = [0]
            threading.Thread(target=self._pump, args=(client, upstream, sent, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, sent, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, sent: list[int], upstream: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if upstream and self._should_cut(sent, len(data)):
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)

    def _should_cut(self, sent: list[int], size: int) -> bool:
        with self._lock:
            if not self._cuts:
                sent[0] = 0
                return False
            sent[0] += size
            if sent[0] > self._cuts[0]:
                self._cuts.pop(0)
                self.cut_count += 1
                return True
        return False


class ReplicaFaults:
    """Replicas that misbehave on a hot-load; the supervisor applies each when it dispatches one.

    Every method arms a rule for replica ``index`` (its position in the deployment) and
    returns it; ``identity`` limits it to the hot-load of that identity (a version of a run:
    ``version_identity(run_id, 7)``), else it takes the next hot-load dispatched to the
    replica; ``n`` is how many hot-loads it affects; ``deployment_id`` limits it to one
    deployment. Catch-ups of a restarted replica are never affected.
    """

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    def _arm(
        self, kind: str, index: int, deployment_id: str | None, identity: str | None, n: int, **extra: Any
    ) -> ReplicaFault:
        return self._supervisor.arm_replica_fault(
            ReplicaFault(kind, index, deployment_id=deployment_id, identity=identity, remaining=n, **extra)
        )

    def fail_load(
        self,
        index: int = 0,
        *,
        deployment_id: str | None = None,
        identity: str | None = None,
        n: int = 1,
        reason: str | None = None,
    ) -> ReplicaFault:
        """The replica's load ends in ERROR with ``reason`` (default: it names the replica and the identity).

        It keeps serving its previous weights; the hot-load ends FAILED with the reason once
        the other replicas are done, and those that switched keep serving the new identity.
        """
        return self._arm("fail", index, deployment_id, identity, n, reason=reason)

    def stay_behind(
        self, index: int = 0, *, deployment_id: str | None = None, identity: str | None = None, n: int = 1
    ) -> ReplicaFault:
        """The replica reports the hot-load done but keeps serving its previous weights and identity.

        The hot-load ends COMPLETED; the replica's row names the identity it really serves
        (so a verification finds it not caught up) and the gateway keeps routing to it.
        """
        return self._arm("stay-behind", index, deployment_id, identity, n)

    def serve_wrong_weights(
        self,
        index: int = 0,
        *,
        weights: str = "corrupt",
        deployment_id: str | None = None,
        identity: str | None = None,
        n: int = 1,
    ) -> ReplicaFault:
        """The replica serves other weights than the snapshot's under the snapshot's identity.

        Args:
            index: the replica.
            weights: ``"corrupt"`` (the snapshot with ``lm_head.weight`` corrupted, as a stored
                FULL with flipped bytes read without its checksums) or ``"previous"`` (the
                weights it served before, as a replica that never applied the snapshot).
            deployment_id: only this deployment's hot-loads.
            identity: only the hot-load of this identity.
            n: how many hot-loads it affects.
        """
        kinds = {"corrupt": "serve-corrupt", "previous": "serve-previous"}
        if weights not in kinds:
            raise UsageError(f"serve_wrong_weights(weights={weights!r}): choose 'corrupt' or 'previous'")
        return self._arm(kinds[weights], index, deployment_id, identity, n)

    def pending(self) -> list[ReplicaFault]:
        """Rules still armed."""
        return self._supervisor.replica_faults()

    @property
    def fired(self) -> list[tuple[str, str, str]]:
        """Every fault that fired: ``(kind, replica name, identity)``."""
        return self._supervisor.replica_faults_fired()

    def clear(self) -> None:
        """Disarm every rule and forget those that fired."""
        self._supervisor.clear_replica_faults()


class Faults:
    """The fault hooks of one local stack.

    Attributes:
        api: faults of the control plane API.
        s3: the object-store proxy (``None`` when the stack runs without one).
        replicas: replicas that misbehave on a hot-load.
    """

    def __init__(self, api: APIFaults, s3: S3Proxy | None, supervisor: Supervisor, s3_client: Any) -> None:
        self.api = api
        self.s3 = s3
        self.replicas = ReplicaFaults(supervisor)
        self._supervisor = supervisor
        self._s3_client = s3_client

    def kill_replica(self, deployment_id: str, index: int = 0) -> str:
        """SIGKILL replica ``index`` of a deployment now; the stack restarts it cold. Returns its name."""
        return self._supervisor.kill_replica(deployment_id, index)

    def kill_replica_during_next_hot_load(self, deployment_id: str | None = None, index: int = 0) -> None:
        """SIGKILL replica ``index`` right after the next hot-load reached it."""
        self._supervisor.kill_during_next_hot_load(deployment_id, index)

    def flip_byte(self, bucket: str, key: str, offset: int = -1) -> int:
        """Invert one byte of a stored object (rewritten in place); returns the absolute offset.

        Args:
            bucket: the bucket.
            key: the object key.
            offset: the byte to flip; negative counts from the end (default: the last byte).
        """
        obj = self._s3_client.get_object(Bucket=bucket, Key=key)
        data = bytearray(obj["Body"].read())
        if not data:
            raise UsageError(f"s3://{bucket}/{key} is empty; nothing to corrupt")
        position = offset % len(data)
        data[position] ^= 0xFF
        self._s3_client.put_object(Bucket=bucket, Key=key, Body=bytes(data), Metadata=obj.get("Metadata") or {})
        return position
