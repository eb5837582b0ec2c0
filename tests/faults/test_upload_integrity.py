"""Files that change while they are published, and stores that receive other bytes than were hashed.

A publish reads every file once into buffers, hashes those bytes and sends the same
buffers; a file that is rewritten, truncated or replaced between the moment the publish
opens it and the moment the index would be written is a clear ``SnapshotError``, never a
published snapshot and never ``SIGBUS``. The loopback proxy (``tests/_s3_proxy.py``) runs the
fault at a chosen request, so each case hits one phase: before the file is read, while
its parts are sent, after its object is stored, or between the hash pass and the re-read
of a file larger than the memory budget. After every case: no index, no unfinished
multipart upload, and every stored object holds the bytes its ``cwtrain-sha256`` names.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _s3_proxy import Request, S3Proxy
from safetensors.numpy import save_file

from cwtrain.errors import SnapshotChecksumError, SnapshotError
from cwtrain.hotload.format.index import INDEX_NAME
from cwtrain.hotload.store import object_writer as objects
from cwtrain.hotload.store.snapshot_upload import upload_snapshot
from cwtrain.infra.s3 import s3_client

pytestmark = [pytest.mark.faults]

MIB = 1 << 20
PART = 5 * MIB
BIG = "model-00001-of-00002.safetensors"
SMALL = "model-00002-of-00002.safetensors"
CORE_TESTS = Path(__file__).resolve().parents[1] / "core"


def _snapshot(root: Path, *, seed: int, big_bytes: int = 12 * MIB) -> Path:
    """config.json, a shard of three 5 MiB parts, a small shard, and the index."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    big = rng.integers(0, 2**31, size=big_bytes // 4, dtype=np.int64).astype(np.float32)
    small = rng.standard_normal(256).astype(np.float32)
    save_file({"model.embed.weight": big}, str(root / BIG))
    save_file({"lm_head.weight": small}, str(root / SMALL))
    index = {
        "metadata": {"total_size": big.nbytes + small.nbytes},
        "weight_map": {"model.embed.weight": BIG, "lm_head.weight": SMALL},
    }
    (root / INDEX_NAME).write_text(json.dumps(index))
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
    return root


def _rewrite_in_place(path: Path, *, keep_mtime: bool = False) -> None:
    """Overwrite every byte after the header with other bytes, same size, same inode."""
    before = path.stat()
    with path.open("r+b") as handle:
        handle.seek(4096)
        handle.write(os.urandom(before.st_size - 4096))
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _truncate(path: Path, size: int) -> None:
    os.truncate(path, size)


def _assert_nothing_published(s3: Any, bucket: str, identity: str) -> None:
    """No index, no unfinished multipart upload, every stored object equal to its recorded SHA-256."""
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"{identity}/").get("Contents", [])]
    assert f"{identity}/{INDEX_NAME}" not in keys
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    for key in keys:
        obj = s3.get_object(Bucket=bucket, Key=key)
        assert hashlib.sha256(obj["Body"].read()).hexdigest() == obj["Metadata"]["cwtrain-sha256"], key


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(objects, "MIN_PART_SIZE", PART)
    return PART


@pytest.fixture
def proxy(s3_server: Any, s3_env: dict[str, str]) -> Iterator[S3Proxy]:
    with S3Proxy(s3_server.endpoint_url) as p:
        yield p


def _publish(snap: Path, bucket: str, identity: str, proxy: S3Proxy, *, workers: int = 1) -> str:
    return upload_snapshot(
        snap, bucket=bucket, identity=identity, s3=s3_client(proxy.endpoint_url), part_size=PART, workers=workers
    )


# ------------------------------------------------------------------ torn uploads


@pytest.mark.fault_row("torn-upload")
def test_shard_rewritten_while_its_parts_are_sent_is_not_published(
    tmp_path: Path, s3_bucket: tuple[Any, str], proxy: S3Proxy, small_parts: int
) -> None:
    s3, bucket = s3_bucket
    snap = _snapshot(tmp_path / "snap", seed=1)
    proxy.on("UploadPart", lambda request: _rewrite_in_place(snap / BIG), times=1)
    with pytest.raises(SnapshotError, match="changed while it was being published") as info:
        _publish(snap, bucket, "torn-send", proxy)
    assert BIG in str(info.value)
    _assert_nothing_published(s3, bucket, "torn-send")
    assert "AbortMultipartUpload" in proxy.operations() and "CompleteMultipartUpload" not in proxy.operations()


