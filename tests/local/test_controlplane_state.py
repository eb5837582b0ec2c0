"""Rules of the local control plane that need no process: chain limit, tokens, enums, cancel."""

from __future__ import annotations

from typing import Any

import pytest

from cwtrain.local.controlplane.resources import API_MAX_CHAIN_DELTAS, ServiceError, enum_value
from cwtrain.local.controlplane.state import ControlPlaneState, HotLoadRecord

ZONE = "US-EAST-04A"


def _state(**kwargs: Any) -> tuple[ControlPlaneState, str]:
    """A state with one READY hot-load deployment (no supervisor: readiness is set by hand)."""
    state = ControlPlaneState(**kwargs)
    gateway = state.create_gateway(
        {"id": "gw", "name": "gw", "zones": [ZONE], "coreWeaveAuth": {}, "bodyBasedRouting": {}}
    )["gateway"]
    state.create_deployment(
        {
            "id": "dep",
            "name": "dep",
            "gatewayIds": [gateway["spec"]["id"]],
            "runtime": {"engine": "dynamo-vllm", "version": "1.2.3"},
            "resources": {"instanceType": "X", "gpuCount": "2"},
            "model": {"name": "tiny-model", "bucket": "b", "path": "base"},
            "autoscaling": {"min": 1, "max": 1},
            "traffic": {"weight": 100},
            "hotLoad": {"bucket": "b", "pathPrefix": "/p/", "transitionMode": 1},
        }
    )
    state.deployments["dep"].status = "STATUS_READY"
    return state, "dep"


def _create(state: ControlPlaneState, identity: str, previous: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"deploymentId": "dep", "hotLoadId": f"h-{identity}", "identity": identity}
    if previous is None:
        body["type"] = "FULL"
    else:
        body["type"] = 2
        body["incrementalSnapshotMetadata"] = {
            "previousSnapshotIdentity": previous,
            "compressionFormat": "ZSTD",
            "checksumFormat": "CHECKSUM_FORMAT_ADLER32",
        }
    return state.create_hot_load(body)["hotLoad"]


def _complete(state: ControlPlaneState, hot_load_id: str) -> None:
    record: HotLoadRecord = state.hot_loads[hot_load_id]
    record.set_state("HOT_LOAD_STATE_COMPLETED", "done")


def test_request_enums_accept_prefixed_bare_and_integer_forms() -> None:
    assert enum_value("SNAPSHOT_TYPE_", "full", "type") == "SNAPSHOT_TYPE_FULL"
    assert enum_value("SNAPSHOT_TYPE_", 2, "type") == "SNAPSHOT_TYPE_INCREMENTAL"
    assert enum_value("SNAPSHOT_TYPE_", "1", "type") == "SNAPSHOT_TYPE_FULL"
    assert enum_value("TRANSITION_MODE_", None, "mode") == "TRANSITION_MODE_UNSPECIFIED"
    for bad in ("SNAPSHOT_TYPE_DELTA", 7, True):
        with pytest.raises(ServiceError) as info:
            enum_value("SNAPSHOT_TYPE_", bad, "type")
        assert info.value.code == "invalid_argument" and info.value.http_status == 400


def test_normalised_specs() -> None:
    state, dep = _state()
    spec = state.deployments[dep].spec
    assert spec["resources"]["gpuCount"] == 2
    assert spec["hotLoad"]["transitionMode"] == "TRANSITION_MODE_ASYNC"
    first = _create(state, "v0")
    assert first["spec"]["type"] == "SNAPSHOT_TYPE_FULL"
    assert first["status"]["state"] == "HOT_LOAD_STATE_PENDING"
    assert first["status"]["createdAt"].endswith("Z")


