"""Typed views of the API's resources (service-api.md section 3).

Every model is a frozen dataclass parsed leniently from the service JSON with
``from_api``: missing keys become empty values, enums go through their lenient
``parse``, RFC 3339 times become aware :class:`~datetime.datetime` objects (no offset
means UTC; an unparseable time becomes ``None`` and is logged), and the payload itself
is kept in ``raw`` so that fields this version does not know are never lost.

``to_json()`` gives the CLI's views of interface.md section 1.2: bare enum names,
ISO 8601 times, and never the raw payload.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from cwtrain.infra.enums import (
    ChecksumFormat,
    CompressionFormat,
    ConditionStatus,
    HotLoadState,
    PromptCachePolicy,
    ReplicaState,
    ResourceStatus,
    SnapshotType,
    TransitionMode,
)

__all__ = [
    "Condition",
    "Deployment",
    "Gateway",
    "HotLoad",
    "HotLoadConfig",
    "HotLoadReplica",
    "IncrementalSnapshotMetadata",
    "SnapshotRef",
    "describe_conditions",
    "parse_time",
]

log = logging.getLogger(__name__)

_FRACTION = re.compile(r"(\.\d{6})\d+")


def parse_time(value: object) -> datetime | None:
    """Parse an RFC 3339 time; no offset means UTC; unparseable gives ``None`` (logged)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        log.debug("ignoring a non-string time %r", value)
        return None
    text = _FRACTION.sub(r"\1", value.strip())
    if text.endswith(("z", "Z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        log.debug("ignoring an unparseable time %r", value)
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _view_value(value: object) -> Any:
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return [_view_value(item) for item in value]
    to_json = getattr(value, "to_json", None)
    return to_json() if callable(to_json) else value


def _view(model: object, *names: str) -> dict[str, Any]:
    """The CLI view of ``model``: the named fields in order, enums as bare names, times ISO 8601."""
    return {name: _view_value(getattr(model, name)) for name in names}


def _obj(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _str(value: object) -> str:
    return "" if value is None else str(value)


def _strs(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in _list(value) if v is not None and str(v) != "")


def _unwrap(payload: Mapping[str, Any], key: str) -> dict[str, Any]:
    """Accept both ``{"gateway": {...}}`` and the bare resource."""
    inner = payload.get(key)
    if isinstance(inner, Mapping) and ("spec" in inner or "status" in inner):
        return dict(inner)
    return dict(payload)


@dataclass(frozen=True)
class Condition:
    """One ``status.conditions[]`` entry of a gateway, deployment or hot-load."""

    type: str = ""
    status: ConditionStatus = ConditionStatus.UNSPECIFIED
    reason: str = ""
    message: str = ""
    zone: str = ""
    last_update_time: datetime | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, payload: Mapping[str, Any]) -> Condition:
        """Parse one condition."""
        return cls(
            type=_str(payload.get("type")),
            status=ConditionStatus.parse(payload.get("status")),
            reason=_str(payload.get("reason")),
            message=_str(payload.get("message")),
            zone=_str(payload.get("zone")),
            last_update_time=parse_time(payload.get("lastUpdateTime")),
            raw=dict(payload),
        )

    def to_json(self) -> dict[str, Any]:
        """``{"type", "status", "reason", "message", "zone", "last_update_time"}``."""
        return _view(self, "type", "status", "reason", "message", "zone", "last_update_time")

    def describe(self) -> str:
        """``Ready=FALSE (Reason): message [zone]`` for logs and errors."""
        text = f"{self.type or '?'}={self.status.name}"
        if self.reason:
            text += f" ({self.reason})"
        if self.message:
            text += f": {self.message}"
        if self.zone:
            text += f" [{self.zone}]"
        return text


def _conditions(value: object) -> tuple[Condition, ...]:
    return tuple(Condition.from_api(c) for c in _list(value) if isinstance(c, Mapping))


def describe_conditions(conditions: Iterable[Condition]) -> str:
    """All conditions on one line, or ``"no conditions"``."""
    parts = [c.describe() for c in conditions]
    return "; ".join(parts) if parts else "no conditions"


@dataclass(frozen=True)
class Gateway:
    """A gateway: the single-zone front door of one or more deployments."""

    id: str
    name: str = ""
    organization_id: str = ""
    zones: tuple[str, ...] = ()
    status: ResourceStatus = ResourceStatus.UNSPECIFIED
    endpoints: tuple[str, ...] = ()
    conditions: tuple[Condition, ...] = ()
    created_at: datetime | None = None
    updated_at: datetime | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, payload: Mapping[str, Any]) -> Gateway:
        """Parse ``{"gateway": {...}}`` or the bare resource."""
        body = _unwrap(payload, "gateway")
        spec, status = _obj(body.get("spec")), _obj(body.get("status"))
        return cls(
            id=_str(spec.get("id")),
            name=_str(spec.get("name")),
            organization_id=_str(spec.get("organizationId")),
            zones=_strs(spec.get("zones")),
            status=ResourceStatus.parse(status.get("status")),
            endpoints=_strs(status.get("endpoints")),
            conditions=_conditions(status.get("conditions")),
            created_at=parse_time(status.get("createdAt")),
            updated_at=parse_time(status.get("updatedAt")),
            raw=body,
        )

    def to_json(self) -> dict[str, Any]:
        """The CLI's gateway view."""
        return _view(
            self,
            "id",
            "name",
            "status",
            "zones",
            "endpoints",
            "organization_id",
            "conditions",
            "created_at",
            "updated_at",
        )


@dataclass(frozen=True)
class HotLoadConfig:
    """A deployment's ``spec.hotLoad``: where its snapshots live."""

    bucket: str
    path_prefix: str = ""
    transition_mode: TransitionMode = TransitionMode.ASYNC

    def to_json(self) -> dict[str, Any]:
        """``{"bucket", "path_prefix", "transition_mode"}``."""
        return _view(self, "bucket", "path_prefix", "transition_mode")


@dataclass(frozen=True)
class Deployment:
    """A Dedicated Inference deployment."""

    id: str
    name: str = ""
    organization_id: str = ""
    status: ResourceStatus = ResourceStatus.UNSPECIFIED
    model_name: str = ""
    model_bucket: str = ""
    model_path: str = ""
    engine: str = ""
    engine_version: str = ""
    gateway_ids: tuple[str, ...] = ()
    hot_load: HotLoadConfig | None = None
    conditions: tuple[Condition, ...] = ()
    created_at: datetime | None = None
    updated_at: datetime | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, payload: Mapping[str, Any]) -> Deployment:
        """Parse ``{"deployment": {...}}`` or the bare resource."""
        body = _unwrap(payload, "deployment")
        spec, status = _obj(body.get("spec")), _obj(body.get("status"))
        model, runtime = _obj(spec.get("model")), _obj(spec.get("runtime"))
        hot = _obj(spec.get("hotLoad"))
        config = None
        if hot:
            config = HotLoadConfig(
                bucket=_str(hot.get("bucket")),
                path_prefix=_str(hot.get("pathPrefix")),
                transition_mode=TransitionMode.parse(hot.get("transitionMode")),
            )
        return cls(
            id=_str(spec.get("id")),
            name=_str(spec.get("name")),
            organization_id=_str(spec.get("organizationId")),
            status=ResourceStatus.parse(status.get("status")),
            model_name=_str(model.get("name")),
            model_bucket=_str(model.get("bucket")),
            model_path=_str(model.get("path")),
            engine=_str(runtime.get("engine")),
            engine_version=_str(runtime.get("version")),
            gateway_ids=_strs(spec.get("gatewayIds")),
            hot_load=config,
            conditions=_conditions(status.get("conditions")),
            created_at=parse_time(status.get("createdAt")),
            updated_at=parse_time(status.get("updatedAt")),
            raw=body,
        )

    @property
    def hot_load_enabled(self) -> bool:
        """Whether ``spec.hotLoad`` is present and non-empty."""
        return self.hot_load is not None

    def to_json(self, *, endpoints: Sequence[str] = (), rollout_base_url: str | None = None) -> dict[str, Any]:
        """The deployment view of interface.md section 1.2.

        Args:
            endpoints: the endpoints of its gateways (see :func:`cwtrain.infra.lifecycle.endpoints`).
            rollout_base_url: the OpenAI base URL derived from the first endpoint.
        """
        names = ("id", "name", "status", "model_name", "model_bucket", "model_path", "engine", "hot_load")
        view = _view(self, *names, "gateway_ids", "conditions")
        return {**view, "endpoints": list(endpoints), "rollout_base_url": rollout_base_url}


