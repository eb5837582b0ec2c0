"""The local control plane's resources and rules, in memory and thread-safe.

:class:`ControlPlaneState` holds gateways, deployments, hot-loads and their replica
records for one organisation and applies the service's rules on every call: client-chosen
ids with ``already_exists``, the hot-load deployment requirements (engine ``dynamo-vllm``,
a ``hotLoad`` section with ``TRANSITION_MODE_ASYNC``, gateways in one zone, the
organisation flag), hot-loads only on READY deployments or ones in the recoverable
STATUS_ERROR (:data:`HOT_LOADABLE`: a hot-load is how an ERROR deployment comes back),
single-flight hot-loads, chain resolution (oldest first from the last
FULL, at most :data:`~cwtrain.local.controlplane.resources.API_MAX_CHAIN_DELTAS` deltas) and pagination
with page tokens tied to the parent filter (:mod:`cwtrain.local.controlplane.pages`). It starts no process: the
:mod:`cwtrain.local.controlplane.supervisor` drives the asynchronous transitions (CREATING → READY,
PENDING → IN_PROGRESS → COMPLETED/FAILED, DELETING → gone) by mutating the records under
:attr:`ControlPlaneState.lock`, and renders nothing but JSON-ready dicts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from cwtrain.hotload import INDEX_NAME, snapshot_prefix
from cwtrain.local.controlplane.pages import Paginator, page_size
from cwtrain.local.controlplane.records import DeploymentRecord, GatewayRecord, HotLoadRecord, ReplicaRecord
from cwtrain.local.controlplane.resources import (
    API_MAX_CHAIN_DELTAS,
    HOT_LOAD_ENGINE,
    ServiceError,
    deployment_parameters,
    now,
    parse_rfc3339,
    validate_deployment_request,
    validate_gateway_request,
    validate_hot_load_request,
)

__all__ = [
    "DEFAULT_ENGINES",
    "HOT_LOADABLE",
    "DEFAULT_ZONES",
    "ControlPlaneState",
    "DeploymentRecord",
    "GatewayRecord",
    "HotLoadRecord",
    "ReplicaRecord",
]

DEFAULT_ZONES = frozenset({"US-EAST-04A", "US-EAST-06A", "US-WEST-01A"})
DEFAULT_ENGINES: Mapping[str, tuple[str, ...]] = {
    HOT_LOAD_ENGINE: ("1.2.3", "1.3.0"),
    "vllm": ("0.11.0", "0.12.0"),
    "sglang": ("0.5.4",),
}

ObjectExists = Callable[[str, str], bool]
#: Deployment statuses that accept a hot-load. STATUS_ERROR (no replica serves the current
#: weights, e.g. a corrupt object in the chain a restarted replica must replay) is
#: recoverable, and a hot-load of an intact snapshot (a rollback, a FULL) is the way back.
HOT_LOADABLE = frozenset({"STATUS_READY", "STATUS_ERROR"})


class ControlPlaneState:
    """Every resource of one organisation, and the rules the API applies to them.

    Args:
        organization_id: the ``organizationId`` stamped on every resource.
        hot_load_enabled: the organisation flag (RL Rollouts); off refuses hot-load deployments.
        zones: valid gateway zones.
        engines: allowed ``runtime.engine`` names and versions.
        cancel_implemented: ``False`` answers ``:cancel`` with ``unimplemented`` as the
            service does today; ``True`` cancels non-terminal hot-loads.
        object_exists: ``(bucket, key) -> bool`` used to refuse hot-loads whose index is
            missing and deployments whose base weights are missing; ``None`` skips the check.
    """

    def __init__(
        self,
        *,
        organization_id: str = "cwtrain-local",
        hot_load_enabled: bool = True,
        zones: frozenset[str] = DEFAULT_ZONES,
        engines: Mapping[str, tuple[str, ...]] = DEFAULT_ENGINES,
        cancel_implemented: bool = True,
        object_exists: ObjectExists | None = None,
    ) -> None:
        self.organization_id = organization_id
        self.hot_load_enabled = hot_load_enabled
        self.zones = frozenset(zones)
        self.engines = dict(engines)
        self.cancel_implemented = cancel_implemented
        self.object_exists = object_exists
        self.lock = threading.RLock()
        #: Notified whenever something changed that the supervisor should act on.
        self.changed = threading.Condition(self.lock)
        self.gateways: dict[str, GatewayRecord] = {}
        self.deployments: dict[str, DeploymentRecord] = {}
        self.hot_loads: dict[str, HotLoadRecord] = {}
        self._seq = 0
        self._pages = Paginator(organization_id)

    def _wake(self) -> None:
        self.changed.notify_all()

    # ------------------------------------------------------------------ gateways

    def create_gateway(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST /gateways."""
        spec = validate_gateway_request(body, self.zones)
        with self.lock:
            if spec["id"] in self.gateways:
                raise ServiceError("already_exists", f"gateway {spec['id']} already exists")
            for other in self.gateways.values():
                if other.spec["name"] == spec["name"]:
                    raise ServiceError(
                        "already_exists", f"a gateway named {spec['name']!r} already exists ({other.id})"
                    )
            spec["organizationId"] = self.organization_id
            record = GatewayRecord(spec)
            self.gateways[record.id] = record
            self._wake()
            return {"gateway": record.to_json()}

    def _gateway(self, gateway_id: str) -> GatewayRecord:
        record = self.gateways.get(gateway_id)
        if record is None:
            raise ServiceError("not_found", f"gateway {gateway_id} not found")
        return record

    def get_gateway(self, gateway_id: str) -> dict[str, Any]:
        """GET /gateways/{id}."""
        with self.lock:
            return {"gateway": self._gateway(gateway_id).to_json()}

    def list_gateways(self, updated_after: str | None = None) -> dict[str, Any]:
        """GET /gateways (not paginated; array key ``items``)."""
        after = parse_rfc3339(updated_after, "updatedAfter") if updated_after else None
        with self.lock:
            rows = sorted(self.gateways.values(), key=lambda g: g.created_at)
            return {"items": [g.to_json() for g in rows if after is None or g.updated_at > after]}

    def delete_gateway(self, gateway_id: str) -> dict[str, Any]:
        """DELETE /gateways/{id}: refused while deployments are attached."""
        with self.lock:
            record = self._gateway(gateway_id)
            attached = [d.id for d in self.deployments.values() if gateway_id in d.spec["gatewayIds"]]
            if attached:
                raise ServiceError(
                    "failed_precondition",
                    f"gateway {gateway_id} still has deployments attached ({', '.join(attached)}); delete them first",
                )
            if record.status != "STATUS_DELETING":
                record.status, record.updated_at = "STATUS_DELETING", now()
            self._wake()
            return {}

    def gateway_parameters(self) -> dict[str, Any]:
        """GET /gateways/parameters: the valid zones."""
        return {"zones": sorted(self.zones)}

    # --------------------------------------------------------------- deployments

    def deployment_parameters(self, gateway_ids: list[str]) -> dict[str, Any]:
        """GET /deployments/parameters (:func:`~cwtrain.local.controlplane.resources.deployment_parameters`).

        With ``gatewayIds`` the answer names those gateways (each must exist); without,
        every gateway of the organisation that is not being deleted.
        """
        with self.lock:
            for gateway_id in gateway_ids:
                self._gateway(gateway_id)
            usable = list(dict.fromkeys(gateway_ids)) or [
                g.id
                for g in sorted(self.gateways.values(), key=lambda g: g.created_at)
                if g.status != "STATUS_DELETING"
            ]
        return deployment_parameters(usable, self.engines)

    def create_deployment(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST /deployments, with every hot-load requirement of spec section 8."""
        spec = validate_deployment_request(body, self.engines)
        with self.lock:
            if spec["id"] in self.deployments:
                raise ServiceError("already_exists", f"deployment {spec['id']} already exists")
            for other in self.deployments.values():
                if other.spec["name"] == spec["name"]:
                    raise ServiceError(
                        "already_exists", f"a deployment named {spec['name']!r} already exists ({other.id})"
                    )
            gateways = []
            for index, gateway_id in enumerate(spec["gatewayIds"]):
                gateway = self.gateways.get(gateway_id)
                if gateway is None or gateway.status == "STATUS_DELETING":
                    raise ServiceError("invalid_argument", f"gatewayIds[{index}]: gateway {gateway_id} not found")
                gateways.append(gateway)
            model_name = spec["model"]["name"]
            for other in self.deployments.values():
                shared = set(other.spec["gatewayIds"]) & set(spec["gatewayIds"])
                if shared and other.spec["model"]["name"] == model_name:
                    raise ServiceError(
                        "invalid_argument",
                        f"model.name {model_name!r} is already served by deployment {other.id} on gateway "
                        f"{sorted(shared)[0]}; body routing needs one deployment per model name",
                    )
            if "hotLoad" in spec:
                if not self.hot_load_enabled:
                    raise ServiceError("failed_precondition", "hot-load is not enabled for this organization")
                zones = sorted({g.zone for g in gateways})
                if len(zones) > 1:
                    raise ServiceError(
                        "failed_precondition",
                        f"hot-load needs all gateways in one zone; gatewayIds span {', '.join(zones)}",
                    )
            self._check_base_weights(spec["model"])
            spec["organizationId"] = self.organization_id
            record = DeploymentRecord(spec, zone=gateways[0].zone)
            self.deployments[record.id] = record
            self._wake()
            return {"deployment": record.to_json()}

    def _check_base_weights(self, model: Mapping[str, Any]) -> None:
        if self.object_exists is None:
            return
        key = f"{str(model['path']).strip('/')}/config.json".lstrip("/")
        if not self.object_exists(model["bucket"], key):
            raise ServiceError(
                "failed_precondition",
                f"model files missing: s3://{model['bucket']}/{key} not found; upload the base checkpoint first",
            )

    def update_deployment(self, deployment_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PATCH /deployments/{id}: change autoscaling, traffic or runtime settings.

        ``hotLoad`` can only be set at creation; changing or removing it is refused. The
        single-flight interlock blocks updates while a hot-load is unfinished.
        """
        with self.lock:
            record = self._deployment(deployment_id)
            merged = {**record.spec, **{k: v for k, v in body.items() if k not in ("id", "organizationId")}}
            merged["id"] = deployment_id
            if (merged.get("hotLoad") or None) != (record.spec.get("hotLoad") or None):
                raise ServiceError(
                    "failed_precondition",
                    "hotLoad can only be set when a deployment is created; changing or removing it needs a new "
                    "deployment",
                )
            if merged.get("name") != record.spec["name"] or merged.get("model") != record.spec["model"]:
                raise ServiceError("invalid_argument", "name and model cannot be changed; create a new deployment")
            active = self.active_hot_load(deployment_id)
            if active is not None:
                raise ServiceError(
                    "failed_precondition",
                    f"hot-load {active.id} is already in progress for deployment {deployment_id}; update it later",
                )
            spec = validate_deployment_request(merged, self.engines)
            spec["organizationId"] = self.organization_id
            record.spec = spec
            record.updated_at = now()
            self._wake()
            return {"deployment": record.to_json()}

    def _deployment(self, deployment_id: str) -> DeploymentRecord:
        record = self.deployments.get(deployment_id)
        if record is None:
            raise ServiceError("not_found", f"deployment {deployment_id} not found")
        return record

    def get_deployment(self, deployment_id: str) -> dict[str, Any]:
        """GET /deployments/{id}."""
        with self.lock:
            return {"deployment": self._deployment(deployment_id).to_json()}

    def list_deployments(
        self, parent_gateway_id: str | None = None, updated_after: str | None = None
    ) -> dict[str, Any]:
        """GET /deployments (not paginated; array key ``items``)."""
        after = parse_rfc3339(updated_after, "updatedAfter") if updated_after else None
        with self.lock:
            rows = sorted(self.deployments.values(), key=lambda d: d.created_at)
            return {
                "items": [
                    d.to_json()
                    for d in rows
                    if (parent_gateway_id is None or parent_gateway_id in d.spec["gatewayIds"])
                    and (after is None or d.updated_at > after)
                ]
            }

    def delete_deployment(self, deployment_id: str) -> dict[str, Any]:
        """DELETE /deployments/{id}: STATUS_DELETING now, gone once its replicas stopped."""
        with self.lock:
            record = self._deployment(deployment_id)
            record.set_status("STATUS_DELETING", "stopping replicas")
            for hot_load in self.hot_loads.values():
                if hot_load.spec["deploymentId"] == deployment_id and not hot_load.terminal:
                    hot_load.set_state("HOT_LOAD_STATE_CANCELED", "the deployment was deleted")
                    hot_load.canceled_at = hot_load.finished_at
            self._wake()
            return {}

    # ----------------------------------------------------------------- hot-loads

    def active_hot_load(self, deployment_id: str) -> HotLoadRecord | None:
        """The deployment's unfinished hot-load, if any."""
        with self.lock:
            for record in self.hot_loads.values():
                if record.spec["deploymentId"] == deployment_id and not record.terminal:
                    return record
            return None

    def create_hot_load(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST /hotLoads: validate, apply single-flight, resolve the chain, start PENDING."""
        spec = validate_hot_load_request(body)
        with self.lock:
            if spec["id"] in self.hot_loads:
                raise ServiceError("already_exists", f"hot-load {spec['id']} already exists")
            deployment = self._deployment(spec["deploymentId"])
            if not deployment.hot_load_enabled:
                raise ServiceError(
                    "failed_precondition",
                    f"deployment {deployment.id} has no hotLoad section; hot-load can only be enabled at creation",
                )
            if deployment.status not in HOT_LOADABLE:
                raise ServiceError(
                    "failed_precondition",
                    f"deployment {deployment.id} is {deployment.status}, not STATUS_READY; wait until it is ready",
                )
            active = self.active_hot_load(deployment.id)
            if active is not None:
                raise ServiceError(
                    "failed_precondition",
                    f"hot-load {active.id} is already in progress for deployment {deployment.id}",
                )
            spec["snapshotChain"] = self._resolve_chain(deployment, spec)
            self._check_snapshot_files(deployment, spec["identity"])
            spec["organizationId"] = self.organization_id
            self._seq += 1
            record = HotLoadRecord(spec, seq=self._seq)
            self.hot_loads[record.id] = record
            self._wake()
            return {"hotLoad": record.to_json()}

    def _resolve_chain(self, deployment: DeploymentRecord, spec: Mapping[str, Any]) -> list[dict[str, Any]]:
        own = {
            "identity": spec["identity"],
            "type": spec["type"],
            "hotLoadId": spec["id"],
            "compressionFormat": "COMPRESSION_FORMAT_UNSPECIFIED",
            "checksumFormat": "CHECKSUM_FORMAT_UNSPECIFIED",
        }
        meta = spec["incrementalSnapshotMetadata"]
        if meta is None:
            return [own]
        own.update(compressionFormat=meta["compressionFormat"], checksumFormat=meta["checksumFormat"])
        previous = meta["previousSnapshotIdentity"]
        base = self.latest_completed(deployment.id, previous)
        if base is None:
            raise ServiceError(
                "failed_precondition",
                f"unknown predecessor: no completed hot-load of deployment {deployment.id} has identity "
                f"{previous!r}; hot-load it first or publish a FULL snapshot",
            )
        chain = [dict(link) for link in base.spec["snapshotChain"]] + [own]
        deltas = len(chain) - 1
        if deltas > API_MAX_CHAIN_DELTAS:
            raise ServiceError(
                "failed_precondition",
                f"resolved snapshot chain has {deltas} deltas after the last full snapshot; the limit is "
                f"{API_MAX_CHAIN_DELTAS}: publish a FULL snapshot",
            )
        return chain

    def _check_snapshot_files(self, deployment: DeploymentRecord, identity: str) -> None:
        if self.object_exists is None:
            return
        hot_load = deployment.spec["hotLoad"]
        key = f"{snapshot_prefix(str(hot_load.get('pathPrefix', '')), identity)}/{INDEX_NAME}"
        if not self.object_exists(hot_load["bucket"], key):
            raise ServiceError(
                "failed_precondition",
                f"snapshot files missing: s3://{hot_load['bucket']}/{key} not found; upload the snapshot first",
            )

    def latest_completed(self, deployment_id: str, identity: str | None = None) -> HotLoadRecord | None:
        """The newest COMPLETED hot-load of a deployment (of ``identity`` when given)."""
        with self.lock:
            best: HotLoadRecord | None = None
            for record in self.hot_loads.values():
                if (
                    record.spec["deploymentId"] == deployment_id
                    and record.state == "HOT_LOAD_STATE_COMPLETED"
                    and (identity is None or record.spec["identity"] == identity)
                    and (best is None or record.seq > best.seq)
                ):
                    best = record
            return best

    def _hot_load(self, hot_load_id: str) -> HotLoadRecord:
        record = self.hot_loads.get(hot_load_id)
        if record is None:
            raise ServiceError("not_found", f"hot-load {hot_load_id} not found")
        return record

    def get_hot_load(self, hot_load_id: str) -> dict[str, Any]:
        """GET /hotLoads/{id}."""
        with self.lock:
            return {"hotLoad": self._hot_load(hot_load_id).to_json()}

    def cancel_hot_load(self, hot_load_id: str) -> dict[str, Any]:
        """POST /hotLoads/{id}:cancel."""
        with self.lock:
            record = self._hot_load(hot_load_id)
            if not self.cancel_implemented:
                raise ServiceError("unimplemented", "canceling a hot-load is not implemented yet")
            if record.terminal:
                raise ServiceError(
                    "failed_precondition", f"hot-load {hot_load_id} already ended ({record.state}); nothing to cancel"
                )
            record.set_state("HOT_LOAD_STATE_CANCELED", "canceled by request")
            record.canceled_at = record.finished_at
            self._wake()
            return {"hotLoad": record.to_json()}

    def list_hot_loads(
        self, parent_deployment_id: str | None, max_page_size: str | None, page_token: str | None
    ) -> dict[str, Any]:
        """GET /hotLoads: newest first, paginated."""
        size = page_size(max_page_size)
        with self.lock:
            rows = sorted(
                (r for r in self.hot_loads.values() if parent_deployment_id in (None, r.spec["deploymentId"])),
                key=lambda r: -r.seq,
            )
            page, token = self._pages.page(
                rows,
                size,
                page_token,
                kind="hotLoads",
                parent=parent_deployment_id or "",
                cursor=lambda r: r.seq,
                after=lambda r, seen: r.seq < int(seen),
            )
            return {"hotLoads": [r.to_json() for r in page], "nextPageToken": token}

    def list_replicas(self, hot_load_id: str, max_page_size: str | None, page_token: str | None) -> dict[str, Any]:
        """GET /hotLoads/{id}/replicas: ordered by zone, name, paginated."""
        size = page_size(max_page_size)
        with self.lock:
            record = self._hot_load(hot_load_id)
            rows = sorted(record.replicas.values(), key=lambda r: (r.zone, r.name))
            page, token = self._pages.page(
                rows,
                size,
                page_token,
                kind="replicas",
                parent=hot_load_id,
                cursor=lambda r: [r.zone, r.name],
                after=lambda r, seen: [r.zone, r.name] > seen,
            )
            return {"replicas": [r.to_json() for r in page], "nextPageToken": token}