@pytest.mark.fault_row("torn-upload")
def test_shard_rewritten_after_the_publish_opened_it_is_not_published(
    tmp_path: Path, s3_bucket: tuple[Any, str], proxy: S3Proxy, small_parts: int
) -> None:
    s3, bucket = s3_bucket
    snap = _snapshot(tmp_path / "snap", seed=2)
    proxy.on("ListObjectsV2", lambda request: _rewrite_in_place(snap / BIG), times=1)  # files are open, not read
    with pytest.raises(SnapshotError, match=f"{BIG}: the file changed"):
        _publish(snap, bucket, "torn-open", proxy, workers=4)
    _assert_nothing_published(s3, bucket, "torn-open")


@pytest.mark.fault_row("torn-upload")
def test_shard_rewritten_after_its_object_is_stored_keeps_the_index_back(
    tmp_path: Path, s3_bucket: tuple[Any, str], proxy: S3Proxy, small_parts: int
) -> None:
    s3, bucket = s3_bucket
    snap = _snapshot(tmp_path / "snap", seed=3)
    proxy.on("CompleteMultipartUpload", lambda request: _rewrite_in_place(snap / BIG), times=1)
    with pytest.raises(SnapshotError, match=f"{BIG}: the file changed"):
        _publish(snap, bucket, "torn-late", proxy)
    _assert_nothing_published(s3, bucket, "torn-late")
    assert "PutObject" not in [r.operation for r in proxy.seen if r.key.endswith(INDEX_NAME)]