@dataclass(frozen=True)
class IncrementalSnapshotMetadata:
    """What an INCREMENTAL hot-load applies on top of."""

    previous_snapshot_identity: str
    compression_format: CompressionFormat = CompressionFormat.ZSTD
    checksum_format: ChecksumFormat = ChecksumFormat.ADLER32

    @classmethod
    def from_api(cls, payload: Mapping[str, Any]) -> IncrementalSnapshotMetadata:
        """Parse ``incrementalSnapshotMetadata``."""
        return cls(
            previous_snapshot_identity=_str(payload.get("previousSnapshotIdentity")),
            compression_format=CompressionFormat.parse(payload.get("compressionFormat")),
            checksum_format=ChecksumFormat.parse(payload.get("checksumFormat")),
        )

    def to_wire(self) -> dict[str, str]:
        """The request form (prefixed enum names)."""
        return {
            "previousSnapshotIdentity": self.previous_snapshot_identity,
            "compressionFormat": self.compression_format.wire,
            "checksumFormat": self.checksum_format.wire,
        }

    def to_json(self) -> dict[str, Any]:
        """``{"previous_snapshot_identity", "compression_format", "checksum_format"}``."""
        return _view(self, "previous_snapshot_identity", "compression_format", "checksum_format")


@dataclass(frozen=True)
class SnapshotRef:
    """One entry of a hot-load's resolved ``snapshotChain`` (oldest first)."""

    identity: str
    type: SnapshotType = SnapshotType.UNSPECIFIED
    hot_load_id: str = ""
    compression_format: CompressionFormat = CompressionFormat.UNSPECIFIED
    checksum_format: ChecksumFormat = ChecksumFormat.UNSPECIFIED

    @classmethod
    def from_api(cls, payload: Mapping[str, Any]) -> SnapshotRef:
        """Parse one chain entry."""
        return cls(
            identity=_str(payload.get("identity")),
            type=SnapshotType.parse(payload.get("type")),
            hot_load_id=_str(payload.get("hotLoadId")),
            compression_format=CompressionFormat.parse(payload.get("compressionFormat")),
            checksum_format=ChecksumFormat.parse(payload.get("checksumFormat")),
        )

    def to_json(self) -> dict[str, Any]:
        """``{"identity", "type", "hot_load_id", "compression_format", "checksum_format"}``."""
        return _view(self, "identity", "type", "hot_load_id", "compression_format", "checksum_format")


