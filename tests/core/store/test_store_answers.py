"""The store-answer table of spec section 7: 412, 409 ConditionalRequestConflict, 501 NotImplemented."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from _s3_proxy import S3Proxy
from _upload_util import MIB, open_uploads, sha256, stored

from cwtrain.errors import SnapshotConflictError, SnapshotError
from cwtrain.hotload.format.index import SnapshotFile
from cwtrain.hotload.store import object_writer as objects
from cwtrain.hotload.store.object_writer import ObjectSource, ObjectWriter
from cwtrain.hotload.store.snapshot_upload import SnapshotUpload
from cwtrain.infra.s3 import s3_client

PART = 5 * MIB


@pytest.fixture(autouse=True)
def _fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects, "MIN_PART_SIZE", PART)
    monkeypatch.setattr(objects, "_conditional_unsupported", False)


@pytest.fixture
def proxy(s3_server: Any, s3_env: dict[str, str]) -> Iterator[S3Proxy]:
    with S3Proxy(s3_server.endpoint_url) as p:
        yield p


@pytest.fixture
def writer(s3_bucket: tuple[Any, str], s3_env: dict[str, str]) -> Iterator[tuple[ObjectWriter, Any, str]]:
    _, bucket = s3_bucket
    s3 = s3_client()
    with ThreadPoolExecutor(4) as pool:
        yield ObjectWriter(s3, bucket, "ident", part_size=PART, part_pool=pool), s3, bucket


def _source(name: str, data: bytes) -> ObjectSource:
    return ObjectSource.from_buffers(name, [data])


@pytest.mark.parametrize("size", [1000, 12 * MIB], ids=["put", "multipart"])
def test_412_with_same_bytes_counts_as_uploaded(writer: tuple[ObjectWriter, Any, str], size: int) -> None:
    w, s3, bucket = writer
    data = bytes(range(256)) * (size // 256)
    assert w.write("ident/f", _source("f", data)) == "uploaded"
    # written again without listing first: the store's 412 and a HEAD decide
    assert w.write("ident/f", _source("f", data)) == "existing"
    assert open_uploads(s3, bucket) == []


@pytest.mark.parametrize("size", [1000, 12 * MIB], ids=["put", "multipart"])
def test_412_with_other_bytes_is_a_conflict_and_changes_nothing(
    writer: tuple[ObjectWriter, Any, str], size: int
) -> None:
    w, s3, bucket = writer
    first = b"\x01" * size
    w.write("ident/f", _source("f", first))
    with pytest.raises(SnapshotConflictError) as info:
        w.write("ident/f", _source("f", b"\x02" * size))
    assert info.value.identity == "ident" and info.value.conflicts[0].startswith("f (stored ")
    data, metadata, _ = stored(s3, bucket, "ident")["f"]
    assert data == first and metadata["cwtrain-sha256"] == sha256(first)
    assert open_uploads(s3, bucket) == []  # the refused multipart upload was aborted


def test_409_is_retried(proxy: S3Proxy, s3_bucket: tuple[Any, str]) -> None:
    _, bucket = s3_bucket
    proxy.refuse("PutObject", 409, "ConditionalRequestConflict", times=2)
    s3 = s3_client(proxy.endpoint_url)
    with SnapshotUpload(s3, bucket=bucket, identity="retry", part_size=PART) as up:
        up.add(SnapshotFile.from_bytes("a", b"abc"))
        up.commit(b"{}")
    assert proxy.count("PutObject") == 4  # a: 2 refused + 1 stored; the index: 1
    assert stored(s3, bucket, "retry")["a"][0] == b"abc"


def test_409_then_412_rule_on_complete(proxy: S3Proxy, s3_bucket: tuple[Any, str]) -> None:
    """After three 409s the answer counts as 412: HEAD, and the equal object is accepted."""
    _, bucket = s3_bucket
    data = b"\x07" * (6 * MIB)
    s3_client().put_object(Bucket=bucket, Key="late/big", Body=data, Metadata={"cwtrain-sha256": sha256(data)})
    proxy.refuse("CompleteMultipartUpload", 409, "ConditionalRequestConflict")
    s3 = s3_client(proxy.endpoint_url)
    with ThreadPoolExecutor(2) as pool:
        w = ObjectWriter(s3, bucket, "late", part_size=PART, part_pool=pool)
        assert w.write("late/big", _source("big", data)) == "existing"
    assert proxy.count("CompleteMultipartUpload") == 4
    assert open_uploads(s3, bucket) == []


def test_501_falls_back_to_check_then_write_with_one_warning(
    proxy: S3Proxy, s3_bucket: tuple[Any, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, bucket = s3_bucket

    def refuse_conditions(op: str, path: str, headers: dict[str, str]) -> tuple[int, str] | None:
        if op in ("PutObject", "CompleteMultipartUpload") and "If-None-Match" in headers:
            return 501, "NotImplemented"
        return None

    proxy.add_rule(refuse_conditions)
    s3 = s3_client(proxy.endpoint_url)
    big = bytes(range(256)) * (24 * 1024)
    caplog.set_level(logging.WARNING, logger="cwtrain.hotload.store.object_writer")
    for identity in ("one", "two"):
        with SnapshotUpload(s3, bucket=bucket, identity=identity, part_size=PART, workers=2) as up:
            up.add(SnapshotFile.from_bytes("big", big))
            up.add(SnapshotFile.from_bytes("small", b"small"))
            up.commit(b"{}")
        got = stored(s3, bucket, identity)
        assert got["big"][0] == big and got["big"][1]["cwtrain-sha256"] == sha256(big)
        assert got["small"][0] == b"small"
    warnings = [r for r in caplog.records if "If-None-Match" in r.getMessage()]
    assert len(warnings) == 1
    assert not objects.conditional_writes_supported()
    # check-then-write still refuses other bytes
    with (
        pytest.raises(SnapshotConflictError),
        ThreadPoolExecutor(2) as pool,
    ):
        ObjectWriter(s3, bucket, "one", part_size=PART, part_pool=pool).write("one/small", _source("small", b"x"))
    assert stored(s3, bucket, "one")["small"][0] == b"small"


def test_lost_multipart_upload_is_restarted_once(proxy: S3Proxy, s3_bucket: tuple[Any, str]) -> None:
    """NoSuchUpload on a part (another publisher completed or aborted it): HEAD, then a fresh upload."""
    _, bucket = s3_bucket
    data = bytes(range(256)) * (24 * 1024)
    proxy.refuse("UploadPart", 404, "NoSuchUpload", times=1)
    s3 = s3_client(proxy.endpoint_url)
    with ThreadPoolExecutor(1) as pool:
        w = ObjectWriter(s3, bucket, "lost", part_size=PART, part_pool=pool)
        assert w.write("lost/big", _source("big", data)) == "uploaded"
    assert proxy.count("CreateMultipartUpload") == 2
    got = stored(s3, bucket, "lost")["big"]
    assert got[0] == data and got[1]["cwtrain-sha256"] == sha256(data)
    assert open_uploads(s3, bucket) == []
    proxy.refuse("UploadPart", 404, "NoSuchUpload")
    with ThreadPoolExecutor(1) as pool, pytest.raises(SnapshotError, match="twice"):
        ObjectWriter(s3, bucket, "lost", part_size=PART, part_pool=pool).write("lost/other", _source("o", data))
    assert open_uploads(s3, bucket) == []
