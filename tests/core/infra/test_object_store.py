"""The object-store seam: Boto3ObjectStore against moto's S3 server on loopback (and the refusing proxy)."""

from __future__ import annotations

import base64
import hashlib
import mmap
import pickle
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _s3_proxy import S3Proxy
from botocore.config import Config

from cwtrain.hotload.loader import HotLoader
from cwtrain.hotload.store.object_source import BufferPool, ObjectSource
from cwtrain.hotload.store.prefix import SnapshotStore
from cwtrain.infra import InferenceClient
from cwtrain.infra import objectstore as os_
from cwtrain.infra.objectstore import (
    AccessDeniedError,
    ConditionalConflictError,
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreStatusError,
    ObjectStoreTransportError,
    Payload,
    PreconditionFailedError,
    StoreNotImplementedError,
    UploadNotFoundError,
    status_error,
)
from cwtrain.infra.s3 import Boto3ObjectStore, as_object_store, object_store, s3_client
from cwtrain.local.harness.objectstore import free_port


@pytest.fixture
def store(s3_env: dict[str, str]) -> Boto3ObjectStore:
    return object_store()


@pytest.fixture
def proxy(s3_server: Any, s3_env: dict[str, str]) -> Iterator[S3Proxy]:
    with S3Proxy(s3_server.endpoint_url) as p:
        yield p


class Calls:
    """The query and body of every request of one operation a client sends (botocore's before-call event)."""

    def __init__(self, client: Any, operation: str) -> None:
        self.queries: list[dict[str, Any]] = []
        self.bodies: list[Any] = []
        self._lock = threading.Lock()
        client.meta.events.register(f"before-call.s3.{operation}", self._record)

    def _record(self, params: dict[str, Any], **_: Any) -> None:
        with self._lock:
            self.queries.append(dict(params.get("query_string") or {}))
            self.bodies.append(params.get("body"))


def test_put_head_get_and_missing_keys(s3_bucket: tuple[Any, str], store: Boto3ObjectStore) -> None:
    _, bucket = s3_bucket
    store.put(bucket, "p/a", b"data", metadata={"cwtrain-sha256": "ab" * 32}, content_type="application/json")
    info = store.head(bucket, "p/a")
    assert info is not None
    assert (info.key, info.size, info.metadata) == ("p/a", 4, {"cwtrain-sha256": "ab" * 32})
    assert info.etag == '"8d777f385d3dfec8815d20f7496026dc"'  # MD5 of b"data", quoted as sent
    with store.get(bucket, "p/a") as body:
        assert body.info == info
        assert body.read(2) == b"da" and body.read() == b"ta"
    assert store.head(bucket, "p/missing") is None
    with pytest.raises(ObjectNotFoundError) as missing:
        store.get(bucket, "p/missing")
    error = missing.value
    assert (error.code, error.http_status, error.operation, error.key) == ("NoSuchKey", 404, "GetObject", "p/missing")
    assert type(error.__cause__).__module__.startswith("botocore")


def test_create_only_put_refuses_a_taken_key(s3_bucket: tuple[Any, str], store: Boto3ObjectStore) -> None:
    s3, bucket = s3_bucket
    store.put(bucket, "k", b"first", if_none_match=True)
    with pytest.raises(PreconditionFailedError) as taken:
        store.put(bucket, "k", b"second", if_none_match=True)
    assert (taken.value.code, taken.value.http_status, taken.value.operation) == (
        "PreconditionFailed",
        412,
        "PutObject",
    )
    assert str(taken.value).startswith("An error occurred (PreconditionFailed) when calling the PutObject operation")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"first"


