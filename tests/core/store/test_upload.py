"""upload_snapshot and SnapshotUpload against moto's S3 server on loopback."""

from __future__ import annotations

import hashlib
import io
import threading
from pathlib import Path
from typing import Any

import pytest
from _upload_util import MIB, open_uploads, sha256, stored, write_full_snapshot

from cwtrain.errors import ConfigError, SnapshotConflictError, SnapshotError, UsageError
from cwtrain.hotload.format.index import INDEX_NAME, SnapshotFile
from cwtrain.hotload.store import object_writer as objects
from cwtrain.hotload.store.snapshot_upload import SnapshotUpload, UploadedFile, upload_snapshot
from cwtrain.infra.s3 import s3_client
from cwtrain.progress import ByteProgress

PART = 5 * MIB


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> int:
    """Allow 5 MiB parts (moto's minimum) so multipart tests stay small."""
    monkeypatch.setattr(objects, "MIN_PART_SIZE", PART)
    return PART


@pytest.fixture
def s3(s3_env: dict[str, str]) -> Any:
    return s3_client()


class Calls:
    """Counts the S3 operations a client sends (botocore's before-call event)."""

    def __init__(self, client: Any) -> None:
        self.ops: list[str] = []
        self._lock = threading.Lock()
        client.meta.events.register("before-call.s3", self._record)

    def _record(self, model: Any, **_: Any) -> None:
        with self._lock:
            self.ops.append(model.name)

    def writes(self) -> list[str]:
        return [op for op in self.ops if op in ("PutObject", "UploadPart", "CreateMultipartUpload")]


def test_upload_then_download_every_byte_and_sha(
    tmp_path: Path, s3_bucket: tuple[Any, str], s3: Any, small_parts: int
) -> None:
    _, bucket = s3_bucket
    snap = write_full_snapshot(tmp_path / "snap", seed=1)
    seen: list[UploadedFile] = []
    progress: list[int] = []
    lock = threading.Lock()

    def on_progress(n: int) -> None:
        with lock:
            progress.append(n)

    calls = Calls(s3)
    uri = upload_snapshot(
        snap,
        bucket=bucket,
        identity="run-v000001",
        path_prefix="/hotload/",
        s3=s3,
        part_size=PART,
        on_file=seen.append,
        on_progress=on_progress,
    )
    assert uri == f"s3://{bucket}/hotload/run-v000001/"
    objects_ = stored(s3, bucket, "hotload/run-v000001")
    local = {p.name: p.read_bytes() for p in snap.iterdir()}
    assert set(objects_) == set(local)
    for name, (data, metadata, _) in objects_.items():
        assert data == local[name], name
        assert metadata["cwtrain-sha256"] == sha256(local[name]), name
    assert {f.name: f.outcome for f in seen} == dict.fromkeys(local, "uploaded")
    assert sum(progress) == sum(len(b) for b in local.values())
    # the big shard went up in parallel parts (3 of 5 MiB), with its SHA-256 fixed at create time
    # and in its marker part (10000), which the completion leaves out
    assert calls.ops.count("UploadPart") == 3 + 1 and calls.ops.count("CreateMultipartUpload") == 1
    # the index was written last
    puts = [op for op in calls.ops if op in ("PutObject", "CompleteMultipartUpload")]
    assert len(puts) == 4
    assert open_uploads(s3, bucket) == []


def test_progress_renders_bytes_rate_and_eta_on_a_terminal(
    tmp_path: Path, s3_bucket: tuple[Any, str], s3: Any, small_parts: int
) -> None:
    _, bucket = s3_bucket
    snap = write_full_snapshot(tmp_path / "snap", seed=9)
    total = sum(p.stat().st_size for p in snap.iterdir())

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    progress = ByteProgress("uploading tty", total, stream=screen, interval=0.0)
    upload_snapshot(snap, bucket=bucket, identity="tty", s3=s3, part_size=PART, on_progress=progress.add)
    progress.close()
    assert progress.done == total
    last = screen.getvalue().rsplit("\r", 1)[-1]
    assert "(100%)" in last and "/s in " in last