@dataclass(frozen=True)
class HotLoad:
    """One hot-load: a snapshot identity being switched in on a deployment."""

    id: str
    deployment_id: str = ""
    identity: str = ""
    type: SnapshotType = SnapshotType.UNSPECIFIED
    organization_id: str = ""
    incremental_snapshot_metadata: IncrementalSnapshotMetadata | None = None
    prompt_cache_policy: PromptCachePolicy = PromptCachePolicy.UNSPECIFIED
    snapshot_chain: tuple[SnapshotRef, ...] = ()
    state: HotLoadState = HotLoadState.UNSPECIFIED
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    canceled_at: datetime | None = None
    conditions: tuple[Condition, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, payload: Mapping[str, Any]) -> HotLoad:
        """Parse ``{"hotLoad": {...}}`` or the bare resource."""
        body = _unwrap(payload, "hotLoad")
        spec, status = _obj(body.get("spec")), _obj(body.get("status"))
        meta = _obj(spec.get("incrementalSnapshotMetadata"))
        return cls(
            id=_str(spec.get("id")),
            deployment_id=_str(spec.get("deploymentId")),
            identity=_str(spec.get("identity")),
            type=SnapshotType.parse(spec.get("type")),
            organization_id=_str(spec.get("organizationId")),
            incremental_snapshot_metadata=IncrementalSnapshotMetadata.from_api(meta) if meta else None,
            prompt_cache_policy=PromptCachePolicy.parse(spec.get("promptCachePolicy")),
            snapshot_chain=tuple(
                SnapshotRef.from_api(e) for e in _list(spec.get("snapshotChain")) if isinstance(e, Mapping)
            ),
            state=HotLoadState.parse(status.get("state")),
            created_at=parse_time(status.get("createdAt")),
            updated_at=parse_time(status.get("updatedAt")),
            finished_at=parse_time(status.get("finishedAt")),
            canceled_at=parse_time(status.get("canceledAt")),
            conditions=_conditions(status.get("conditions")),
            raw=body,
        )

    @property
    def terminal(self) -> bool:
        """Whether the hot-load has ended (COMPLETED, FAILED or CANCELED)."""
        return self.state.terminal

    @property
    def previous_identity(self) -> str | None:
        """The predecessor of an INCREMENTAL hot-load, else ``None``."""
        meta = self.incremental_snapshot_metadata
        return meta.previous_snapshot_identity if meta else None

    @property
    def effective_prompt_cache_policy(self) -> PromptCachePolicy:
        """The policy in force (an absent field means the server default, PRESERVE)."""
        if self.prompt_cache_policy is PromptCachePolicy.UNSPECIFIED:
            return PromptCachePolicy.PRESERVE
        return self.prompt_cache_policy

    def deltas_in_chain(self) -> int:
        """How many deltas the resolved chain holds after its last FULL snapshot."""
        count = 0
        for ref in reversed(self.snapshot_chain):
            if ref.type is SnapshotType.FULL:
                break
            count += 1
        return count

    def to_json(self) -> dict[str, Any]:
        """The hot-load view of interface.md section 1.2."""
        spec = ("id", "deployment_id", "identity", "type", "organization_id", "incremental_snapshot_metadata")
        status = ("state", "created_at", "updated_at", "finished_at", "canceled_at", "conditions")
        return {
            "spec": _view(self, *spec, "prompt_cache_policy", "snapshot_chain"),
            "status": _view(self, *status),
        }


