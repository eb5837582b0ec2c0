"""Helpers for the control-plane tests: request bodies, checksum snapshots, polling."""

from __future__ import annotations

import json
import sys
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

FAKE_REPLICA = [sys.executable, str(Path(__file__).with_name("fake_replica.py"))]
PREFIX = "hotload"
ZONE = "US-EAST-04A"


class API:
    """A tiny client for ``/v1alpha1/inference`` returning ``(status, json)``."""

    def __init__(self, base_url: str, token: str | None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url + "/v1alpha1/inference", headers=headers, timeout=30)

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> tuple[int, Any]:
        response = self.http.request(method, path, json=body, params=params or None)
        return response.status_code, response.json() if response.content else {}

    def ok(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        status, payload = self.call(method, path, body, **params)
        assert status == 200, (method, path, status, payload)
        return payload

    def error(self, method: str, path: str, body: Any = None, **params: Any) -> tuple[int, str, str]:
        status, payload = self.call(method, path, body, **params)
        assert status >= 400, (method, path, status, payload)
        assert set(payload) == {"code", "message", "details"}, payload
        return status, payload["code"], payload["message"]


def gateway_body(name: str, zone: str = ZONE, **extra: Any) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "name": name,
        "zones": [zone],
        "coreWeaveAuth": {},
        "bodyBasedRouting": {"apiType": "API_TYPE_OPENAI"},
        **extra,
    }


def deployment_body(
    name: str,
    gateway_ids: list[str],
    bucket: str,
    *,
    model: str | None = None,
    replicas: int = 2,
    hot_load: bool = True,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "name": name,
        "gatewayIds": gateway_ids,
        "runtime": {"engine": "dynamo-vllm", "version": "1.2.3", "engineConfig": {}, "engineEnv": {}},
        "resources": {"instanceType": "H100_80GB_SXM5", "gpuCount": 1},
        "model": {"name": model or f"{name}-model", "bucket": bucket, "path": "base/fake"},
        "autoscaling": {"min": replicas, "max": replicas, "priority": 0, "concurrency": 8},
        "traffic": {"weight": 100},
    }
    if hot_load:
        body["hotLoad"] = {"bucket": bucket, "pathPrefix": PREFIX, "transitionMode": "TRANSITION_MODE_ASYNC"}
    return body


def hot_load_body(deployment_id: str, identity: str, previous: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "deploymentId": deployment_id,
        "hotLoadId": str(uuid.uuid4()),
        "identity": identity,
        "type": "SNAPSHOT_TYPE_INCREMENTAL" if previous else "SNAPSHOT_TYPE_FULL",
        **extra,
    }
    if previous:
        body["incrementalSnapshotMetadata"] = {
            "previousSnapshotIdentity": previous,
            "compressionFormat": "COMPRESSION_FORMAT_ZSTD",
            "checksumFormat": "CHECKSUM_FORMAT_ADLER32",
        }
    return body


def seed_fake_base(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="base/fake/config.json", Body=b"{}")


def put_checksum_snapshot(s3: Any, bucket: str, identity: str, payload: bytes | None = None) -> str:
    """Upload a snapshot the fake replica verifies; returns the payload key."""
    data = payload if payload is not None else identity.encode() * 64
    key = f"{PREFIX}/{identity}/payload.bin"
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    index = {"metadata": {"payload_adler32": f"{zlib.adler32(data):08x}"}, "weight_map": {}}
    s3.put_object(Bucket=bucket, Key=f"{PREFIX}/{identity}/model.safetensors.index.json", Body=json.dumps(index))
    return key


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def wait_status(api: API, kind: str, resource_id: str, status: str, timeout: float = 60.0) -> dict[str, Any]:
    def check() -> Any:
        resource = api.ok("GET", f"/{kind}s/{resource_id}")[kind]
        assert resource["status"]["status"] != "STATUS_FAILED", resource["status"]
        return resource if resource["status"]["status"] == status else None

    return dict(wait_for(check, timeout, f"{kind} {resource_id} {status}"))


def wait_hot_load(api: API, hot_load_id: str, timeout: float = 60.0) -> dict[str, Any]:
    terminal = {"HOT_LOAD_STATE_COMPLETED", "HOT_LOAD_STATE_FAILED", "HOT_LOAD_STATE_CANCELED"}

    def check() -> Any:
        hot_load = api.ok("GET", f"/hotLoads/{hot_load_id}")["hotLoad"]
        return hot_load if hot_load["status"]["state"] in terminal else None

    return dict(wait_for(check, timeout, f"hot-load {hot_load_id} to end"))