@pytest.mark.fault_row("torn-upload")
def test_file_larger_than_the_budget_rewritten_between_hash_and_send_is_not_published(
    tmp_path: Path,
    s3_bucket: tuple[Any, str],
    proxy: S3Proxy,
    small_parts: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hashed first, then re-read part by part: the second SHA-256 must equal the first."""
    s3, bucket = s3_bucket
    monkeypatch.setenv("CWTRAIN_HOTLOAD_MEMORY_BUDGET", str(6 * MIB))  # the 12 MiB shard is re-read
    snap = _snapshot(tmp_path / "snap", seed=4)
    proxy.on("CreateMultipartUpload", lambda request: _rewrite_in_place(snap / BIG, keep_mtime=True), times=1)
    with pytest.raises(SnapshotError, match="SHA-256 differs between the hash pass and the bytes sent") as info:
        _publish(snap, bucket, "torn-reread", proxy)
    assert BIG in str(info.value)
    _assert_nothing_published(s3, bucket, "torn-reread")
    assert "CompleteMultipartUpload" not in proxy.operations()


# ------------------------------------------------------------------ truncated shards

# A publisher process: upload_snapshot, or HotLoader.upload against the fake API (args: snap, bucket, mode).
PUBLISHER = textwrap.dedent(
    """
    import sys
    from cwtrain.hotload.store import object_writer as objects
    objects.MIN_PART_SIZE = 5 << 20
    snap, bucket, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "upload_snapshot":
        from cwtrain.hotload.store.snapshot_upload import upload_snapshot
        upload_snapshot(snap, bucket=bucket, identity="cut", workers=1, part_size=5 << 20)
    else:
        sys.path.insert(0, sys.argv[4])
        from fakeapi import FakeAPI
        from cwtrain.hotload.loader import HotLoader
        api = FakeAPI()
        api.add_gateway()
        api.add_deployment()
        api.deployments["dep-1"]["spec"]["hotLoad"].update(bucket=bucket, pathPrefix="")
        HotLoader(api.client(), "dep-1").upload(snap, "cut", workers=1)
    print("published", flush=True)
    """
)


@pytest.mark.fault_row("truncated-shard")
@pytest.mark.parametrize("mode", ["upload_snapshot", "HotLoader.upload"])
def test_shard_truncated_under_a_publisher_process_is_an_error_not_sigbus(
    tmp_path: Path, s3_bucket: tuple[Any, str], proxy: S3Proxy, s3_env: dict[str, str], mode: str
) -> None:
    s3, bucket = s3_bucket
    snap = _snapshot(tmp_path / "snap", seed=5)
    proxy.on("ListObjectsV2", lambda request: _truncate(snap / BIG, 6 * MIB), times=1)  # opened, not read yet
    env = {**os.environ, "CW_S3_ENDPOINT": proxy.endpoint_url}
    done = subprocess.run(
        [sys.executable, "-c", PUBLISHER, str(snap), bucket, mode, str(CORE_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode != -signal.SIGBUS, "the publisher died of SIGBUS"
    assert done.returncode == 1 and "published" not in done.stdout, (done.returncode, done.stderr[-2000:])
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("cwtrain.errors.SnapshotError") and BIG in last and "changed while" in last, last
    _assert_nothing_published(s3, bucket, "cut")


@pytest.mark.fault_row("truncated-shard")
def test_shard_truncated_while_its_parts_are_sent_aborts_its_upload(
    tmp_path: Path, s3_bucket: tuple[Any, str], proxy: S3Proxy, small_parts: int
) -> None:
    s3, bucket = s3_bucket
    snap = _snapshot(tmp_path / "snap", seed=6)
    proxy.on("UploadPart", lambda request: _truncate(snap / BIG, 7 * MIB), times=1)
    with pytest.raises(SnapshotError, match=r"changed while it was being published \(size \d+ -> 7340032 bytes\)"):
        _publish(snap, bucket, "cut-send", proxy)
    _assert_nothing_published(s3, bucket, "cut-send")
    assert "AbortMultipartUpload" in proxy.operations()


@pytest.mark.fault_row("truncated-shard")
def test_file_larger_than_the_budget_truncated_during_its_reread_aborts_its_upload(
    tmp_path: Path,
    s3_bucket: tuple[Any, str],
    proxy: S3Proxy,
    small_parts: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s3, bucket = s3_bucket
    monkeypatch.setenv("CWTRAIN_HOTLOAD_MEMORY_BUDGET", str(6 * MIB))
    snap = _snapshot(tmp_path / "snap", seed=7)
    proxy.on("UploadPart", lambda request: _truncate(snap / BIG, 7 * MIB), times=1)
    with pytest.raises(SnapshotError, match=f"{BIG}: the file changed .*it ended at byte 7340032"):
        _publish(snap, bucket, "cut-reread", proxy)
    _assert_nothing_published(s3, bucket, "cut-reread")
    assert "AbortMultipartUpload" in proxy.operations()


# ------------------------------------------------------------------ the store gets other bytes


def _flip_first_byte(request: Request) -> None:
    request.body = bytes([request.body[0] ^ 0xFF]) + request.body[1:]


@pytest.mark.fault_row("stored-mismatch")
def test_body_changed_on_its_way_is_refused_by_its_checksum(
    tmp_path: Path, s3_bucket: tuple[Any, str], proxy: S3Proxy, small_parts: int
) -> None:
    """A single PutObject carries x-amz-checksum-sha256 = cwtrain-sha256; the store refuses other bytes."""
    s3, bucket = s3_bucket
    snap = _snapshot(tmp_path / "snap", seed=8)
    proxy.on("PutObject", lambda r: _flip_first_byte(r) if r.key.endswith(SMALL) else None)
    with pytest.raises(SnapshotChecksumError, match=f"{SMALL}: the store received other bytes") as info:
        _publish(snap, bucket, "flipped", proxy)
    assert "BadDigest" in str(info.value)
    _assert_nothing_published(s3, bucket, "flipped")
    small_puts = [r for r in proxy.seen if r.operation == "PutObject" and r.key.endswith(SMALL)]
    digest = hashlib.sha256((snap / SMALL).read_bytes()).hexdigest()
    assert small_puts and all(r.headers["x-amz-meta-cwtrain-sha256"] == digest for r in small_puts)


@pytest.mark.fault_row("stored-mismatch")
def test_object_stored_with_other_metadata_than_hashed_keeps_the_index_back(
    tmp_path: Path, s3_bucket: tuple[Any, str], proxy: S3Proxy, small_parts: int
) -> None:
    """Every stored object is checked with a HEAD against what was hashed before the index goes out."""
    s3, bucket = s3_bucket
    snap = _snapshot(tmp_path / "snap", seed=9)

    def forge(request: Request) -> None:
        """Before the store answers the HEAD of the stored shard, give it another recorded SHA-256.

        (Rewriting the header in flight would break the request's signature: the store refuses it.)
        """
        if request.key != f"forged/{BIG}":
            return
        metadata = s3.head_object(Bucket=bucket, Key=request.key)["Metadata"]
        s3.copy_object(
            Bucket=bucket,
            Key=request.key,
            CopySource={"Bucket": bucket, "Key": request.key},
            Metadata={**metadata, "cwtrain-sha256": "0" * 64},
            MetadataDirective="REPLACE",
        )

    proxy.on("HeadObject", forge)
    with pytest.raises(SnapshotChecksumError, match=f"{BIG}: the stored object is not the bytes that were hashed"):
        _publish(snap, bucket, "forged", proxy)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="forged/").get("Contents", [])]
    assert f"forged/{INDEX_NAME}" not in keys
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
