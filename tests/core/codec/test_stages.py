"""Stage timing (StageStats) in the encoder and the store, FULL shards built one by one, and what overlaps."""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

import numpy as np
import pytest

import cwtrain.hotload.codec.encode as codec_module
from cwtrain.errors import SnapshotError
from cwtrain.hotload.codec.encode import DeltaEncoder
from cwtrain.hotload.codec.stages import StageStats
from cwtrain.hotload.format.index import INDEX_NAME
from cwtrain.hotload.format.tensors import TensorData
from cwtrain.hotload.store.prefix import SnapshotStore

MIB = 1 << 20


def _checkpoint(sizes: list[int], *, seed: int = 0) -> tuple[dict[str, TensorData], dict[str, TensorData]]:
    """(old, new): every tensor has a few changed bytes; one tensor is unchanged."""
    rng = np.random.default_rng(seed)
    old: dict[str, TensorData] = {}
    new: dict[str, TensorData] = {}
    for i, size in enumerate(sizes):
        base = rng.integers(0, 256, size, dtype=np.uint8)
        moved = base.copy()
        if i != 1:
            moved[rng.integers(0, size, max(1, size // 100))] ^= 0x01
        old[f"t{i:02d}"], new[f"t{i:02d}"] = TensorData("U8", (size,), base), TensorData("U8", (size,), moved)
    return old, new


def _files(snap: Any) -> list[tuple[str, str]]:
    return [(f.name, f.sha256()) for f in snap.all_files]


# ---------------------------------------------------------------------------- StageStats


def test_figures_sum_time_and_union_busy_intervals() -> None:
    stats = StageStats()
    stats.record("link", 10, (1.0, 0.0), (3.0, 0.5))
    stats.record("link", 20, (2.0, 0.0), (4.0, 0.25))  # overlaps the first: busy 1..4
    stats.record("link", 5, (6.0, 0.0), (7.0, 0.0))
    f = stats.figures()["link"]
    assert (f.calls, f.nbytes) == (3, 35)
    assert f.seconds == pytest.approx(5.0) and f.busy_seconds == pytest.approx(4.0)
    assert f.cpu_seconds == pytest.approx(0.75) and (f.first, f.last) == (1.0, 7.0)
    assert stats.as_dict()["link"]["busy_seconds"] == pytest.approx(4.0)
    assert stats.intervals("link") == [(1.0, 3.0), (2.0, 4.0), (6.0, 7.0)]
    assert stats.busy_between("link", 2.5, 6.5) == pytest.approx(2.0)  # 2.5..4 and 6..6.5
    assert stats.busy_between("link", 0.0, 10.0) == pytest.approx(4.0)
    assert stats.busy_between("none", 0.0, 10.0) == 0.0


def test_measure_records_also_on_error_and_lap_chains() -> None:
    stats = StageStats()
    with pytest.raises(ValueError), stats.measure("boom", 7):
        raise ValueError("x")
    mark = stats.clock()
    mark = stats.lap("a", 1, mark)
    stats.lap("b", 2, mark)
    figures = stats.figures()
    assert list(figures) == ["boom", "a", "b"] and figures["boom"].nbytes == 7
    assert figures["a"].last <= figures["b"].first


def test_threads_record_concurrently() -> None:
    stats = StageStats()

    def work() -> None:
        for _ in range(500):
            with stats.measure("s", 1):
                pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stats.figures()["s"].calls == 2000 and stats.figures()["s"].nbytes == 2000


# ---------------------------------------------------------------------------- the encoder


@pytest.mark.parametrize("workers", [1, 3])
def test_encode_with_stats_gives_the_same_bytes_and_counts_every_byte(workers: int) -> None:
    old, new = _checkpoint([3 * MIB + 5, 2 * MIB, 100, 5 * MIB])
    total = sum(t.nbytes for t in new.values())
    stats = StageStats()
    with DeltaEncoder(workers=workers) as enc:
        plain = enc.encode(new, old, version="v2", base_version="v1")
        timed = enc.encode(new, old, version="v2", base_version="v1", stats=stats)
    assert _files(timed) == _files(plain)
    figures = stats.figures()
    assert {"read", "adler", "xor", "zstd"} <= set(figures)
    for stage in ("read", "adler", "xor"):
        assert figures[stage].nbytes == total
    # zstd sees every byte of each changed tensor (zero prefixes included), none of the unchanged one
    assert figures["zstd"].nbytes == total - new["t01"].nbytes
    assert all(f.cpu_seconds >= 0 and f.seconds >= 0 for f in figures.values())


def test_zero_prefix_is_counted_once_when_the_first_change_is_late() -> None:
    size = 3 * MIB + 17
    old = {"w": TensorData("U8", (size,), np.zeros(size, np.uint8))}
    moved = np.zeros(size, np.uint8)
    moved[-1] = 1  # the compressor starts in the last chunk and is fed the zero chunks first
    new = {"w": TensorData("U8", (size,), moved)}
    stats = StageStats()
    with DeltaEncoder(workers=1) as enc:
        timed = enc.encode(new, old, stats=stats)
        assert _files(timed) == _files(enc.encode(new, old))
    assert stats.figures()["zstd"].nbytes == size


# ---------------------------------------------------------------------------- FULL, shard by shard


def test_plan_full_builds_the_bytes_of_encode_full(monkeypatch: pytest.MonkeyPatch) -> None:
    real_layout = codec_module._default_layout
    monkeypatch.setattr(codec_module, "_default_layout", lambda tensors, _: real_layout(tensors, 2 * MIB))
    _, new = _checkpoint([MIB, MIB + 3, 2 * MIB, 7, MIB])
    with DeltaEncoder(workers=2) as enc:
        whole = enc.encode_full(new)
        stats = StageStats()
        plan = enc.plan_full(new, stats=stats)
        assert plan.checksums == {}  # nothing read yet
        built = [plan.build(shard) for shard in plan.shards]
    assert len(built) >= 3
    assert sorted((f.name, f.sha256()) for f in built) == [(f.name, f.sha256()) for f in whole.files]
    assert plan.index.sha256() == whole.index.sha256()
    assert plan.checksums == whole.checksums
    assert stats.figures()["adler"].nbytes == sum(t.nbytes for t in new.values())


def test_plan_full_checks_the_layout_before_reading_anything() -> None:
    _, new = _checkpoint([16, 16])
    with DeltaEncoder(workers=1) as enc, pytest.raises(SnapshotError, match="no shard in the layout"):
        enc.plan_full(new, layout={"t00": "a.safetensors"})


# ---------------------------------------------------------------------------- the store


def _stored(client: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return {
        item["Key"].rsplit("/", 1)[1]: client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        for item in listed.get("Contents", [])
    }


def test_store_delta_with_stats_stores_the_same_objects_and_times_every_stage(s3_bucket: tuple[Any, str]) -> None:
    client, bucket = s3_bucket
    old, new = _checkpoint([2 * MIB, MIB, 3 * MIB + 1])
    store = SnapshotStore(client, bucket, "p")
    store.upload_tensors(new, "plain-v2", previous_identity="plain-v1", base=old)
    stats = StageStats()
    store.upload_tensors(new, "timed-v2", previous_identity="timed-v1", base=old, stats=stats)
    plain = _stored(client, bucket, "p/plain-v2")
    timed = _stored(client, bucket, "p/timed-v2")
    shards = sorted(k for k in plain if k != INDEX_NAME)
    assert shards and sorted(timed) == sorted(plain)
    assert all(plain[k] == timed[k] for k in shards)  # the index differs only by its identities
    figures = stats.figures()
    assert {"gather", "read", "xor", "adler", "zstd", "sha256"} <= set(figures)
    assert figures["sha256"].nbytes == sum(len(v) for v in timed.values())
    assert figures["sha256"].calls == len(timed)  # each object hashed once, however often its digest is asked


def test_store_empty_delta_writes_nothing(s3_bucket: tuple[Any, str]) -> None:
    client, bucket = s3_bucket
    old, _ = _checkpoint([MIB])
    store = SnapshotStore(client, bucket, "p")
    with pytest.raises(SnapshotError, match="no tensor changed"):
        store.upload_tensors(old, "same-v2", previous_identity="same-v1", base=old, extra_files={"config.json": b"{}"})
    assert _stored(client, bucket, "p/same-v2") == {}


def test_store_full_uploads_shard_k_while_shard_k_plus_1_is_built(
    s3_bucket: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building shard k+1 waits until shard k's upload has begun: a store that builds every
    shard before uploading any would time out here."""
    from cwtrain.hotload.store.object_source import ObjectSource

    client, bucket = s3_bucket
    real_layout = codec_module._default_layout
    monkeypatch.setattr(codec_module, "_default_layout", lambda tensors, _: real_layout(tensors, MIB))
    _, new = _checkpoint([MIB, MIB, MIB, MIB])
    started: dict[str, threading.Event] = {}
    hashed = ObjectSource.sha256

    def spy_sha256(self: ObjectSource) -> str:
        started.setdefault(self.name, threading.Event()).set()
        return hashed(self)

    real_build = codec_module.FullSnapshotPlan.build
    waited: list[bool] = []

    def build(self: Any, shard: str) -> Any:
        position = self.shards.index(shard)
        if position:
            previous = self.shards[position - 1]
            waited.append(started.setdefault(previous, threading.Event()).wait(timeout=20))
        return real_build(self, shard)

    monkeypatch.setattr(ObjectSource, "sha256", spy_sha256)
    monkeypatch.setattr(codec_module.FullSnapshotPlan, "build", build)
    store = SnapshotStore(client, bucket, "p")
    store.upload_tensors(new, "full-v1", extra_files={"config.json": b"{}"})  # a FULL needs its config.json
    assert waited == [True] * 3
    stored = _stored(client, bucket, "p/full-v1")
    assert stored.pop("config.json") == b"{}"
    with DeltaEncoder(workers=2) as enc:
        expected = enc.encode_full(new)
    assert {f.name: hashlib.sha256(f.tobytes()).hexdigest() for f in expected.all_files} == {
        k: hashlib.sha256(v).hexdigest() for k, v in stored.items()
    }


def test_store_lists_the_prefix_while_encoding(s3_bucket: tuple[Any, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The upload's opening listings run beside the encode, not after it."""
    client, bucket = s3_bucket
    old, new = _checkpoint([MIB, MIB])
    listed_during_encode: list[bool] = []
    encoding = threading.Event()
    real_encode = DeltaEncoder.encode
    real_list = client.list_objects_v2

    def encode(self: DeltaEncoder, *args: Any, **kwargs: Any) -> Any:
        encoding.set()
        deadline = time.monotonic() + 20
        while not listed_during_encode and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            return real_encode(self, *args, **kwargs)
        finally:
            encoding.clear()

    def list_objects_v2(**kwargs: Any) -> Any:
        listed_during_encode.append(encoding.wait(timeout=20))
        return real_list(**kwargs)

    monkeypatch.setattr(DeltaEncoder, "encode", encode)
    monkeypatch.setattr(client, "list_objects_v2", list_objects_v2)
    SnapshotStore(client, bucket, "p").upload_tensors(new, "v2", previous_identity="v1", base=old)
    assert listed_during_encode and listed_during_encode[0] is True
