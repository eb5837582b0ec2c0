"""The bounded frame decoder (``cwtrain.hotload.codec.frames``) and the streaming apply of directories."""

from __future__ import annotations

import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import zstandard
from codec_helpers import save_checkpoint

from cwtrain.errors import SnapshotChecksumError, SnapshotError
from cwtrain.hotload.codec.common import MemoryBudget, run_parallel
from cwtrain.hotload.codec.frames import stream_payload, zstd_frame_size
from cwtrain.hotload.files.write import write_applied_snapshot, write_delta, write_full_snapshot
from cwtrain.hotload.format.tensors import FileRegion

MiB = 1 << 20


def _frame(data: bytes, **options: object) -> bytes:
    stream = zstandard.ZstdCompressor(level=1, write_content_size=True, **options).compressobj(size=len(data))  # type: ignore[arg-type]
    return stream.compress(data) + stream.flush()


def test_the_decoders_the_encoder_and_the_upload_share_one_budget_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from cwtrain.hotload.codec.common import MemoryBudget
    from cwtrain.hotload.codec.encode import DeltaEncoder
    from cwtrain.hotload.store.snapshot_upload import SnapshotUpload

    monkeypatch.setenv("CWTRAIN_HOTLOAD_MEMORY_BUDGET", str(3 * MiB))
    with DeltaEncoder() as encoder:
        assert encoder.memory_budget == 3 * MiB
    assert MemoryBudget().limit == 3 * MiB
    assert SnapshotUpload(object(), bucket="b", identity="r-v000001")._budget.limit == 3 * MiB


@pytest.mark.parametrize("size", [0, 1, 1000, 3 * MiB + 7])
def test_streaming_hands_on_every_byte_in_order(size: int) -> None:
    rng = np.random.default_rng(size)
    old = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    xor = bytearray(size)
    for position in rng.integers(0, max(size, 1), 20 if size else 0):
        xor[position] = 0x5A
    new = bytes(a ^ b for a, b in zip(old, xor, strict=True))
    payload = _frame(bytes(xor))
    assert zstd_frame_size(payload) == len(payload)
    pieces: list[tuple[int, bytes]] = []
    value = stream_payload(payload, old, expected=zlib.adler32(new), sink=lambda p, c: pieces.append((p, c.tobytes())))
    assert value == zlib.adler32(new)
    assert b"".join(chunk for _, chunk in pieces) == new
    assert [p for p, _ in pieces] == [sum(len(c) for _, c in pieces[:i]) for i in range(len(pieces))]
    assert all(len(chunk) <= MiB for _, chunk in pieces)


def test_a_file_region_payload_and_base_stream_too(tmp_path: Path) -> None:
    old, xor = bytes(range(256)) * 40, bytes(10_000) + b"\x01" * 240
    path = tmp_path / "blob"
    path.write_bytes(b"pad" + old + _frame(xor))
    with open(path, "rb") as handle:
        fd = handle.fileno()
        base = FileRegion(fd, 3, len(old))
        payload = FileRegion(fd, 3 + len(old), path.stat().st_size - 3 - len(old))
        new = bytes(a ^ b for a, b in zip(old, xor, strict=True))
        assert stream_payload(payload, base, expected=zlib.adler32(new)) == zlib.adler32(new)
        with pytest.raises(SnapshotChecksumError):
            stream_payload(payload, base, expected=1)


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"\x28\xb5\x2f\xfd\xc0\xa0" + (3).to_bytes(8, "little") + b"\x19\x00\x00abc", "window"),  # 2**30 bytes
        (b"\x28\xb5\x2f\xfd\xc0\x38" + (1 << 40).to_bytes(8, "little") + b"\x03\x00\x10\x00", "at most"),
        (_frame(b"abc") + b"\x00", "after the zstd frame"),
        (zstandard.ZstdCompressor(write_content_size=False).compress(b"abc"), "no content size"),
        (b"\x28\xb5\x2f\xfd\x20\x03" + b"\x03\x00", "truncated"),
        (b"PK\x03\x04zzzz", "bad magic"),
    ],
)
def test_frames_are_refused_before_decoding(payload: bytes, problem: str) -> None:
    with pytest.raises(SnapshotError, match=problem):
        stream_payload(payload, None, where="t")