@pytest.mark.parametrize(
    ("status", "code", "error_type"),
    [
        (409, "ConditionalRequestConflict", ConditionalConflictError),
        (501, "NotImplemented", StoreNotImplementedError),
        (403, "AccessDenied", AccessDeniedError),
        (403, "SignatureDoesNotMatch", AccessDeniedError),
        (403, "InvalidAccessKeyId", AccessDeniedError),
        (400, "InvalidRequest", ObjectStoreStatusError),
    ],
)
def test_store_answers_become_typed_errors(
    proxy: S3Proxy, s3_bucket: tuple[Any, str], status: int, code: str, error_type: type[ObjectStoreStatusError]
) -> None:
    _, bucket = s3_bucket
    proxy.refuse("PutObject", status, code, times=1)
    store = object_store(proxy.endpoint_url)
    with pytest.raises(ObjectStoreStatusError) as refused:
        store.put(bucket, "k", b"x", if_none_match=True)
    error = refused.value
    assert type(error) is error_type
    assert (error.code, error.http_status, error.operation, error.key) == (code, status, "PutObject", "k")
    if status == 403:  # a refusal of the credentials names what to check
        refused_what = "the request" if code == "AccessDenied" else "the credentials"
        assert str(error).startswith(
            f"the object store at {proxy.endpoint_url} refused {refused_what} ({code} on PutObject k"
        )
    else:
        assert str(error).startswith(f"An error occurred ({code}) when calling the PutObject operation")
    assert proxy.count("PutObject") == 1  # answered, not retried by the client


def test_a_lost_multipart_upload_is_upload_not_found(proxy: S3Proxy, s3_bucket: tuple[Any, str]) -> None:
    _, bucket = s3_bucket
    store = object_store(proxy.endpoint_url)
    upload_id = store.create_multipart(bucket, "big", metadata={"cwtrain-sha256": "0" * 64})
    proxy.refuse("UploadPart", 404, "NoSuchUpload", times=1)
    with pytest.raises(UploadNotFoundError) as lost:
        store.upload_part(bucket, "big", upload_id, 1, b"part")
    assert isinstance(lost.value, ObjectNotFoundError) and lost.value.code == "NoSuchUpload"
    store.abort_multipart(bucket, "big", upload_id)
    assert store.list_multipart_uploads(bucket, "") == []


def test_no_answer_is_a_transport_error_even_for_head(s3_env: dict[str, str]) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    store = object_store(endpoint, config=Config(retries={"total_max_attempts": 1}))
    with pytest.raises(ObjectStoreTransportError) as unreachable:
        store.head("bucket-name", "key")  # not "missing": nothing answered
    assert str(unreachable.value) == (
        f"cannot reach the object store at {endpoint} (the endpoint_url given to s3_client) (HeadObject: could not "
        f"connect to {endpoint}/bucket-name/key: Failed to establish a new connection: [Errno 111] Connection "
        "refused); check that endpoint_url names a running S3-compatible endpoint"
    )
    assert unreachable.value.operation == "HeadObject"
    assert not isinstance(unreachable.value, ObjectStoreStatusError)


def test_listings_follow_every_page(s3_bucket: tuple[Any, str], store: Boto3ObjectStore) -> None:
    _, bucket = s3_bucket

    def two_keys_per_page(params: dict[str, Any], **_: Any) -> None:
        params.setdefault("MaxKeys", 2)

    def two_parts_per_page(params: dict[str, Any], **_: Any) -> None:
        params.setdefault("MaxParts", 2)

    store.client.meta.events.register("provide-client-params.s3.ListObjectsV2", two_keys_per_page)
    store.client.meta.events.register("provide-client-params.s3.ListParts", two_parts_per_page)
    lists = Calls(store.client, "ListObjectsV2")
    for i in range(5):
        store.put(bucket, f"p/{i}", bytes(i))
    store.put(bucket, "p/deeper/x", b"")
    direct = store.list_objects(bucket, "p/", delimiter="/")
    assert [(o.key, o.size) for o in direct] == [(f"p/{i}", i) for i in range(5)]
    assert len(lists.queries) == 3 and "continuation-token" in lists.queries[-1]
    assert len(store.list_objects(bucket, "p/")) == 6
    lists.queries.clear()
    assert [o.key for o in store.list_objects(bucket, "p/", limit=1)] == ["p/0"]
    assert len(lists.queries) == 1 and lists.queries[0]["max-keys"] == 1

    upload_id = store.create_multipart(bucket, "p/big")
    etags = [store.upload_part(bucket, "p/big", upload_id, n, b"x" * n) for n in (1, 2, 3)]
    part_lists = Calls(store.client, "ListParts")
    parts = store.list_parts(bucket, "p/big", upload_id)
    assert [q["part-number-marker"] for q in part_lists.queries] == [0, 2]
    assert [(p.number, p.etag, p.size) for p in parts] == [(1, etags[0], 1), (2, etags[1], 2), (3, etags[2], 3)]
    [open_upload] = store.list_multipart_uploads(bucket, "p/")
    assert (open_upload.key, open_upload.upload_id) == ("p/big", upload_id) and open_upload.initiated > 0
    store.abort_multipart(bucket, "p/big", upload_id)