def test_index_is_written_after_every_other_object(
    tmp_path: Path, s3_bucket: tuple[Any, str], s3: Any, small_parts: int
) -> None:
    _, bucket = s3_bucket
    snap = write_full_snapshot(tmp_path / "snap", seed=2)
    order: list[str] = []

    def remember(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["test_key"] = params["url_path"]

    def finished(context: dict[str, Any], **_: Any) -> None:
        order.append(context["test_key"])  # when the store confirmed the object

    for op in ("PutObject", "CompleteMultipartUpload"):
        s3.meta.events.register(f"before-call.s3.{op}", remember)
        s3.meta.events.register(f"after-call.s3.{op}", finished)
    upload_snapshot(snap, bucket=bucket, identity="order", s3=s3, part_size=PART, workers=4)
    assert len(order) == 4 and order[-1].split("?")[0].endswith(INDEX_NAME)


def test_second_upload_uploads_nothing(tmp_path: Path, s3_bucket: tuple[Any, str], s3: Any, small_parts: int) -> None:
    _, bucket = s3_bucket
    snap = write_full_snapshot(tmp_path / "snap", seed=3)
    upload_snapshot(snap, bucket=bucket, identity="again", s3=s3, part_size=PART)
    before = stored(s3, bucket, "again")
    calls = Calls(s3)
    seen: list[UploadedFile] = []
    assert upload_snapshot(snap, bucket=bucket, identity="again", s3=s3, part_size=PART, on_file=seen.append)
    assert calls.writes() == [] and "CompleteMultipartUpload" not in calls.ops
    assert {f.outcome for f in seen} == {"existing"} and len(seen) == 4
    assert stored(s3, bucket, "again") == before


def test_different_bytes_conflict_and_leave_objects_unchanged(
    tmp_path: Path, s3_bucket: tuple[Any, str], s3: Any, small_parts: int
) -> None:
    _, bucket = s3_bucket
    first = write_full_snapshot(tmp_path / "a", seed=4)
    second = write_full_snapshot(tmp_path / "b", seed=5)
    upload_snapshot(first, bucket=bucket, identity="taken", path_prefix="p", s3=s3, part_size=PART)
    before = stored(s3, bucket, "p/taken")
    calls = Calls(s3)
    with pytest.raises(SnapshotConflictError) as info:
        upload_snapshot(second, bucket=bucket, identity="taken", path_prefix="p", s3=s3, part_size=PART)
    assert info.value.identity == "taken"
    names = " ".join(info.value.conflicts)
    assert "model-00001-of-00002.safetensors" in names and "config.json" in names
    assert "new identity" in str(info.value)
    assert calls.writes() == []
    assert stored(s3, bucket, "p/taken") == before
    assert open_uploads(s3, bucket) == []


def test_keys_not_part_of_the_snapshot_conflict(
    tmp_path: Path, s3_bucket: tuple[Any, str], s3: Any, small_parts: int
) -> None:
    _, bucket = s3_bucket
    snap = write_full_snapshot(tmp_path / "snap", seed=6)
    s3.put_object(Bucket=bucket, Key="stray/extra.bin", Body=b"x")
    s3.put_object(Bucket=bucket, Key="stray/deeper/ignored.bin", Body=b"y")  # deeper keys are ignored
    calls = Calls(s3)
    with pytest.raises(SnapshotConflictError) as info:
        upload_snapshot(snap, bucket=bucket, identity="stray", s3=s3, part_size=PART)
    assert info.value.conflicts == ["extra.bin (not part of this snapshot)"]
    assert calls.writes() == []


def test_objects_without_sha_metadata_compare_by_etag(
    tmp_path: Path, s3_bucket: tuple[Any, str], s3: Any, small_parts: int
) -> None:
    """A single-part MD5 ETag and an SDK 8 MiB multipart ETag both prove equality."""
    from boto3.s3.transfer import TransferConfig

    _, bucket = s3_bucket
    snap = write_full_snapshot(tmp_path / "snap", seed=7, big_bytes=17 * MIB)
    big = "model-00001-of-00002.safetensors"
    plain = s3_client()
    plain.upload_file(str(snap / big), bucket, f"etag/{big}", Config=TransferConfig(multipart_threshold=8 * MIB))
    plain.put_object(Bucket=bucket, Key="etag/config.json", Body=(snap / "config.json").read_bytes())
    assert "-" in s3.head_object(Bucket=bucket, Key=f"etag/{big}")["ETag"]
    seen: list[UploadedFile] = []
    upload_snapshot(snap, bucket=bucket, identity="etag", s3=s3, part_size=PART, on_file=seen.append)
    outcomes = {f.name: f.outcome for f in seen}
    assert outcomes[big] == "existing" and outcomes["config.json"] == "existing"
    assert outcomes[INDEX_NAME] == "uploaded"
    # different bytes without metadata: a conflict
    (snap / "config.json").write_text('{"other": 1}')
    with pytest.raises(SnapshotConflictError, match=r"config\.json"):
        upload_snapshot(snap, bucket=bucket, identity="etag", s3=s3, part_size=PART)


def test_streaming_upload_commits_index_last(s3_bucket: tuple[Any, str], s3: Any, small_parts: int) -> None:
    _, bucket = s3_bucket
    header = b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "
    shard = SnapshotFile("model-00000-of-00002.safetensors", (header, bytes(range(256)) * (44 * 1024), b"end"))
    small = SnapshotFile.from_bytes("model-00001-of-00002.safetensors", b"\x00" * 1000)
    empty = SnapshotFile.from_bytes("empty.txt", b"")
    index = SnapshotFile.from_bytes(INDEX_NAME, b'{"weight_map": {}}')
    with SnapshotUpload(s3, bucket=bucket, identity="stream", path_prefix="hl", part_size=PART, workers=2) as up:
        up.add(shard)
        up.add(small)
        up.add(empty)
        with pytest.raises(UsageError):
            up.add(small)
        assert up.commit(index) == f"s3://{bucket}/hl/stream/"
    got = stored(s3, bucket, "hl/stream")
    for file in (shard, small, empty, index):
        data = file.tobytes()
        assert got[file.name][0] == data
        assert got[file.name][1]["cwtrain-sha256"] == hashlib.sha256(data).hexdigest()


def test_streaming_upload_without_commit_writes_no_index(s3_bucket: tuple[Any, str], s3: Any, small_parts: int) -> None:
    _, bucket = s3_bucket
    big = SnapshotFile.from_bytes("model-00000-of-00001.safetensors", b"\x01" * (16 * MIB))
    with (
        pytest.raises(RuntimeError, match="trainer died"),
        SnapshotUpload(s3, bucket=bucket, identity="dropped", part_size=PART) as up,
    ):
        up.add(big)
        raise RuntimeError("trainer died")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert f"dropped/{INDEX_NAME}" not in keys
    assert open_uploads(s3, bucket) == []


def test_streaming_budget_blocks_add(s3_bucket: tuple[Any, str], s3: Any, small_parts: int) -> None:
    """With a budget of one file, add() returns only after the previous file is stored."""
    _, bucket = s3_bucket
    stored_names: list[str] = []
    with SnapshotUpload(
        s3,
        bucket=bucket,
        identity="budget",
        part_size=PART,
        memory_budget=1000,
        on_file=lambda f: stored_names.append(f.name),
    ) as up:
        for i in range(3):
            up.add(SnapshotFile.from_bytes(f"f{i}", bytes([i]) * 1000))
            assert len(stored_names) >= i  # the one before this was done before add() returned
        up.commit(None)
    assert sorted(stored_names) == ["f0", "f1", "f2"]


def test_part_size_below_50_mb_is_refused_before_any_io(tmp_path: Path, s3_bucket: tuple[Any, str], s3: Any) -> None:
    _, bucket = s3_bucket
    snap = write_full_snapshot(tmp_path / "snap", seed=8)
    calls = Calls(s3)
    with pytest.raises(ConfigError, match="part size"):
        upload_snapshot(snap, bucket=bucket, identity="tiny", s3=s3, part_size=1 * MIB)
    assert calls.ops == []


def test_configured_part_size_and_budget_are_checked(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CWTRAIN_HOTLOAD_PART_SIZE", "1000")
    with pytest.raises(ConfigError, match="CWTRAIN_HOTLOAD_PART_SIZE=1000"):
        SnapshotUpload(s3, bucket="b-b", identity="x")
    monkeypatch.setenv("CWTRAIN_HOTLOAD_PART_SIZE", str(100 * MIB))
    monkeypatch.setenv("CWTRAIN_HOTLOAD_MEMORY_BUDGET", "0")
    with pytest.raises(ConfigError, match="CWTRAIN_HOTLOAD_MEMORY_BUDGET"):
        SnapshotUpload(s3, bucket="b-b", identity="x")
    monkeypatch.delenv("CWTRAIN_HOTLOAD_MEMORY_BUDGET")
    assert SnapshotUpload(s3, bucket="b-b", identity="x").part_size == 100 * MIB


def test_part_size_for_huge_objects() -> None:
    assert objects.part_size_for(10 * MIB) == 64 * MIB
    huge = 1000 * 64 * MIB * 11  # would need 11,000 parts of 64 MiB
    size = objects.part_size_for(huge)
    assert size % MIB == 0 and -(-huge // size) < objects.MARKER_PART and size > 64 * MIB


def test_distributed_publish_ranks_share_then_one_commits(s3_bucket: tuple[Any, str], s3: Any) -> None:
    """Ranks store their shards with finish_share(); the committer checks them, then writes the index."""
    _, bucket = s3_bucket
    names = [f"model-0000{i}-of-00002.safetensors" for i in range(2)]
    committer = SnapshotUpload(s3, bucket=bucket, identity="dist", shared_files=names)
    with committer:  # opened before the ranks finish: commit looks the shards up again
        with SnapshotUpload(s3, bucket=bucket, identity="dist") as rank0:
            rank0.add(SnapshotFile.from_bytes(names[0], b"rank0"))
            assert [f.name for f in rank0.finish_share()] == [names[0]]
        with pytest.raises(SnapshotError, match="not stored yet") as info:
            committer.commit(b'{"weight_map": {}}')
        assert names[1] in str(info.value) and names[0] not in str(info.value)
    assert s3.list_objects_v2(Bucket=bucket, Prefix=f"dist/{INDEX_NAME}").get("KeyCount") == 0
    with SnapshotUpload(s3, bucket=bucket, identity="dist") as rank1:
        rank1.add(SnapshotFile.from_bytes(names[1], b"rank1"))
        rank1.finish_share()
    with SnapshotUpload(s3, bucket=bucket, identity="dist", shared_files=names) as final:
        assert final.commit(b'{"weight_map": {}}') == f"s3://{bucket}/dist/"
    assert set(stored(s3, bucket, "dist")) == {*names, INDEX_NAME}