def test_the_budget_lets_one_holder_through_and_blocks_the_rest() -> None:
    budget = MemoryBudget(10)
    budget.acquire(25)  # more than the budget: alone, it goes
    entered = threading.Event()

    def second() -> None:
        budget.acquire(1)
        entered.set()

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.05)
    assert not entered.is_set()
    budget.release(25)
    thread.join(5)
    assert entered.is_set()


def test_run_parallel_keeps_order_and_raises_the_earliest_failure() -> None:
    assert run_parallel(lambda x: x * 2, list(range(50)), 4) == [x * 2 for x in range(50)]
    started: list[int] = []

    def job(x: int) -> int:
        started.append(x)
        if x in (3, 7):
            time.sleep(0.01 if x == 3 else 0)
            raise SnapshotError(f"job {x}")
        return x

    with pytest.raises(SnapshotError, match="job 3"):
        run_parallel(job, list(range(1000)), 2)
    assert len(started) < 1000  # no new job after the first failure


def _weights(shift: float) -> dict[str, np.ndarray]:
    return {
        "a": np.arange(300_000, dtype=np.float32) + shift,
        "b": np.ones((4, 4), np.float16),
        "c": np.zeros(0, np.float32),
        "d": np.full(1000, shift, np.float64),
    }


@pytest.mark.parametrize("shards", [1, 2])
def test_applied_snapshot_equals_the_full_snapshot_of_the_new_weights(shards: int, tmp_path: Path) -> None:
    old = save_checkpoint(tmp_path / "v1", _weights(0), shards=shards)
    new = save_checkpoint(tmp_path / "v2", _weights(1), shards=shards)
    write_delta(old, new, tmp_path / "d", version="7", base_version="000006")
    applied = write_applied_snapshot(old, tmp_path / "d", tmp_path / "out", base_version="6", memory_budget=MiB)
    assert applied.version == "7" and applied.base_version == "000006"
    assert sorted(applied.changed) == ["a", "d"] and applied.bytes_changed == 1_200_000 + 8000
    reference = write_full_snapshot(new, tmp_path / "ref")
    names = sorted(p.name for p in reference.iterdir())
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == names
    for name in names:
        assert (tmp_path / "out" / name).read_bytes() == (reference / name).read_bytes(), name


def test_applied_snapshot_refuses_and_leaves_nothing(tmp_path: Path) -> None:
    old = save_checkpoint(tmp_path / "v1", _weights(0))
    new = save_checkpoint(tmp_path / "v2", _weights(1))
    write_delta(old, new, tmp_path / "d", version="2", base_version="1")
    with pytest.raises(SnapshotError, match="base_version"):
        write_applied_snapshot(old, tmp_path / "d", tmp_path / "out", base_version="2")
    with pytest.raises(SnapshotChecksumError, match="Adler-32 of the result"):  # the wrong base
        write_applied_snapshot(new, tmp_path / "d", tmp_path / "out")
    full = write_full_snapshot(old, tmp_path / "full")  # a base that carries checksums
    v3 = save_checkpoint(tmp_path / "v3", {**_weights(0), "a": _weights(2)["a"]})
    assert write_delta(full, v3, tmp_path / "d3", version="3", base_version="1").tensors_changed == 1
    shard = full / "model.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # the last byte of the data: a tensor the delta leaves unchanged
    shard.write_bytes(bytes(data))
    with pytest.raises(SnapshotChecksumError, match="base checkpoint is corrupt"):
        write_applied_snapshot(full, tmp_path / "d3", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