def test_multipart_complete_is_create_only(s3_bucket: tuple[Any, str], store: Boto3ObjectStore) -> None:
    s3, bucket = s3_bucket
    part = b"\x05" * (5 << 20)
    sent: list[tuple[dict[str, Any], bytes]] = []
    store.client.meta.events.register(
        "before-send.s3.CompleteMultipartUpload",
        lambda request, **_: sent.append((dict(request.headers), request.body)),
    )
    for expected in (None, PreconditionFailedError):
        upload_id = store.create_multipart(bucket, "mp", metadata={"cwtrain-sha256": "1" * 64})
        etags = [store.upload_part(bucket, "mp", upload_id, n, part) for n in (1, 2)]
        if expected is None:
            store.complete_multipart(bucket, "mp", upload_id, [(1, etags[0]), (2, etags[1])], if_none_match=True)
        else:
            with pytest.raises(expected):
                store.complete_multipart(bucket, "mp", upload_id, [(1, etags[0]), (2, etags[1])], if_none_match=True)
            store.abort_multipart(bucket, "mp", upload_id)
    for headers, body in sent:
        assert headers["If-None-Match"] in ("*", b"*")
        assert body.count(b"<PartNumber>") == 2 and body.index(b"<PartNumber>1<") < body.index(b"<PartNumber>2<")
    stored = s3.head_object(Bucket=bucket, Key="mp")
    assert stored["ContentLength"] == 2 * len(part) and stored["Metadata"] == {"cwtrain-sha256": "1" * 64}


@pytest.fixture
def sendfile_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int | None]]:
    """(offset, count) of every ``socket.sendfile`` in this process."""
    calls: list[tuple[int, int | None]] = []
    original = socket.socket.sendfile

    def spy(self: socket.socket, file: Any, offset: int = 0, count: int | None = None) -> int:
        calls.append((offset, count))
        return original(self, file, offset, count)

    monkeypatch.setattr(socket.socket, "sendfile", spy)
    return calls


def test_file_bytes_go_out_from_the_buffers_they_were_hashed_in_with_their_sha256_checksum(
    s3_bucket: tuple[Any, str], store: Boto3ObjectStore, tmp_path: Path, sendfile_calls: list[tuple[int, int | None]]
) -> None:
    s3, bucket = s3_bucket
    data = bytes(range(256)) * 4096  # 1 MiB
    (tmp_path / "shard").write_bytes(data)
    source = ObjectSource.from_path(tmp_path / "shard")
    headers: list[dict[str, str]] = []
    store.client.meta.events.register(
        "before-send.s3.PutObject", lambda request, **_: headers.append(dict(request.headers))
    )
    try:
        with source.reading(part_size=len(data), pool=BufferPool(4 << 20)) as reading:
            body = reading.part(0, source.size)
            assert all(isinstance(view.obj, (bytearray, mmap.mmap)) for view in body.views)  # our read buffers
            store.put(bucket, "file", body, metadata={"cwtrain-sha256": reading.sha256}, sha256=reading.sha256)
    finally:
        source.close()
    assert sendfile_calls == []  # never the page cache as it is at send time
    digest = hashlib.sha256(data)
    assert reading.sha256 == digest.hexdigest() == source.sha256()
    sent = {k.lower(): (v.decode() if isinstance(v, bytes) else v) for k, v in headers[0].items()}
    assert sent["content-length"] == str(len(data)) and sent["x-amz-meta-cwtrain-sha256"] == digest.hexdigest()
    assert sent["x-amz-checksum-sha256"] == base64.b64encode(digest.digest()).decode()
    assert sent["x-amz-sdk-checksum-algorithm"] == "SHA256"
    assert "content-md5" not in sent and not [h for h in sent if h.startswith("x-amz-checksum-crc")]
    assert s3.get_object(Bucket=bucket, Key="file")["Body"].read() == data
    stored = store.head(bucket, "file", checksum=True)
    assert stored is not None and stored.checksum_sha256 == digest.hexdigest()
    plain = store.head(bucket, "file")
    assert plain is not None and plain.checksum_sha256 is None  # asked for only with checksum=True

    pieces = [memoryview(b"head-"), memoryview(bytearray(b"middle-")), memoryview(b"tail")]
    store.put(bucket, "views", Payload(pieces))
    assert s3.get_object(Bucket=bucket, Key="views")["Body"].read() == b"head-middle-tail"
    assert sendfile_calls == []


