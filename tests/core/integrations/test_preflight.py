"""python -m cwtrain.integrations.preflight against the local control plane and moto's S3 server."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from _s3_proxy import S3Proxy
from _upload_util import open_uploads

from cwtrain.integrations.preflight import main
from cwtrain.local.controlplane.server import ControlPlaneServer
from cwtrain.local.controlplane.state import ControlPlaneState

TOKEN = "preflight-admin-token"


def _deployment(state: ControlPlaneState, dep_id: str, bucket: str, prefix: str | None) -> None:
    gateway = state.create_gateway(
        {
            "id": f"gw-{dep_id}",
            "name": f"gw-{dep_id}",
            "zones": ["US-EAST-04A"],
            "coreWeaveAuth": {},
            "bodyBasedRouting": {},
        }
    )["gateway"]
    body: dict[str, Any] = {
        "id": dep_id,
        "name": dep_id,
        "gatewayIds": [gateway["spec"]["id"]],
        "runtime": {"engine": "dynamo-vllm", "version": "1.2.3"},
        "resources": {"instanceType": "X", "gpuCount": "1"},
        "model": {"name": "tiny", "bucket": bucket, "path": "base"},
        "autoscaling": {"min": 1, "max": 1},
        "traffic": {"weight": 100},
    }
    if prefix is not None:
        body["hotLoad"] = {"bucket": bucket, "pathPrefix": prefix, "transitionMode": 1}
    state.create_deployment(body)


@pytest.fixture
def api(s3_bucket: tuple[Any, str], s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    _, bucket = s3_bucket
    state = ControlPlaneState()
    _deployment(state, "dep-hot", bucket, "/hotload/")
    _deployment(state, "dep-cold", bucket, None)
    server = ControlPlaneServer(state, [TOKEN]).start()
    monkeypatch.setenv("COREWEAVE_API_URL", server.url)
    monkeypatch.setenv("COREWEAVE_API_TOKEN", TOKEN)
    monkeypatch.delenv("CW_API_TOKEN", raising=False)
    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "dep-hot")
    try:
        yield bucket
    finally:
        server.stop()


def _run() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cwtrain.integrations.preflight"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )


def test_preflight_ok_leaves_nothing(api: str) -> None:
    bucket = api
    done = _run()
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"snapshot access OK: s3://{bucket}/hotload/ (list, read, multipart write and abort)\n"
    from cwtrain.infra.s3 import s3_client

    s3 = s3_client()
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    assert open_uploads(s3, bucket) == []
    assert TOKEN not in done.stdout + done.stderr


def test_preflight_names_the_refused_permission(api: str, s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with S3Proxy(s3_server.endpoint_url) as proxy:
        proxy.refuse("ListObjectsV2", 403, "AccessDenied")
        monkeypatch.setenv("CW_S3_ENDPOINT", proxy.endpoint_url)
        done = _run()
    assert done.returncode == 1 and done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"snapshot access check failed: s3:ListBucket refused on s3://{api}/hotload/ (AccessDenied)")


def test_preflight_failures_in_process(
    api: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "dep-cold")
    assert main([]) == 1
    err = capsys.readouterr().err
    assert err.startswith("snapshot access check failed: deployment dep-cold has no spec.hotLoad bucket")
    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "no-such-deployment")
    assert main([]) == 1
    assert capsys.readouterr().err.startswith("snapshot access check failed: not_found")
    monkeypatch.delenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID")
    assert main([]) == 1
    assert "CWTRAIN_HOTLOAD_DEPLOYMENT_ID" in capsys.readouterr().err
    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "dep-hot")
    monkeypatch.delenv("COREWEAVE_API_TOKEN")
    assert main([]) == 1
    assert "COREWEAVE_API_TOKEN" in capsys.readouterr().err
    monkeypatch.setenv("COREWEAVE_API_TOKEN", TOKEN)
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    assert main([]) == 1
    assert "AWS_REGION" in capsys.readouterr().err
