"""The permission check (spec section 9): check_snapshot_access and `cwtrain hotload check`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from _s3_proxy import S3Proxy
from _upload_util import open_uploads

from cwtrain.cli import main
from cwtrain.errors import SnapshotAccessError
from cwtrain.hotload.store.prefix_access import check_snapshot_access
from cwtrain.infra.s3 import s3_client
from cwtrain.local.harness.objectstore import free_port


@pytest.fixture
def proxy(s3_server: Any, s3_env: dict[str, str]) -> Iterator[S3Proxy]:
    with S3Proxy(s3_server.endpoint_url) as p:
        yield p


def _everything(s3: Any, bucket: str) -> tuple[list[str], list[dict[str, Any]]]:
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    return keys, open_uploads(s3, bucket)


@pytest.mark.parametrize("prefix", ["hotload", "/a/b/", ""])
def test_check_passes_and_leaves_nothing(s3_bucket: tuple[Any, str], s3_env: dict[str, str], prefix: str) -> None:
    _, bucket = s3_bucket
    s3 = s3_client()
    base = prefix.strip("/")
    assert check_snapshot_access(s3, bucket, prefix) == f"s3://{bucket}/{base + '/' if base else ''}"
    assert _everything(s3, bucket) == ([], [])


def test_check_uses_the_four_calls_under_the_prefix(proxy: S3Proxy, s3_bucket: tuple[Any, str]) -> None:
    _, bucket = s3_bucket
    check_snapshot_access(s3_client(proxy.endpoint_url), bucket, "hl")
    ops = proxy.operations()
    assert ops == ["ListObjectsV2", "HeadObject", "CreateMultipartUpload", "AbortMultipartUpload"]


@pytest.mark.parametrize(
    ("operation", "permission"),
    [
        ("ListObjectsV2", "s3:ListBucket"),
        ("HeadObject", "s3:GetObject"),
        ("CreateMultipartUpload", "s3:PutObject"),
        ("AbortMultipartUpload", "s3:AbortMultipartUpload"),
    ],
)
def test_refused_call_names_its_permission(
    proxy: S3Proxy, s3_bucket: tuple[Any, str], operation: str, permission: str
) -> None:
    _, bucket = s3_bucket
    proxy.refuse(operation, 403, "AccessDenied")
    with pytest.raises(SnapshotAccessError) as info:
        check_snapshot_access(s3_client(proxy.endpoint_url), bucket, "hl")
    error = info.value
    assert error.action == permission and error.uri == f"s3://{bucket}/hl/"
    assert error.code == ("403" if operation == "HeadObject" else "AccessDenied")  # HEAD errors have no body
    for named in ("s3:ListBucket", "s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"):
        assert named in str(error)
    direct = s3_client()
    keys, uploads = _everything(direct, bucket)
    assert keys == []
    if operation == "AbortMultipartUpload":
        assert error.upload_id and error.upload_id in str(error)
        assert [u["UploadId"] for u in uploads] == [error.upload_id]
        direct.abort_multipart_upload(Bucket=bucket, Key=uploads[0]["Key"], UploadId=error.upload_id)
    else:
        assert uploads == []


def test_cli_check_ok_and_refused(
    proxy: S3Proxy, s3_bucket: tuple[Any, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, bucket = s3_bucket
    monkeypatch.setenv("CW_S3_ENDPOINT", proxy.endpoint_url)
    assert main(["hotload", "check", "--bucket", bucket, "--prefix", "/hl/"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["uri"] == f"s3://{bucket}/hl/" and out["result"] == "ok"
    proxy.refuse("CreateMultipartUpload", 403, "AccessDenied")
    assert main(["hotload", "check", "--bucket", bucket, "--prefix", "hl"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert lines[-1].startswith("error: s3:PutObject refused on s3://")


def test_cli_one_line_errors(
    s3_bucket: tuple[Any, str],
    s3_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, bucket = s3_bucket
    # unknown bucket
    assert main(["hotload", "check", "--bucket", "no-such-bucket-here", "--prefix", "hl"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: s3:ListBucket refused on s3://no-such-bucket-here/hl/ (NoSuchBucket)")
    # missing region
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    assert main(["hotload", "check", "--bucket", bucket]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "AWS_REGION" in err[0]
    # unreachable endpoint
    monkeypatch.setenv("AWS_REGION", "US-EAST-04A")
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("CW_S3_ENDPOINT", endpoint)
    assert main(["hotload", "check", "--bucket", bucket]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: cannot reach the object store at CW_S3_ENDPOINT={endpoint} (ListObjectsV2: could not connect to "
        f"{endpoint}/{bucket}: Failed to establish a new connection: [Errno 111] Connection refused); check that "
        "CW_S3_ENDPOINT names a running S3-compatible endpoint"
    ]
