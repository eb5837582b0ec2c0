"""The reconciler: makes processes match the control plane's records, and records match processes.

:class:`Supervisor` runs one background thread that, on every change (and at least every
quarter second), for each

- **gateway**: starts its inference gateway server (CREATING → READY with
  ``status.endpoints``) or stops it (DELETING → gone);
- **deployment**: keeps ``autoscaling.min`` replica processes (at least one) running,
  restarting a dead one cold (copying weights from a serving peer when one exists, else
  from the base weights, then replaying the current chain); marks it READY once every
  replica answered; removes it once DELETING stopped its replicas;
- **hot-load**: dispatches it to every replica (PENDING → IN_PROGRESS), mirrors each
  replica's ``/health`` into the hot-load's replica rows, and ends it COMPLETED when every
  replica serves the identity, FAILED (with the replicas' reasons) when one reported
  ERROR and the others are done, or FAILED after ``hot_load_timeout``. A hot-load canceled
  while replicas load it is canceled on them too (``/admin/hotload/cancel``): they keep
  serving what they served.

A replica is *routable* (the gateway sends it requests) once it answered ``/health`` and
serves the deployment's current identity or the active hot-load's, or reported the current
hot-load done; a cold replica catching up is not. There is no rollback: after a hot-load
that ended FAILED or CANCELED, a replica that had switched to its identity keeps serving it
(and stays routable) beside the others until a later hot-load reaches every replica, so the
fleet serves a mix, as a fleet whose replicas switch one by one does. A catch-up that fails (a stored object of the current chain is
corrupt or gone, the store did not answer) is retried with a growing pause (2 s to 60 s).

A READY deployment that no replica serves any more becomes STATUS_ERROR, and its Ready
condition says why, replica by replica: restarting (with how it exited), starting, catching
up, or unable to load the current weights (with the replica's reason). STATUS_ERROR is
recoverable: hot-loads are accepted in it (:mod:`cwtrain.local.controlplane.state`), so hot-loading an
intact snapshot (``cwtrain hotload rollback --identity <an earlier identity>``, or
``cwtrain hotload trigger`` of a stored FULL snapshot) brings the replicas back and the
deployment back to READY.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cwtrain.errors import UsageError
from cwtrain.local.controlplane.records import DeploymentRecord, HotLoadRecord, ReplicaRecord
from cwtrain.local.controlplane.resources import now
from cwtrain.local.controlplane.state import ControlPlaneState
from cwtrain.local.engine.processes import DEFAULT_REPLICA_COMMAND, FAULT_KINDS, TOKEN_VARIABLE, ReplicaProcess
from cwtrain.local.harness.objectstore import free_port

__all__ = ["ReplicaFault", "Supervisor"]

log = logging.getLogger("cwtrain.local.controlplane.supervisor")

_MAX_START_FAILURES = 3
_CATCH_UP_RETRY = (2.0, 60.0)  # first pause and cap, doubling, between attempts of a failed catch-up


@dataclass
class Slot:
    """One replica position of a deployment; its process is replaced when it dies."""

    name: str
    process: ReplicaProcess | None = None
    generation: int = 0
    start_failures: int = 0
    catch_up: str | None = None  # hot-load id sent to bring a cold replica up to date
    catch_up_failures: int = 0
    catch_up_retry_at: float = 0.0  # monotonic time of the next attempt after a failed catch-up
    last_exit: str = ""

    def health(self) -> dict[str, Any] | None:
        """The process's latest ``/health`` body (``None`` when down or loading)."""
        return self.process.health if self.process is not None and self.process.alive() else None


