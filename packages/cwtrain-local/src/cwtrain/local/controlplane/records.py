"""The records behind the local control plane's resources, and their JSON.

One dataclass per resource the API returns: :class:`GatewayRecord`,
:class:`DeploymentRecord`, :class:`HotLoadRecord` and the per-hot-load
:class:`ReplicaRecord`. Each renders itself with ``to_json()`` exactly as
``shared/spec/service-api.md`` section 3 shapes it (lowerCamel keys, prefixed enums,
RFC 3339 times). :mod:`cwtrain.local.controlplane.state` owns the rules; the supervisor mutates the
records' status fields under the state's lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cwtrain.local.controlplane.resources import TERMINAL_HOT_LOAD_STATES, now, rfc3339

__all__ = ["DeploymentRecord", "GatewayRecord", "HotLoadRecord", "ReplicaRecord"]


def _condition(
    kind: str, ok: bool, reason: str, message: str, updated_at: datetime, zone: str | None = None
) -> dict[str, Any]:
    """One ``status.conditions[]`` entry (``zone`` only on gateways and deployments)."""
    row: dict[str, Any] = {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message}
    if zone is not None:
        row["zone"] = zone
    row["lastUpdateTime"] = rfc3339(updated_at)
    return row


@dataclass
class _Resource:
    """What every API resource has: its spec (with its ``id``) and two times."""

    spec: dict[str, Any]
    created_at: datetime = field(default_factory=now, kw_only=True)
    updated_at: datetime = field(default_factory=now, kw_only=True)

    @property
    def id(self) -> str:
        """The resource id (``spec.id``)."""
        return str(self.spec["id"])


@dataclass
class ReplicaRecord:
    """One replica as a hot-load lists it (spec section 3, ``replicas[]``)."""

    name: str
    zone: str
    state: str = "PENDING_UPDATE"
    current_snapshot_identity: str = "initial"
    error_reason: str | None = None
    transitioned_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime = field(default_factory=now)

    def to_json(self) -> dict[str, Any]:
        """The replica as the API returns it."""
        return {
            "name": self.name,
            "zone": self.zone,
            "state": self.state,
            "currentSnapshotIdentity": self.current_snapshot_identity,
            "errorReason": self.error_reason or "",
            "transitionedAt": rfc3339(self.transitioned_at),
            "startedAt": rfc3339(self.started_at),
            "finishedAt": rfc3339(self.finished_at),
            "updatedAt": rfc3339(self.updated_at),
        }


@dataclass
class GatewayRecord(_Resource):
    """A gateway and its lifecycle."""

    status: str = "STATUS_CREATING"
    endpoints: list[str] = field(default_factory=list)

    @property
    def zone(self) -> str:
        """The gateway's single zone."""
        return str(self.spec["zones"][0])

    def to_json(self) -> dict[str, Any]:
        """The gateway resource."""
        ready = self.status == "STATUS_READY"
        return {
            "spec": self.spec,
            "status": {
                "status": self.status,
                "endpoints": list(self.endpoints) if ready else [],
                "conditions": [
                    _condition(
                        "Ready",
                        ready,
                        "GatewayReady" if ready else self.status.removeprefix("STATUS_").title(),
                        "",
                        self.updated_at,
                        self.zone,
                    )
                ],
                "createdAt": rfc3339(self.created_at),
                "updatedAt": rfc3339(self.updated_at),
            },
        }


@dataclass
class DeploymentRecord(_Resource):
    """A deployment, what its replicas serve, and the deployment-level hot-load view."""

    zone: str
    status: str = "STATUS_CREATING"
    message: str = "starting replicas"
    ready_replicas: int = 0
    #: Identity, chain and hot-load id of the newest COMPLETED hot-load ("initial" before).
    current_identity: str = "initial"
    current_chain: list[dict[str, Any]] = field(default_factory=list)
    current_hot_load_id: str | None = None

    @property
    def replica_count(self) -> int:
        """Replica processes to run: ``autoscaling.min``, at least one."""
        return max(1, int(self.spec["autoscaling"]["min"]))

    @property
    def hot_load_enabled(self) -> bool:
        """Whether ``spec.hotLoad`` is present and non-empty."""
        return bool(self.spec.get("hotLoad"))

    def set_status(self, status: str, message: str) -> None:
        """Change the status (and the update time) when it differs."""
        if (status, message) != (self.status, self.message):
            self.status, self.message, self.updated_at = status, message, now()

    def to_json(self) -> dict[str, Any]:
        """The deployment resource."""
        ready = self.status == "STATUS_READY"
        total = self.replica_count
        starting = self.ready_replicas < total
        return {
            "spec": self.spec,
            "status": {
                "status": self.status,
                "createdAt": rfc3339(self.created_at),
                "updatedAt": rfc3339(self.updated_at),
                "conditions": [
                    _condition("ResourcesApplied", True, "Applied", "replicas scheduled", self.updated_at, self.zone),
                    _condition(
                        "Ready",
                        ready,
                        "ReplicasReady" if ready else "NotReady",
                        self.message,
                        self.updated_at,
                        self.zone,
                    ),
                    _condition(
                        "Progressing",
                        starting,
                        "ReplicasStarting" if starting else "Stable",
                        f"{self.ready_replicas}/{total} replicas ready",
                        self.updated_at,
                        self.zone,
                    ),
                ],
            },
        }


@dataclass
class HotLoadRecord(_Resource):
    """A hot-load, its resolved chain and its per-replica progress."""

    seq: int
    state: str = "HOT_LOAD_STATE_PENDING"
    message: str = "waiting for replicas"
    started_at: datetime | None = None
    finished_at: datetime | None = None
    canceled_at: datetime | None = None
    replicas: dict[str, ReplicaRecord] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        """COMPLETED, FAILED or CANCELED."""
        return self.state in TERMINAL_HOT_LOAD_STATES

    def set_state(self, state: str, message: str) -> None:
        """Move to ``state``; terminal states also stamp ``finishedAt``."""
        stamp = now()
        self.state, self.message, self.updated_at = state, message, stamp
        if state == "HOT_LOAD_STATE_IN_PROGRESS" and self.started_at is None:
            self.started_at = stamp
        if state in TERMINAL_HOT_LOAD_STATES and self.finished_at is None:
            self.finished_at = stamp

    def to_json(self) -> dict[str, Any]:
        """The hot-load resource."""
        spec = dict(self.spec)
        if spec.get("incrementalSnapshotMetadata") is None:
            spec.pop("incrementalSnapshotMetadata", None)
        completed = _condition(
            "Completed",
            self.state == "HOT_LOAD_STATE_COMPLETED",
            self.state.removeprefix("HOT_LOAD_STATE_").title().replace("_", ""),
            self.message,
            self.updated_at,
        )
        return {
            "spec": spec,
            "status": {
                "state": self.state,
                "createdAt": rfc3339(self.created_at),
                "updatedAt": rfc3339(self.updated_at),
                "finishedAt": rfc3339(self.finished_at),
                "canceledAt": rfc3339(self.canceled_at),
                "conditions": [completed],
            },
        }