def test_chain_is_limited_to_128_deltas() -> None:
    state, _ = _state()
    _complete(state, _create(state, "v0")["spec"]["id"])
    previous = "v0"
    for number in range(1, API_MAX_CHAIN_DELTAS + 1):
        identity = f"v{number}"
        created = _create(state, identity, previous)
        _complete(state, created["spec"]["id"])
        previous = identity
    assert len(created["spec"]["snapshotChain"]) == API_MAX_CHAIN_DELTAS + 1
    with pytest.raises(ServiceError) as info:
        _create(state, "one-too-many", previous)
    assert info.value.code == "failed_precondition"
    assert "129 deltas" in info.value.message and "FULL" in info.value.message
    cut = _create(state, "cut")  # a FULL snapshot starts a new chain
    assert [link["identity"] for link in cut["spec"]["snapshotChain"]] == ["cut"]


def test_chain_follows_the_newest_completed_hot_load_of_the_predecessor() -> None:
    state, _ = _state()
    _complete(state, _create(state, "a")["spec"]["id"])
    _complete(state, _create(state, "b", "a")["spec"]["id"])
    failed = _create(state, "c", "b")
    state.hot_loads[failed["spec"]["id"]].set_state("HOT_LOAD_STATE_FAILED", "bad bytes")
    with pytest.raises(ServiceError, match="unknown predecessor"):
        _create(state, "d", "c")
    d = _create(state, "d", "b")
    assert [link["identity"] for link in d["spec"]["snapshotChain"]] == ["a", "b", "d"]


def test_readiness_and_hot_load_section_are_required() -> None:
    state, dep = _state()
    state.deployments[dep].status = "STATUS_CREATING"
    with pytest.raises(ServiceError) as info:
        _create(state, "v0")
    assert info.value.code == "failed_precondition" and "STATUS_READY" in info.value.message
    state.deployments[dep].status = "STATUS_READY"
    del state.deployments[dep].spec["hotLoad"]
    with pytest.raises(ServiceError, match="only be enabled at creation"):
        _create(state, "v0")


def test_cancel_can_mimic_the_service_today() -> None:
    state, _ = _state(cancel_implemented=False)
    created = _create(state, "v0")
    with pytest.raises(ServiceError) as info:
        state.cancel_hot_load(created["spec"]["id"])
    assert (info.value.code, info.value.http_status) == ("unimplemented", 501)
    assert state.hot_loads[created["spec"]["id"]].state == "HOT_LOAD_STATE_PENDING"


def test_deleting_a_deployment_cancels_its_hot_load() -> None:
    state, dep = _state()
    created = _create(state, "v0")
    state.delete_deployment(dep)
    hot_load = state.get_hot_load(created["spec"]["id"])["hotLoad"]
    assert hot_load["status"]["state"] == "HOT_LOAD_STATE_CANCELED" and hot_load["status"]["canceledAt"]
    assert state.deployments[dep].status == "STATUS_DELETING"


def test_page_sizes_and_tokens() -> None:
    state, _ = _state()
    for number in range(60):
        _complete(state, _create(state, f"f{number}")["spec"]["id"])
    assert len(state.list_hot_loads(None, None, None)["hotLoads"]) == 50  # default page
    assert len(state.list_hot_loads(None, "0", None)["hotLoads"]) == 50
    assert len(state.list_hot_loads(None, "100000", None)["hotLoads"]) == 60  # coerced to 1000
    page = state.list_hot_loads("dep", "25", None)
    rest = state.list_hot_loads("dep", "1000", page["nextPageToken"])
    ids = [h["spec"]["id"] for h in page["hotLoads"] + rest["hotLoads"]]
    assert len(ids) == len(set(ids)) == 60 and rest["nextPageToken"] == ""
    other, _ = _state()
    with pytest.raises(ServiceError, match="not a token this service issued"):
        other.list_hot_loads("dep", "25", page["nextPageToken"])  # another server's secret
    tampered = page["nextPageToken"][:-2] + ("AA" if not page["nextPageToken"].endswith("AA") else "BB")
    with pytest.raises(ServiceError):
        state.list_hot_loads("dep", "25", tampered)