@dataclass(eq=False)
class ReplicaFault:
    """A fault armed for the next hot-load(s) that reach one replica (see :mod:`cwtrain.local.engine.replica`).

    Attributes:
        kind: one of :data:`cwtrain.local.engine.processes.FAULT_KINDS`.
        index: the replica's position in its deployment.
        deployment_id: the deployment (``None``: any).
        identity: only a hot-load of this identity (``None``: the next one dispatched).
        remaining: how many more hot-loads it affects.
        reason: the failure reason of a ``fail``.
    """

    kind: str
    index: int
    deployment_id: str | None = None
    identity: str | None = None
    remaining: int = 1
    reason: str | None = None

    def matches(self, deployment_id: str, index: int, identity: str) -> bool:
        """Whether it applies to the hot-load of ``identity`` dispatched to replica ``index``."""
        return self.index == index and self.deployment_id in (None, deployment_id) and self.identity in (None, identity)


@dataclass
class _Hooks:
    kill_on_dispatch: list[tuple[str | None, int]] = field(default_factory=list)
    replica_faults: list[ReplicaFault] = field(default_factory=list)
    #: Every replica fault that fired, as ``(kind, replica name, identity)``.
    fired: list[tuple[str, str, str]] = field(default_factory=list)


class Supervisor:
    """Reconciles a :class:`ControlPlaneState` with processes and gateway servers.

    Args:
        state: the records to act on.
        s3_endpoint: the object store URL replicas read from.
        s3_env: credentials and region given to replica processes.
        workdir: directory for replica logs.
        replica_command: argv prefix starting a replica (default ``python -m cwtrain.local.engine.replica``).
        start_gateway: ``(gateway_id) -> (url, stop)`` starting one gateway server.
        hot_load_timeout: seconds after which an unfinished hot-load fails.
        replica_token: the token replicas accept (given to them in
            ``CWTRAIN_LOCAL_REPLICA_TOKEN`` and sent on every request to them).
        hot_load_delay: seconds every hot-load lasts more on every replica (``--apply-delay``;
            the slow hot-load of ``cwtrain local up --slow-hot-load``).
    """

    def __init__(
        self,
        state: ControlPlaneState,
        *,
        s3_endpoint: str,
        s3_env: dict[str, str],
        workdir: Path,
        replica_command: Sequence[str] = DEFAULT_REPLICA_COMMAND,
        start_gateway: Callable[[str], tuple[str, Callable[[], None]]] | None = None,
        hot_load_timeout: float = 600.0,
        replica_token: str,
        hot_load_delay: float = 0.0,
    ) -> None:
        self.state = state
        self.hot_load_delay = hot_load_delay
        self.replica_token = replica_token
        self.s3_endpoint = s3_endpoint
        self.s3_env = dict(s3_env)
        self.workdir = workdir
        self.replica_command = list(replica_command)
        self.start_gateway = start_gateway
        self.hot_load_timeout = hot_load_timeout
        self.slots: dict[str, list[Slot]] = {}
        self._gateway_stops: dict[str, Callable[[], None]] = {}
        self._hooks = _Hooks()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rr = itertools.count()

    # ------------------------------------------------------------------ running

    def start(self) -> Supervisor:
        """Start the reconciler thread."""
        self._thread = threading.Thread(target=self._run, name="cwtrain-local-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, every replica and every gateway server."""
        self._stop.set()
        with self.state.lock:
            self.state.changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        procs = [s.process for slots in self.slots.values() for s in slots if s.process is not None]
        for proc in procs:
            proc.signal_stop()
        for proc in procs:
            proc.wait_stopped()
        self.slots.clear()
        for stop in self._gateway_stops.values():
            stop()
        self._gateway_stops.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            busy = False
            try:
                busy = self.tick()
            except Exception:
                log.exception("local control plane reconciler failed; retrying")
            with self.state.lock:
                if not self._stop.is_set():
                    self.state.changed.wait(0.02 if busy else 0.25)

    def tick(self) -> bool:
        """One reconciliation pass; ``True`` while something is still changing."""
        busy = self._gateways()
        with self.state.lock:
            deployments = list(self.state.deployments.values())
        for deployment in deployments:
            busy = self._deployment(deployment) or busy
        return busy

    # ----------------------------------------------------------------- gateways

    def _gateways(self) -> bool:
        busy = False
        with self.state.lock:
            gateways = list(self.state.gateways.values())
        for gateway in gateways:
            if gateway.status == "STATUS_CREATING":
                busy = True
                url = "http://127.0.0.1:0"
                if self.start_gateway is not None:
                    url, stop = self.start_gateway(gateway.id)
                    self._gateway_stops[gateway.id] = stop
                with self.state.lock:
                    gateway.endpoints = [url]
                    gateway.status, gateway.updated_at = "STATUS_READY", now()
            elif gateway.status == "STATUS_DELETING":
                busy = True
                stop_gateway = self._gateway_stops.pop(gateway.id, None)
                if stop_gateway is not None:
                    stop_gateway()
                with self.state.lock:
                    self.state.gateways.pop(gateway.id, None)
        return busy

    # -------------------------------------------------------------- deployments

    def _deployment(self, deployment: DeploymentRecord) -> bool:
        slots = self.slots.setdefault(deployment.id, [])
        if deployment.status == "STATUS_DELETING":
            for slot in slots:
                if slot.process is not None:
                    slot.process.signal_stop()
            for slot in slots:
                if slot.process is not None:
                    slot.process.wait_stopped()
            self.slots.pop(deployment.id, None)
            with self.state.lock:
                self.state.deployments.pop(deployment.id, None)
            return True
        busy = False
        while len(slots) < deployment.replica_count:
            slots.append(Slot(name=f"{deployment.spec['name']}-{len(slots)}"))
        while len(slots) > deployment.replica_count:
            extra = slots.pop()
            if extra.process is not None:
                extra.process.stop()
        for index, slot in enumerate(slots):
            busy = self._keep_running(deployment, slot, slots, index) or busy
        busy = self._hot_loads(deployment, slots) or busy
        self._cancel_on_replicas(slots)
        self._catch_up(deployment, slots)
        return self._deployment_status(deployment, slots) or busy

    def _keep_running(self, deployment: DeploymentRecord, slot: Slot, slots: list[Slot], index: int) -> bool:
        proc = slot.process
        if proc is not None and proc.alive():
            if proc.ever_healthy:
                slot.start_failures = 0
            return not proc.ever_healthy
        if proc is not None:
            code = proc.exit_code()
            slot.last_exit = f"exited with code {code}: {proc.log_tail(5)}"
            if not proc.ever_healthy:
                slot.start_failures += 1
            log.warning("replica %s of deployment %s %s; restarting it cold", slot.name, deployment.id, slot.last_exit)
            proc.stop(timeout=0.5)
            slot.process = None
        if slot.start_failures >= _MAX_START_FAILURES:
            return False
        peer = self._peer(deployment, slots, exclude=slot)
        slot.generation += 1
        slot.catch_up, slot.catch_up_failures, slot.catch_up_retry_at = None, 0, 0.0
        slot.process = self._spawn(deployment, slot, peer).start()
        return True

    def _serving(self, deployment: DeploymentRecord) -> set[str]:
        """Identities a routable replica may serve: the current one, the active hot-load's, and stranded ones."""
        active = self.state.active_hot_load(deployment.id)
        current = {deployment.current_identity} | ({active.spec["identity"]} if active is not None else set())
        return current | self._stranded(deployment)

    def _stranded(self, deployment: DeploymentRecord) -> set[str]:
        """Identities of hot-loads that ended FAILED or CANCELED after the current one (no rollback)."""
        with self.state.lock:
            current = self.state.hot_loads.get(deployment.current_hot_load_id or "")
            after = current.seq if current is not None else -1
            return {
                r.spec["identity"]
                for r in self.state.hot_loads.values()
                if r.spec["deploymentId"] == deployment.id
                and r.terminal
                and r.state != "HOT_LOAD_STATE_COMPLETED"
                and r.seq > after
            }

    def _takes_traffic(self, deployment: DeploymentRecord, slot: Slot, serving: set[str]) -> bool:
        """Whether the replica is routable: up, not catching up, and serving (or said it serves) the weights."""
        health = slot.health()
        if slot.process is None or slot.catch_up is not None or health is None:
            return False
        if health.get("identity") in serving:
            return True
        claimed = health.get("completed_hot_load_id")
        return claimed is not None and claimed == deployment.current_hot_load_id and health.get("state") == "READY"

    def _peer(self, deployment: DeploymentRecord, slots: list[Slot], exclude: Slot) -> str | None:
        serving = self._serving(deployment)
        for other in slots:
            health = other.health()
            if other is exclude or other.process is None or health is None:
                continue
            if health.get("identity") in serving and other.catch_up is None:
                return other.process.url
        return None

    def _spawn(self, deployment: DeploymentRecord, slot: Slot, peer: str | None) -> ReplicaProcess:
        spec = deployment.spec
        hot_load = spec.get("hotLoad") or {}
        port = free_port()
        argv = [
            *self.replica_command,
            "--name", slot.name,
            "--port", str(port),
            "--s3-endpoint", self.s3_endpoint,
            "--bucket", str(hot_load.get("bucket") or spec["model"]["bucket"]),
            "--path-prefix", str(hot_load.get("pathPrefix", "")).strip("/"),
            "--model-name", str(spec["model"]["name"]),
            "--model-bucket", str(spec["model"]["bucket"]),
            "--model-path", str(spec["model"]["path"]).strip("/"),
        ]  # fmt: skip
        if peer:
            argv += ["--peer", peer]
        if self.hot_load_delay > 0:
            argv += ["--apply-delay", f"{self.hot_load_delay:g}"]
        env = {**os.environ, **self.s3_env, "PYTHONUNBUFFERED": "1", TOKEN_VARIABLE: self.replica_token}
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("MKL_NUM_THREADS", "1")
        log_path = self.workdir / f"replica-{slot.name}-{slot.generation}.log"
        log.info("starting replica %s on port %d%s", slot.name, port, f" (copying from {peer})" if peer else "")
        return ReplicaProcess(slot.name, port, argv, env, log_path, on_change=self._notify, token=self.replica_token)

    def _notify(self) -> None:
        with self.state.lock:
            self.state.changed.notify_all()

    def _catch_up(self, deployment: DeploymentRecord, slots: list[Slot]) -> None:
        """Bring a cold replica to the deployment's current identity (no hot-load active)."""
        if self.state.active_hot_load(deployment.id) is not None or deployment.current_hot_load_id is None:
            return
        stranded = self._stranded(deployment)
        for slot in slots:
            health = slot.health()
            if health is None or slot.process is None:
                continue
            claimed = health.get("completed_hot_load_id") == deployment.current_hot_load_id
            if health.get("identity") == deployment.current_identity or (slot.catch_up is None and claimed):
                slot.catch_up, slot.catch_up_failures, slot.catch_up_retry_at = None, 0, 0.0  # serving (even in ERROR)
                continue
            if slot.catch_up is None and health.get("identity") in stranded:
                continue  # switched to a hot-load that then failed: no rollback, it keeps serving it
            if slot.catch_up is not None and self._catch_up_failed(slot, health):
                if time.monotonic() < slot.catch_up_retry_at:
                    continue
                log.info("replica %s: retrying the catch-up to %s", slot.name, deployment.current_identity)
                slot.catch_up, slot.catch_up_retry_at = None, 0.0
            if slot.catch_up is None:
                hot_load_id = deployment.current_hot_load_id
                if slot.process.post_hot_load(hot_load_id, deployment.current_identity, deployment.current_chain):
                    slot.catch_up = hot_load_id

    @staticmethod
    def _catch_up_failed(slot: Slot, health: dict[str, Any]) -> bool:
        """Whether the replica reported its catch-up failed; the first time, schedules the retry."""
        if health.get("state") != "ERROR" or health.get("hot_load_id") != slot.catch_up:
            return False
        if slot.catch_up_retry_at <= 0:
            first, cap = _CATCH_UP_RETRY
            slot.catch_up_failures += 1
            pause = min(cap, first * 2 ** (slot.catch_up_failures - 1))
            slot.catch_up_retry_at = time.monotonic() + pause
            log.warning(
                "replica %s cannot catch up (%s); retrying in %.0f s", slot.name, health.get("error_reason"), pause
            )
        return True

    def _deployment_status(self, deployment: DeploymentRecord, slots: list[Slot]) -> bool:
        serving = self._serving(deployment)
        ready = sum(1 for s in slots if self._takes_traffic(deployment, s, serving))
        failed = [s for s in slots if s.start_failures >= _MAX_START_FAILURES]
        with self.state.lock:
            deployment.ready_replicas = ready
            if deployment.status in ("STATUS_CREATING", "STATUS_FAILED") and failed:
                deployment.set_status(
                    "STATUS_FAILED", f"replica {failed[0].name} failed to start: {failed[0].last_exit}"
                )
            elif deployment.status == "STATUS_CREATING":
                if ready == len(slots):
                    deployment.set_status("STATUS_READY", f"{ready}/{len(slots)} replicas ready")
                    return True
            elif deployment.status in ("STATUS_READY", "STATUS_ERROR"):
                if ready == 0:
                    deployment.set_status("STATUS_ERROR", self._not_serving(deployment, slots))
                else:
                    deployment.set_status("STATUS_READY", f"{ready}/{len(slots)} replicas ready")
        return deployment.status == "STATUS_CREATING"

    def _not_serving(self, deployment: DeploymentRecord, slots: list[Slot]) -> str:
        """Why no replica serves the deployment's weights, replica by replica, and the way back."""
        current = deployment.current_identity
        reasons: list[str] = []
        cannot_load = False
        for slot in slots:
            proc, health = slot.process, slot.health()
            if slot.start_failures >= _MAX_START_FAILURES:
                reasons.append(f"replica {slot.name} failed to start {slot.start_failures} times ({slot.last_exit})")
            elif proc is None or not proc.alive():
                reasons.append(
                    f"replica {slot.name} is restarting" + (f" (it {slot.last_exit})" if slot.last_exit else "")
                )
            elif health is None:
                reasons.append(f"replica {slot.name} is starting (loading its first weights)")
            elif slot.catch_up is not None and health.get("state") == "ERROR":
                cannot_load = True
                reasons.append(
                    f"replica {slot.name} serves {health.get('identity')!r} and cannot load {current!r} "
                    f"(attempt {slot.catch_up_failures}): {health.get('error_reason') or 'unknown error'}"
                )
            elif slot.catch_up is not None:
                reasons.append(f"replica {slot.name} is catching up from {health.get('identity')!r} to {current!r}")
            else:
                reasons.append(f"replica {slot.name} serves {health.get('identity')!r}, not {current!r}")
        message = f"no replica serves {current!r}: " + "; ".join(reasons)
        active = self.state.active_hot_load(deployment.id)
        if active is not None:
            message += f"; hot-load {active.id} of {active.spec['identity']!r} is in progress"
        elif cannot_load:
            message += (
                "; to recover, hot-load an intact snapshot (hot-loads are accepted in STATUS_ERROR): "
                "`cwtrain hotload rollback --identity <an earlier identity>` or `cwtrain hotload trigger` of a "
                "stored FULL snapshot"
            )
        return message

    def routes(self, deployment_id: str) -> list[str]:
        """URLs of the deployment's routable replicas, rotated for round-robin."""
        with self.state.lock:
            deployment = self.state.deployments.get(deployment_id)
            if deployment is None:
                return []
        serving = self._serving(deployment)
        urls = [
            s.process.url
            for s in list(self.slots.get(deployment_id, []))
            if s.process is not None and self._takes_traffic(deployment, s, serving)
        ]
        if len(urls) > 1:
            shift = next(self._rr) % len(urls)
            urls = urls[shift:] + urls[:shift]
        return urls

    # ----------------------------------------------------------------- hot-loads

    def _hot_loads(self, deployment: DeploymentRecord, slots: list[Slot]) -> bool:
        record = self.state.active_hot_load(deployment.id)
        if record is None:
            return False
        target = record.spec["identity"]
        chain = record.spec["snapshotChain"]
        for index, slot in enumerate(slots):
            health = slot.health()
            proc = slot.process
            if health is None or proc is None or record.id in proc.dispatched:
                continue
            if health.get("identity") == target and health.get("state") == "READY":
                continue
            fault = self._replica_fault(deployment.id, index, target)
            wire = None if fault is None else {"kind": fault.kind, "reason": fault.reason}
            if proc.post_hot_load(record.id, target, chain, fault=wire):
                slot.catch_up = None
                if fault is not None:
                    self._consume_replica_fault(fault, slot.name, target)
                self._fire_kill_hooks(deployment, slot, index)
        with self.state.lock:
            if record.terminal:  # canceled meanwhile
                return True
            if record.state == "HOT_LOAD_STATE_PENDING":
                record.set_state("HOT_LOAD_STATE_IN_PROGRESS", "replicas loading the snapshot")
            self._update_rows(record, deployment, slots)
            self._finish(record, deployment, slots)
        return True

    def _cancel_on_replicas(self, slots: list[Slot]) -> None:
        """Tell each replica still loading a canceled hot-load to stop (once per hot-load)."""
        for slot in slots:
            proc = slot.process
            loading = proc.last_dispatched if proc is not None else None
            if proc is None or loading is None or proc.cancel_sent == loading:
                continue
            with self.state.lock:
                record = self.state.hot_loads.get(loading)
                canceled = record is not None and record.state == "HOT_LOAD_STATE_CANCELED"
            if canceled:
                stopped = proc.cancel_hot_load(loading)
                log.info("replica %s: hot-load %s canceled%s", slot.name, loading, "" if stopped else " (already done)")

    def _update_rows(self, record: HotLoadRecord, deployment: DeploymentRecord, slots: list[Slot]) -> None:
        target = record.spec["identity"]
        for slot in slots:
            row = record.replicas.get(slot.name)
            if row is None:
                row = record.replicas[slot.name] = ReplicaRecord(slot.name, deployment.zone)
            health = slot.health()
            if health is None:
                state, identity, reason = "PENDING_UPDATE", row.current_snapshot_identity, None
                if slot.process is None or not slot.process.alive():
                    reason = "replica restarting"
            else:
                identity = str(health.get("identity") or "initial")
                mine = health.get("hot_load_id") == record.id
                state = str(health.get("state") or "PENDING_UPDATE") if mine else "PENDING_UPDATE"
                if identity == target and health.get("state") == "READY":
                    state = "READY"
                # a replica that says it finished this hot-load counts as done, whatever it serves
                claimed = health.get("completed_hot_load_id") == record.id and health.get("state") == "READY"
                if state == "READY" and identity != target and not claimed:
                    state = "PENDING_UPDATE"
                reason = health.get("error_reason") if state == "ERROR" else None
            stamp = now()
            if state != row.state:
                row.transitioned_at = stamp
                if state == "UPDATING" and row.started_at is None:
                    row.started_at = stamp
                if state in ("READY", "ERROR"):
                    row.started_at = row.started_at or stamp
                    row.finished_at = stamp
            changed = (state, identity, reason) != (row.state, row.current_snapshot_identity, row.error_reason)
            row.state, row.current_snapshot_identity, row.error_reason = state, identity, reason
            if changed:
                row.updated_at = stamp

    def _finish(self, record: HotLoadRecord, deployment: DeploymentRecord, slots: list[Slot]) -> None:
        rows = [record.replicas[s.name] for s in slots if s.name in record.replicas]
        if len(rows) < len(slots) or not rows:
            return
        if all(r.state == "READY" for r in rows):
            record.set_state(
                "HOT_LOAD_STATE_COMPLETED", f"{len(rows)}/{len(rows)} replicas serve {record.spec['identity']}"
            )
            deployment.current_identity = record.spec["identity"]
            deployment.current_chain = [dict(link) for link in record.spec["snapshotChain"]]
            deployment.current_hot_load_id = record.id
            deployment.updated_at = now()
            return
        errors = [r for r in rows if r.state == "ERROR"]
        if errors and all(r.state in ("READY", "ERROR") for r in rows):
            reasons = "; ".join(f"{r.name}: {r.error_reason or 'unknown error'}" for r in errors[:5])
            record.set_state("HOT_LOAD_STATE_FAILED", f"{len(errors)}/{len(rows)} replicas failed: {reasons}")
            return
        started = record.started_at or record.created_at
        if (now() - started).total_seconds() > self.hot_load_timeout:
            record.set_state("HOT_LOAD_STATE_FAILED", f"timed out after {self.hot_load_timeout:g} s")

    # --------------------------------------------------------------------- faults

    def kill_replica(self, deployment_id: str, index: int = 0) -> str:
        """SIGKILL one replica now; returns its name. It is restarted cold."""
        slots = self.slots.get(deployment_id) or []
        if not 0 <= index < len(slots) or slots[index].process is None:
            raise UsageError(f"deployment {deployment_id} has no running replica #{index}; indexes start at 0")
        slot = slots[index]
        assert slot.process is not None
        slot.process.kill()
        with self.state.lock:
            self.state.changed.notify_all()
        return slot.name

    def kill_during_next_hot_load(self, deployment_id: str | None = None, index: int = 0) -> None:
        """Kill replica ``index`` right after the next hot-load was dispatched to it."""
        self._hooks.kill_on_dispatch.append((deployment_id, index))

    def arm_replica_fault(self, fault: ReplicaFault) -> ReplicaFault:
        """Make the next matching hot-load(s) misbehave on one replica (see :class:`ReplicaFault`)."""
        if fault.kind not in FAULT_KINDS:
            raise UsageError(f"unknown replica fault {fault.kind!r}; choose one of {', '.join(FAULT_KINDS)}")
        if fault.remaining < 1 or fault.index < 0:
            raise UsageError(
                f"a replica fault needs n >= 1 and index >= 0 (got n={fault.remaining}, index={fault.index})"
            )
        with self.state.lock:
            self._hooks.replica_faults.append(fault)
        return fault

    def replica_faults(self) -> list[ReplicaFault]:
        """Replica faults still armed."""
        with self.state.lock:
            return list(self._hooks.replica_faults)

    def replica_faults_fired(self) -> list[tuple[str, str, str]]:
        """Every replica fault that fired: ``(kind, replica name, identity)``."""
        with self.state.lock:
            return list(self._hooks.fired)

    def clear_replica_faults(self) -> None:
        """Disarm every replica fault and forget those that fired."""
        with self.state.lock:
            self._hooks.replica_faults.clear()
            self._hooks.fired.clear()

    def _replica_fault(self, deployment_id: str, index: int, identity: str) -> ReplicaFault | None:
        with self.state.lock:
            return next((f for f in self._hooks.replica_faults if f.matches(deployment_id, index, identity)), None)

    def _consume_replica_fault(self, fault: ReplicaFault, replica: str, identity: str) -> None:
        with self.state.lock:
            fault.remaining -= 1
            if fault.remaining <= 0:
                self._hooks.replica_faults = [f for f in self._hooks.replica_faults if f is not fault]
            self._hooks.fired.append((fault.kind, replica, identity))
        log.info("fault: %s on replica %s for the hot-load of %s", fault.kind, replica, identity)

    def _fire_kill_hooks(self, deployment: DeploymentRecord, slot: Slot, index: int) -> None:
        for hook in list(self._hooks.kill_on_dispatch):
            if hook[0] in (None, deployment.id) and hook[1] == index and slot.process is not None:
                self._hooks.kill_on_dispatch.remove(hook)
                time.sleep(0.05)  # let the replica start loading
                slot.process.kill()
                log.info("fault: killed replica %s during a hot-load", slot.name)