@dataclass(frozen=True)
class HotLoadReplica:
    """One replica's progress through a hot-load."""

    name: str
    zone: str = ""
    state: ReplicaState = ReplicaState.UNSPECIFIED
    current_snapshot_identity: str = ""
    error_reason: str = ""
    transitioned_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, payload: Mapping[str, Any]) -> HotLoadReplica:
        """Parse one ``replicas[]`` entry."""
        return cls(
            name=_str(payload.get("name")),
            zone=_str(payload.get("zone")),
            state=ReplicaState.parse(payload.get("state")),
            current_snapshot_identity=_str(payload.get("currentSnapshotIdentity")),
            error_reason=_str(payload.get("errorReason")),
            transitioned_at=parse_time(payload.get("transitionedAt")),
            started_at=parse_time(payload.get("startedAt")),
            finished_at=parse_time(payload.get("finishedAt")),
            updated_at=parse_time(payload.get("updatedAt")),
            raw=dict(payload),
        )

    def caught_up(self, identity: str) -> bool:
        """READY and serving ``identity``."""
        return self.state is ReplicaState.READY and self.current_snapshot_identity == identity

    def to_json(self) -> dict[str, Any]:
        """The replica view of interface.md section 1.2."""
        return _view(
            self,
            "name",
            "state",
            "zone",
            "current_snapshot_identity",
            "error_reason",
            "transitioned_at",
            "started_at",
            "finished_at",
            "updated_at",
        )
