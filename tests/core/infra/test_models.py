"""API models: lenient parsing, raw payloads kept, the CLI's JSON views (interface.md 1.2)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from cwtrain.cli.output import jsonable
from cwtrain.infra.enums import HotLoadState, PromptCachePolicy, ReplicaState, ResourceStatus, SnapshotType
from cwtrain.infra.models import Deployment, Gateway, HotLoad, HotLoadReplica, IncrementalSnapshotMetadata, parse_time

DEPLOYMENT = {
    "deployment": {
        "spec": {
            "id": "dep-1",
            "name": "qwen3-4b-rl",
            "organizationId": "org-9",
            "gatewayIds": ["gw-1", "gw-2"],
            "runtime": {"engine": "dynamo-vllm", "version": "1.2.3"},
            "model": {"name": "qwen3-4b", "bucket": "my-weights", "path": "hotload/run1-v000000"},
            "hotLoad": {"bucket": "my-weights", "pathPrefix": "hotload", "transitionMode": "TRANSITION_MODE_ASYNC"},
            "futureField": {"x": 1},
        },
        "status": {
            "status": "STATUS_ERROR",
            "createdAt": "2026-01-02T03:04:05.123456789Z",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Ok",
                    "message": "up",
                    "zone": "US-EAST-04A",
                    "lastUpdateTime": "2026-01-02T03:04:05+02:00",
                }
            ],
        },
    }
}

HOT_LOAD = {
    "hotLoad": {
        "spec": {
            "id": "hl-7",
            "deploymentId": "dep-1",
            "organizationId": "org-9",
            "identity": "run1-v000007",
            "type": "SNAPSHOT_TYPE_INCREMENTAL",
            "incrementalSnapshotMetadata": {
                "previousSnapshotIdentity": "run1-v000006",
                "compressionFormat": "COMPRESSION_FORMAT_ZSTD",
                "checksumFormat": "CHECKSUM_FORMAT_ADLER32",
            },
            "snapshotChain": [
                {"identity": "run1-v000000", "type": "SNAPSHOT_TYPE_FULL", "hotLoadId": "hl-0"},
                {
                    "identity": "run1-v000006",
                    "type": "SNAPSHOT_TYPE_INCREMENTAL",
                    "hotLoadId": "hl-6",
                    "compressionFormat": "COMPRESSION_FORMAT_ZSTD",
                    "checksumFormat": "CHECKSUM_FORMAT_ADLER32",
                },
                {"identity": "run1-v000007", "type": 2, "hotLoadId": "hl-7"},
            ],
        },
        "status": {"state": "HOT_LOAD_STATE_IN_PROGRESS", "createdAt": "2026-01-02T03:04:05"},
    }
}


def test_deployment_view_has_exactly_the_documented_keys() -> None:
    dep = Deployment.from_api(DEPLOYMENT)
    view = dep.to_json(endpoints=["gw.example.com"], rollout_base_url="https://gw.example.com/v1")
    assert list(view) == [
        "id",
        "name",
        "status",
        "model_name",
        "model_bucket",
        "model_path",
        "engine",
        "hot_load",
        "gateway_ids",
        "conditions",
        "endpoints",
        "rollout_base_url",
    ]
    assert view["status"] == "ERROR"
    assert view["hot_load"] == {"bucket": "my-weights", "path_prefix": "hotload", "transition_mode": "ASYNC"}
    assert view["gateway_ids"] == ["gw-1", "gw-2"]
    assert view["conditions"] == [
        {
            "type": "Ready",
            "status": "TRUE",
            "reason": "Ok",
            "message": "up",
            "zone": "US-EAST-04A",
            "last_update_time": "2026-01-02T03:04:05+02:00",
        }
    ]
    assert dep.created_at == datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert dep.raw["spec"]["futureField"] == {"x": 1}
    json.dumps(view)


def test_deployment_without_hot_load_and_with_missing_keys() -> None:
    dep = Deployment.from_api({"deployment": {"spec": {"id": "d", "hotLoad": {}}}})
    assert dep.hot_load is None and not dep.hot_load_enabled
    assert dep.status is ResourceStatus.UNSPECIFIED
    assert dep.to_json()["hot_load"] is None
    assert dep.to_json()["rollout_base_url"] is None
    assert Deployment.from_api({}).id == ""


def test_hot_load_view_and_chain() -> None:
    hot = HotLoad.from_api(HOT_LOAD)
    assert hot.state is HotLoadState.IN_PROGRESS and not hot.terminal
    assert hot.previous_identity == "run1-v000006"
    assert hot.deltas_in_chain() == 2
    assert hot.created_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)  # no offset means UTC
    view = hot.to_json()
    assert list(view) == ["spec", "status"]
    assert list(view["spec"]) == [
        "id",
        "deployment_id",
        "identity",
        "type",
        "organization_id",
        "incremental_snapshot_metadata",
        "prompt_cache_policy",
        "snapshot_chain",
    ]
    assert list(view["status"]) == ["state", "created_at", "updated_at", "finished_at", "canceled_at", "conditions"]
    assert view["spec"]["type"] == "INCREMENTAL"
    assert view["spec"]["incremental_snapshot_metadata"] == {
        "previous_snapshot_identity": "run1-v000006",
        "compression_format": "ZSTD",
        "checksum_format": "ADLER32",
    }
    assert view["spec"]["snapshot_chain"][2] == {
        "identity": "run1-v000007",
        "type": "INCREMENTAL",
        "hot_load_id": "hl-7",
        "compression_format": "UNSPECIFIED",
        "checksum_format": "UNSPECIFIED",
    }
    assert view["status"]["state"] == "IN_PROGRESS"
    assert jsonable(hot) == view  # the CLI's printer uses to_json, never raw


def test_full_hot_load_has_null_metadata_and_default_policy() -> None:
    hot = HotLoad.from_api({"spec": {"id": "h", "type": "SNAPSHOT_TYPE_FULL"}, "status": {"state": 3}})
    assert hot.to_json()["spec"]["incremental_snapshot_metadata"] is None
    assert hot.type is SnapshotType.FULL and hot.state is HotLoadState.COMPLETED and hot.terminal
    assert hot.prompt_cache_policy is PromptCachePolicy.UNSPECIFIED
    assert hot.effective_prompt_cache_policy is PromptCachePolicy.PRESERVE
    assert hot.deltas_in_chain() == 0


def test_replica_view_and_caught_up() -> None:
    replica = HotLoadReplica.from_api(
        {
            "name": "r0",
            "zone": "z",
            "state": "HOT_LOAD_REPLICA_STATE_READY",
            "currentSnapshotIdentity": "a",
            "finishedAt": "not a time",
        }
    )
    assert replica.state is ReplicaState.READY
    assert replica.caught_up("a") and not replica.caught_up("b")
    assert replica.finished_at is None
    assert list(replica.to_json()) == [
        "name",
        "state",
        "zone",
        "current_snapshot_identity",
        "error_reason",
        "transitioned_at",
        "started_at",
        "finished_at",
        "updated_at",
    ]


def test_gateway_parse() -> None:
    gateway = Gateway.from_api(
        {
            "gateway": {
                "spec": {"id": "g", "name": "n", "zones": ["US-EAST-04A"]},
                "status": {"status": "STATUS_READY", "endpoints": ["a.example.com", ""]},
            }
        }
    )
    assert gateway.zones == ("US-EAST-04A",)
    assert gateway.endpoints == ("a.example.com",)
    assert gateway.to_json()["status"] == "READY"


def test_incremental_metadata_wire_round_trip() -> None:
    meta = IncrementalSnapshotMetadata("prev")
    wire = meta.to_wire()
    assert wire == {
        "previousSnapshotIdentity": "prev",
        "compressionFormat": "COMPRESSION_FORMAT_ZSTD",
        "checksumFormat": "CHECKSUM_FORMAT_ADLER32",
    }
    assert IncrementalSnapshotMetadata.from_api(wire) == meta


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-02T03:04:05Z", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2026-01-02T03:04:05.5z", datetime(2026, 1, 2, 3, 4, 5, 500000, tzinfo=UTC)),
        ("2026-01-02T03:04:05", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("garbage", None),
        (12, None),
        (None, None),
    ],
)
def test_parse_time(text: object, expected: datetime | None) -> None:
    assert parse_time(text) == expected


def test_models_are_frozen() -> None:
    hot = HotLoad.from_api(HOT_LOAD)
    with pytest.raises(AttributeError):
        hot.identity = "x"  # type: ignore[misc]
