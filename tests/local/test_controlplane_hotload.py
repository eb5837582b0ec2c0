"""Hot-loads through the local control plane over real HTTP, with fake replica processes.

Covers the state machine, chain resolution, single-flight, pagination, a corrupted byte,
cancel, killed replicas (during a hot-load, and all at once: a cold chain replay), the
gateway's routing and the S3 proxy's cut connections.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from _stack_util import (
    API,
    FAKE_REPLICA,
    PREFIX,
    deployment_body,
    gateway_body,
    hot_load_body,
    put_checksum_snapshot,
    seed_fake_base,
    wait_for,
    wait_hot_load,
    wait_status,
)
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from cwtrain.local import LocalStack

COMPLETED, FAILED, CANCELED = "HOT_LOAD_STATE_COMPLETED", "HOT_LOAD_STATE_FAILED", "HOT_LOAD_STATE_CANCELED"


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    # A stack of its own: fake replicas with a load time, and test_pagination counts every
    # hot-load the stack holds (the control plane keeps them after their deployment is gone).
    old = os.environ.get("FAKE_REPLICA_LOAD_SECONDS")
    os.environ["FAKE_REPLICA_LOAD_SECONDS"] = "0.3"
    try:
        with LocalStack(replicas=2, replica_command=FAKE_REPLICA) as stack:
            seed_fake_base(stack.s3_client(), stack.bucket)
            yield stack
    finally:
        if old is None:
            os.environ.pop("FAKE_REPLICA_LOAD_SECONDS", None)
        else:
            os.environ["FAKE_REPLICA_LOAD_SECONDS"] = old


@pytest.fixture(scope="module")
def api(stack: LocalStack) -> API:
    return API(stack.api_url, stack.token)


@pytest.fixture(scope="module")
def world(stack: LocalStack, api: API) -> dict[str, Any]:
    gateway = api.ok("POST", "/gateways", gateway_body("hl-gw"))["gateway"]
    gateway = wait_status(api, "gateway", gateway["spec"]["id"], "STATUS_READY")
    body = deployment_body("hl", [gateway["spec"]["id"]], stack.bucket, model="fake-model", replicas=2)
    api.ok("POST", "/deployments", body)
    wait_status(api, "deployment", body["id"], "STATUS_READY")
    s3 = stack.s3_client()
    for identity in ("v0", "v1", "v2", "v3"):
        put_checksum_snapshot(s3, stack.bucket, identity)
    return {"deployment": body["id"], "endpoint": gateway["status"]["endpoints"][0], "s3": s3}


def _complete(
    api: API, stack: LocalStack, world: dict[str, Any], identity: str, previous: str | None
) -> dict[str, Any]:
    body = hot_load_body(world["deployment"], identity, previous)
    created = api.ok("POST", "/hotLoads", body)["hotLoad"]
    assert created["status"]["state"] in ("HOT_LOAD_STATE_PENDING", "HOT_LOAD_STATE_IN_PROGRESS")
    done = wait_hot_load(api, body["hotLoadId"])
    assert done["status"]["state"] == COMPLETED, done
    return done


def _served(world: dict[str, Any], token: str, n: int = 1) -> httpx.Response:
    response = httpx.post(
        world["endpoint"] + "/v1/completions",
        json={"model": "fake-model", "prompt": "hi", "n": n},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response


def _replica_health(stack: LocalStack, world: dict[str, Any]) -> list[dict[str, Any]]:
    slots = stack.supervisor.slots[world["deployment"]]
    return [dict(s.process.health or {}) for s in slots if s.process is not None]


def test_full_then_incremental_hot_loads_complete(stack: LocalStack, api: API, world: dict[str, Any]) -> None:
    first = _complete(api, stack, world, "v0", None)
    assert first["spec"]["snapshotChain"] == [
        {
            "identity": "v0",
            "type": "SNAPSHOT_TYPE_FULL",
            "hotLoadId": first["spec"]["id"],
            "compressionFormat": "COMPRESSION_FORMAT_UNSPECIFIED",
            "checksumFormat": "CHECKSUM_FORMAT_UNSPECIFIED",
        }
    ]
    assert first["spec"]["promptCachePolicy"] == "PROMPT_CACHE_POLICY_PRESERVE"
    assert "incrementalSnapshotMetadata" not in first["spec"]
    second = _complete(api, stack, world, "v1", "v0")
    chain = second["spec"]["snapshotChain"]
    assert [(c["identity"], c["type"]) for c in chain] == [
        ("v0", "SNAPSHOT_TYPE_FULL"),
        ("v1", "SNAPSHOT_TYPE_INCREMENTAL"),
    ]
    assert chain[1]["compressionFormat"] == "COMPRESSION_FORMAT_ZSTD" and chain[0]["hotLoadId"] == first["spec"]["id"]
    status = second["status"]
    assert status["finishedAt"] >= status["createdAt"] and status["canceledAt"] is None
    replicas = api.ok("GET", f"/hotLoads/{second['spec']['id']}/replicas")
    assert replicas["nextPageToken"] == ""
    rows = replicas["replicas"]
    assert [r["name"] for r in rows] == ["hl-0", "hl-1"]
    assert all(r["state"] == "READY" and r["currentSnapshotIdentity"] == "v1" and r["zone"] for r in rows)
    assert all(r["finishedAt"] and r["startedAt"] for r in rows)
    seen = {_served(world, stack.token).headers["x-replica"] for _ in range(4)}
    assert seen == {"hl-0", "hl-1"}  # round-robin over both replicas
    response = _served(world, stack.token, n=3)
    assert response.json()["system_fingerprint"] == "v1" and len(response.json()["choices"]) == 3


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"type": None}, "type is required"),
        ({"identity": "a/b"}, "one path segment"),
        ({"identity": "initial"}, "reserved"),
        ({"identity": "x" * 129}, "128"),
        ({"incrementalSnapshotMetadata": {"previousSnapshotIdentity": "v0"}}, "not allowed for SNAPSHOT_TYPE_FULL"),
        ({"type": "SNAPSHOT_TYPE_INCREMENTAL"}, "incrementalSnapshotMetadata is required"),
        ({"promptCachePolicy": "SOMETIMES"}, "promptCachePolicy"),
    ],
)
def test_hot_load_validation(api: API, world: dict[str, Any], change: dict[str, Any], needle: str) -> None:
    body = {k: v for k, v in {**hot_load_body(world["deployment"], "v2"), **change}.items() if v is not None}
    status, code, message = api.error("POST", "/hotLoads", body)
    assert (status, code) == (400, "invalid_argument") and needle in message
    assert api.error("GET", f"/hotLoads/{body['hotLoadId']}")[1] == "not_found"


def test_hot_load_preconditions(stack: LocalStack, api: API, world: dict[str, Any]) -> None:
    assert api.error("POST", "/hotLoads", hot_load_body("no-such-deployment", "v2"))[:2] == (404, "not_found")
    _, code, message = api.error("POST", "/hotLoads", hot_load_body(world["deployment"], "v2", "never-loaded"))
    assert code == "failed_precondition" and "unknown predecessor" in message
    _, code, message = api.error("POST", "/hotLoads", hot_load_body(world["deployment"], "not-uploaded"))
    assert code == "failed_precondition" and f"{PREFIX}/not-uploaded/model.safetensors.index.json" in message
    bad_meta = hot_load_body(world["deployment"], "v2", "v0")
    bad_meta["incrementalSnapshotMetadata"]["compressionFormat"] = "COMPRESSION_FORMAT_UNSPECIFIED"
    assert api.error("POST", "/hotLoads", bad_meta)[1] == "invalid_argument"


def test_single_flight_and_client_ids(stack: LocalStack, api: API, world: dict[str, Any]) -> None:
    body = hot_load_body(world["deployment"], "v2", "v1", promptCachePolicy="PROMPT_CACHE_POLICY_RESET_ALL")
    api.ok("POST", "/hotLoads", body)
    other = hot_load_body(world["deployment"], "v3", "v1")
    status, code, message = api.error("POST", "/hotLoads", other)
    assert (status, code) == (400, "failed_precondition") and "already in progress" in message
    assert body["hotLoadId"] in message
    assert api.error("POST", "/hotLoads", body)[:2] == (409, "already_exists")
    done = wait_hot_load(api, body["hotLoadId"])
    assert done["status"]["state"] == COMPLETED
    assert done["spec"]["promptCachePolicy"] == "PROMPT_CACHE_POLICY_RESET_ALL"
    assert [c["identity"] for c in done["spec"]["snapshotChain"]] == ["v0", "v1", "v2"]


def test_pagination(stack: LocalStack, api: API, world: dict[str, Any]) -> None:
    everything = api.ok("GET", "/hotLoads", parentDeploymentId=world["deployment"])["hotLoads"]
    assert len(everything) >= 3
    created = [h["status"]["createdAt"] for h in everything]
    assert created == sorted(created, reverse=True)  # newest first
    pages: list[str] = []
    token = first_token = None
    while True:
        params: dict[str, Any] = {"parentDeploymentId": world["deployment"], "maxPageSize": 1}
        if token:
            params["pageToken"] = token
        page = api.ok("GET", "/hotLoads", **params)
        assert len(page["hotLoads"]) <= 1
        pages += [h["spec"]["id"] for h in page["hotLoads"]]
        token = page["nextPageToken"]
        if not token:
            break
        first_token = first_token or token
    assert pages == [h["spec"]["id"] for h in everything]
    _, code, message = api.error("GET", "/hotLoads", pageToken=first_token, maxPageSize=1)
    assert code == "invalid_argument" and "parent filter" in message
    _, code, _ = api.error("GET", "/hotLoads", parentDeploymentId="other", pageToken=first_token)
    assert code == "invalid_argument"
    assert api.error("GET", "/hotLoads", pageToken="garbage")[1] == "invalid_argument"
    assert api.error("GET", "/hotLoads", maxPageSize=-1)[1] == "invalid_argument"
    assert api.error("GET", "/hotLoads", maxPageSize="many")[1] == "invalid_argument"
    assert len(api.ok("GET", "/hotLoads", maxPageSize=5000)["hotLoads"]) == len(everything)

    hot_load_id = everything[0]["spec"]["id"]
    page = api.ok("GET", f"/hotLoads/{hot_load_id}/replicas", maxPageSize=1)
    assert [r["name"] for r in page["replicas"]] == ["hl-0"] and page["nextPageToken"]
    rest = api.ok("GET", f"/hotLoads/{hot_load_id}/replicas", maxPageSize=1, pageToken=page["nextPageToken"])
    assert [r["name"] for r in rest["replicas"]] == ["hl-1"] and rest["nextPageToken"] == ""
    _, code, _ = api.error("GET", f"/hotLoads/{everything[1]['spec']['id']}/replicas", pageToken=page["nextPageToken"])
    assert code == "invalid_argument"  # a token of another hot-load's listing
    assert api.error("GET", "/hotLoads/nope/replicas")[1] == "not_found"


def test_corrupted_byte_fails_and_previous_identity_keeps_serving(
    stack: LocalStack, api: API, world: dict[str, Any]
) -> None:
    current = _served(world, stack.token).json()["system_fingerprint"]
    key = put_checksum_snapshot(world["s3"], stack.bucket, "corrupt")
    stack.faults.flip_byte(stack.bucket, key, offset=10)
    body = hot_load_body(world["deployment"], "corrupt", current)
    api.ok("POST", "/hotLoads", body)
    done = wait_hot_load(api, body["hotLoadId"])
    assert done["status"]["state"] == FAILED
    assert "Adler-32" in done["status"]["conditions"][0]["message"]
    rows = api.ok("GET", f"/hotLoads/{body['hotLoadId']}/replicas")["replicas"]
    assert all(r["state"] == "ERROR" and "Adler-32" in r["errorReason"] for r in rows)
    assert all(r["currentSnapshotIdentity"] == current for r in rows)
    for _ in range(2):
        assert _served(world, stack.token).headers["x-cwtrain-snapshot-identity"] == current
    _, code, message = api.error("POST", "/hotLoads", hot_load_body(world["deployment"], "v3", "corrupt"))
    assert code == "failed_precondition" and "unknown predecessor" in message


def test_cancel(stack: LocalStack, api: API, world: dict[str, Any]) -> None:
    body = hot_load_body(world["deployment"], "v3")
    api.ok("POST", "/hotLoads", body)
    canceled = api.ok("POST", f"/hotLoads/{body['hotLoadId']}:cancel", {})["hotLoad"]
    assert canceled["status"]["state"] == CANCELED and canceled["status"]["canceledAt"]
    _, code, message = api.error("POST", f"/hotLoads/{body['hotLoadId']}:cancel", {})
    assert code == "failed_precondition" and "already ended" in message
    assert api.error("POST", "/hotLoads/nope:cancel", {})[1] == "not_found"
    wait_for(lambda: all(h.get("state") in ("READY", "ERROR") for h in _replica_health(stack, world)), what="idle")


def test_replica_killed_during_hot_load_is_restarted_and_catches_up(
    stack: LocalStack, api: API, world: dict[str, Any]
) -> None:
    latest = api.ok("GET", "/hotLoads", parentDeploymentId=world["deployment"], maxPageSize=1000)["hotLoads"]
    previous = next(h["spec"]["identity"] for h in latest if h["status"]["state"] == COMPLETED)
    stack.faults.kill_replica_during_next_hot_load(world["deployment"], index=1)
    put_checksum_snapshot(world["s3"], stack.bucket, "v4")
    body = hot_load_body(world["deployment"], "v4", previous)
    api.ok("POST", "/hotLoads", body)
    done = wait_hot_load(api, body["hotLoadId"])
    assert done["status"]["state"] == COMPLETED
    slot = stack.supervisor.slots[world["deployment"]][1]
    assert slot.generation >= 2  # the killed process was replaced
    assert {h["identity"] for h in _replica_health(stack, world)} == {"v4"}


def test_all_replicas_killed_replay_the_chain_cold(stack: LocalStack, api: API, world: dict[str, Any]) -> None:
    current = _served(world, stack.token).json()["system_fingerprint"]
    chain = api.ok("GET", "/hotLoads", parentDeploymentId=world["deployment"])["hotLoads"]
    expected = next(h for h in chain if h["status"]["state"] == COMPLETED)["spec"]["snapshotChain"]
    generations = [s.generation for s in stack.supervisor.slots[world["deployment"]]]
    stack.faults.kill_replica(world["deployment"], 0)
    stack.faults.kill_replica(world["deployment"], 1)

    def caught_up() -> bool:
        slots = stack.supervisor.slots[world["deployment"]]
        health = _replica_health(stack, world)
        return (
            [s.generation for s in slots] > generations
            and len(health) == 2
            and all(h.get("identity") == current and h.get("state") == "READY" for h in health)
        )

    wait_for(caught_up, what="replicas replayed the chain")
    health = _replica_health(stack, world)
    replayed = [h for h in health if h["peer"] is None]
    assert replayed, health  # at least the first one had no peer to copy from
    assert replayed[0]["loaded"] == [link["identity"] for link in expected]
    assert _served(world, stack.token).headers["x-cwtrain-snapshot-identity"] == current


def test_gateway_routes_and_auth(stack: LocalStack, world: dict[str, Any]) -> None:
    endpoint = world["endpoint"]
    auth = {"Authorization": f"Bearer {stack.token}"}
    models = httpx.get(endpoint + "/v1/models", headers=auth).json()
    assert [m["id"] for m in models["data"]] == ["fake-model"]
    assert httpx.get(endpoint + "/v1/models").status_code == 401
    bad = httpx.post(
        endpoint + "/v1/completions",
        json={"model": "fake-model", "prompt": "x"},
        headers={"Authorization": "Bearer no"},
    )
    assert bad.status_code == 401 and "error" in bad.json()
    missing = httpx.post(endpoint + "/v1/completions", json={"model": "other-model", "prompt": "x"}, headers=auth)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    no_model = httpx.post(endpoint + "/v1/completions", json={"prompt": "x"}, headers=auth)
    assert no_model.status_code == 400


def test_s3_proxy_cuts_an_upload(stack: LocalStack) -> None:
    proxy = stack.faults.s3
    assert proxy is not None
    client = boto3.client(
        "s3",
        endpoint_url=stack.s3_endpoint,
        region_name=stack.region,
        aws_access_key_id=stack.env()["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=stack.env()["AWS_SECRET_ACCESS_KEY"],
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )
    data = os.urandom(512 * 1024)
    proxy.cut_next(after_bytes=64 * 1024)
    with pytest.raises((BotoCoreError, ClientError)):
        client.put_object(Bucket=stack.bucket, Key="cut/object", Body=data)
    assert proxy.cut_count == 1
    with pytest.raises(ClientError):
        client.head_object(Bucket=stack.bucket, Key="cut/object")
    client.put_object(Bucket=stack.bucket, Key="cut/object", Body=data)  # the next connection is whole
    assert client.get_object(Bucket=stack.bucket, Key="cut/object")["Body"].read() == data