def test_download_copies_one_object(s3_bucket: tuple[Any, str], store: Boto3ObjectStore, tmp_path: Path) -> None:
    _, bucket = s3_bucket
    store.put(bucket, "m/config.json", b'{"a": 1}')
    store.download(bucket, "m/config.json", tmp_path / "config.json")
    assert (tmp_path / "config.json").read_bytes() == b'{"a": 1}'
    with pytest.raises(ObjectNotFoundError):
        store.download(bucket, "m/missing", tmp_path / "missing")


def test_raw_clients_are_wrapped_and_stores_pass_through(s3_env: dict[str, str]) -> None:
    client = s3_client()
    wrapped = as_object_store(client)
    assert isinstance(wrapped, Boto3ObjectStore) and wrapped.client is client
    assert isinstance(wrapped, ObjectStore) and not isinstance(client, ObjectStore)
    assert as_object_store(wrapped) is wrapped
    snapshots = SnapshotStore(client, "weights", "/hl/")
    assert isinstance(snapshots.s3, Boto3ObjectStore) and snapshots.s3.client is client
    assert snapshots.path_prefix == "hl"
    with InferenceClient("token", base_url="http://127.0.0.1:9") as api:
        assert HotLoader(api, "dep", s3=wrapped).s3 is wrapped
        built = HotLoader(api, "dep").s3  # from the environment, on first use
        assert isinstance(built, Boto3ObjectStore) and built.client.meta.region_name == s3_env["AWS_REGION"]


@pytest.mark.parametrize(
    ("code", "status", "error_type"),
    [
        ("NoSuchUpload", 404, UploadNotFoundError),
        ("ConditionalRequestConflict", 409, ConditionalConflictError),
        ("OperationAborted", 409, ConditionalConflictError),
        ("PreconditionFailed", 412, PreconditionFailedError),
        ("NotImplemented", 501, StoreNotImplementedError),
        ("NoSuchKey", 404, ObjectNotFoundError),
        ("404", 404, ObjectNotFoundError),
        ("403", 403, AccessDeniedError),
        ("NoSuchBucket", 404, ObjectNotFoundError),
        ("SlowDown", 503, ObjectStoreStatusError),
    ],
)
def test_status_error_picks_the_class_by_code_then_status(
    code: str, status: int, error_type: type[ObjectStoreStatusError]
) -> None:
    assert type(status_error("m", code=code, http_status=status)) is error_type


def test_store_errors_pickle_with_their_fields() -> None:
    errors: list[ObjectStoreError] = [
        ObjectStoreTransportError("no answer", operation="PutObject", key="k"),
        *(
            cls("answered", code="C", http_status=418, operation="HeadObject", key="k")
            for cls in (
                ObjectStoreStatusError,
                ObjectNotFoundError,
                UploadNotFoundError,
                PreconditionFailedError,
                ConditionalConflictError,
                AccessDeniedError,
                StoreNotImplementedError,
            )
        ),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and copy.__dict__ == error.__dict__ and str(copy) == str(error)
    assert set(os_.__all__) >= {type(e).__name__ for e in errors}
