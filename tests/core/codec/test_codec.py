"""The numpy codec: delta encode/apply, FULL with checksums, chains, and every refusal."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping

import numpy as np
import pytest
import zstandard
from codec_helpers import checkpoints
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cwtrain.errors import SnapshotChecksumError, SnapshotError, SnapshotNotFoundError
from cwtrain.hotload.codec.decode import apply_delta, load_full, replay_chain, verify_delta, zstd_frame_size
from cwtrain.hotload.codec.encode import BIG_TENSOR_BYTES, DeltaEncoder
from cwtrain.hotload.format.index import parse_index
from cwtrain.hotload.format.safetensors import header_of_bytes
from cwtrain.hotload.format.tensors import TensorData

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _raw(tensors: Mapping[str, TensorData]) -> dict[str, bytes]:
    return {n: bytes(memoryview(t.data).cast("B")) for n, t in tensors.items()}


def _shards(snap: object) -> dict[str, bytes]:
    return {f.name: f.tobytes() for f in snap.files}  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def encoder() -> DeltaEncoder:
    with DeltaEncoder(workers=2) as enc:
        yield enc  # type: ignore[misc]


# -------------------------------------------------------------------------- round trips


@FAST
@given(pair=checkpoints())
def test_delta_round_trip_any_dtype_and_shape(encoder: DeltaEncoder, pair: tuple[dict, dict]) -> None:
    old, new = pair
    snap = encoder.encode(new, old, version="v2", base_version="v1")
    changed = sorted(n for n in new if _raw(new)[n] != _raw(old)[n])
    assert snap.changed == changed and snap.empty == (not changed)
    assert snap.checksums == {n: f"{zlib.adler32(b):08x}" for n, b in _raw(new).items()}
    index = parse_index(snap.index.tobytes(), source="index")
    assert list(index["weight_map"]) == changed
    result = apply_delta(old, index, _shards(snap), base_version="v1")
    assert _raw(result) == _raw(new)
    assert all(result[n].dtype == new[n].dtype and tuple(result[n].shape) == new[n].shape for n in new)
    for file in snap.files:  # every payload decodes with plain zstandard to the XOR
        data = file.tobytes()
        header = header_of_bytes(data, source=file.name)
        for name, entry in header.tensors.items():
            frame = data[header.data_start + entry.begin : header.data_start + entry.end]
            xor = zstandard.ZstdDecompressor().decompress(frame)
            assert bytes(a ^ b for a, b in zip(_raw(old)[name], _raw(new)[name])) == xor
            assert zstandard.get_frame_parameters(frame).content_size == len(xor)
            assert not zstandard.get_frame_parameters(frame).has_checksum


@FAST
@given(pair=checkpoints())
def test_full_round_trip(encoder: DeltaEncoder, pair: tuple[dict, dict]) -> None:
    _, tensors = pair
    snap = encoder.encode_full(tensors)
    index = json.loads(snap.index.tobytes())
    assert index["metadata"]["checksum_format"] == "adler32"
    loaded = load_full(index, _shards(snap))
    assert _raw(loaded) == _raw(tensors)
    assert {n: (t.dtype, tuple(t.shape)) for n, t in loaded.items()} == {
        n: (t.dtype, tuple(t.shape)) for n, t in tensors.items()
    }


@FAST
@given(data=st.data())
def test_chain_replay(encoder: DeltaEncoder, data: st.DataObject) -> None:
    v0, v1 = data.draw(checkpoints())
    v2 = {
        n: TensorData(t.dtype, t.shape, data.draw(st.binary(min_size=t.nbytes, max_size=t.nbytes)))
        for n, t in v1.items()
    }
    full = encoder.encode_full(v0)
    root = load_full(json.loads(full.index.tobytes()), _shards(full))
    d1 = encoder.encode(v1, v0, version="1", base_version="0")
    d2 = encoder.encode(v2, v1, version="2", base_version="1")
    deltas = [(json.loads(d.index.tobytes()), _shards(d)) for d in (d1, d2)]
    assert _raw(replay_chain(root, deltas, root_version="0")) == _raw(v2)
    with pytest.raises(SnapshotError, match="base_version"):
        replay_chain(root, deltas[1:], root_version="0")


def test_chain_longer_than_63_is_refused() -> None:
    with pytest.raises(SnapshotError, match="63"):
        replay_chain({}, [({}, {})] * 64)


def test_output_independent_of_workers_budget() -> None:
    rng = np.random.default_rng(3)
    old = {
        f"t{i:02d}": TensorData("F32", (256, 64), rng.standard_normal((256, 64)).astype(np.float32)) for i in range(12)
    }
    new = {}
    for name, t in old.items():
        arr = np.array(t.data)
        arr.reshape(-1)[rng.integers(0, arr.size, 50)] += 1
        new[name] = TensorData("F32", t.shape, arr)
    outputs = []
    for workers, budget, shard_bytes in [(1, 1 << 20, 2 << 30), (3, 1 << 30, 2 << 30), (2, 1 << 20, 1000)]:
        with DeltaEncoder(workers=workers, memory_budget=budget, shard_bytes=shard_bytes) as enc:
            outputs.append(enc.encode(new, old))
    assert [f.sha256() for f in outputs[0].files] == [f.sha256() for f in outputs[1].files]
    assert len(outputs[0].files) == 1 and len(outputs[2].files) > 2
    for file in outputs[2].files:  # shards close before passing the limit, >= 1 tensor each
        header = header_of_bytes(file.tobytes(), source=file.name)
        assert header.data_size <= 1000 or len(header.tensors) == 1
    index = json.loads(outputs[2].index.tobytes())
    assert _raw(apply_delta(old, index, _shards(outputs[2]))) == _raw(new)


def test_empty_delta_has_no_shards(encoder: DeltaEncoder) -> None:
    old = {"a": TensorData("U8", (3,), b"abc")}
    snap = encoder.encode(dict(old), old, version="2", base_version="1")
    assert snap.empty and snap.files == [] and json.loads(snap.index.tobytes())["weight_map"] == {}


def test_big_tensor_is_one_frame_that_plain_zstandard_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    import cwtrain.hotload.codec.encode as codec_module

    assert BIG_TENSOR_BYTES == 256 << 20  # part of the output definition
    monkeypatch.setattr(codec_module, "BIG_TENSOR_BYTES", 4 << 20)  # the same path, on a cheap tensor
    n = (4 << 20) * 3 + 4099
    old = np.zeros(n, np.uint8)
    new = old.copy()
    new[[n // 2, n - 1]] = [2, 3]  # the first chunks are all zeros: they are fed late, as zeros
    frames = []
    for workers in (1, 2):
        with DeltaEncoder(workers=workers) as enc:
            snap = enc.encode({"e": TensorData("U8", (n,), new)}, {"e": TensorData("U8", (n,), old)})
        data = snap.files[0].tobytes()
        header = header_of_bytes(data, source="shard")
        frames.append(data[header.data_start :])
    assert frames[0] == frames[1]
    assert zstd_frame_size(frames[0]) == len(frames[0])
    xor = zstandard.ZstdDecompressor().decompress(frames[0])
    assert len(xor) == n and np.array_equal(np.frombuffer(xor, np.uint8), new)


def test_late_start_gives_the_bytes_of_the_whole_buffer() -> None:
    """Leading zero chunks are fed late, as zeros: the frame equals ``compress_xor`` of the whole XOR."""
    n = (1 << 20) * 3 + 5  # several chunks, not a multiple of eight
    old = np.random.default_rng(3).integers(0, 255, n, dtype=np.uint8)
    new = old.copy()
    new[[(1 << 20) * 2 + 7, n - 1]] ^= 0x40  # the first two chunks XOR to zeros
    with DeltaEncoder(workers=2) as enc:
        snap = enc.encode({"w": TensorData("U8", (n,), new)}, {"w": TensorData("U8", (n,), old)})
        whole = b"".join(bytes(p) for p in enc.compress_xor(np.bitwise_xor(new, old)))
    data = snap.files[0].tobytes()
    frame = data[header_of_bytes(data, source="shard").data_start :]
    assert frame == whole
    assert zstandard.ZstdDecompressor().decompress(frame) == np.bitwise_xor(new, old).tobytes()


# ------------------------------------------------------------------ independent delta


def _hand_made_delta(old: Mapping[str, bytes], new: Mapping[str, bytes]) -> tuple[dict, bytes]:
    """A delta written straight from the spec: numpy XOR, one-shot zstd, header by hand (unpadded)."""
    changed = sorted(n for n in new if new[n] != old[n])
    header: dict[str, object] = {"__metadata__": {n: f"{zlib.adler32(new[n]):08x}" for n in changed}}
    payload = b""
    for name in changed:
        xor = np.bitwise_xor(np.frombuffer(new[name], np.uint8), np.frombuffer(old[name], np.uint8)).tobytes()
        frame = zstandard.ZstdCompressor(level=5, write_content_size=True, write_checksum=True).compress(xor)
        header[name] = {"dtype": "U8", "shape": [len(frame)], "data_offsets": [len(payload), len(payload) + len(frame)]}
        payload += frame
    raw = json.dumps(header).encode()
    shard = struct.pack("<Q", len(raw)) + raw + payload
    index = {
        "metadata": {
            "version": "000002",
            "base_version": "000001",
            "delta_encoding": "XOR",
            "checksum_format": "Adler-32",
        },
        "weight_map": dict.fromkeys(changed, "model-00000-of-00001.safetensors"),
    }
    return index, shard


def test_independent_delta_applies() -> None:
    rng = np.random.default_rng(0)
    old = {f"w{i}": rng.integers(0, 255, 1000 + i, dtype=np.uint8).tobytes() for i in range(4)}
    new = dict(old)
    new["w1"] = bytes(b ^ 0x10 if i % 7 == 0 else b for i, b in enumerate(old["w1"]))
    new["w3"] = rng.integers(0, 255, len(old["w3"]), dtype=np.uint8).tobytes()
    index, shard = _hand_made_delta(old, new)
    base = {n: TensorData("U8", (len(b),), b) for n, b in old.items()}
    result = apply_delta(base, index, {"model-00000-of-00001.safetensors": shard}, base_version="000001")
    assert _raw(result) == new


# ---------------------------------------------------------------------- bad inputs


@pytest.fixture
def delta() -> tuple[dict[str, TensorData], dict, dict[str, bytes]]:
    old = {
        "a.w": TensorData("F32", (4,), np.arange(4, dtype=np.float32)),
        "b.w": TensorData("F32", (2,), np.ones(2, np.float32)),
    }
    new = {
        "a.w": TensorData("F32", (4,), np.arange(4, dtype=np.float32) + 1),
        "b.w": TensorData("F32", (2,), np.full(2, 3, np.float32)),
    }
    with DeltaEncoder(workers=1) as enc:
        snap = enc.encode(new, old, version="v2", base_version="v1")
    return old, json.loads(snap.index.tobytes()), _shards(snap)


def _rewrite(shard: bytes, *, metadata: dict | None = None, payload: dict[str, bytes] | None = None) -> bytes:
    header = header_of_bytes(shard, source="s")
    raw = {"__metadata__": dict(header.metadata or {}) | (metadata or {})}
    body = b""
    for name, entry in header.tensors.items():
        data = (payload or {}).get(name, shard[header.data_start + entry.begin : header.data_start + entry.end])
        raw[name] = {"dtype": "U8", "shape": [len(data)], "data_offsets": [len(body), len(body) + len(data)]}
        body += data
    text = json.dumps(raw).encode()
    return struct.pack("<Q", len(text)) + text + body


def _frame(shard: bytes, name: str) -> bytes:
    header = header_of_bytes(shard, source="s")
    entry = header.tensors[name]
    return shard[header.data_start + entry.begin : header.data_start + entry.end]


def _check_refused(old, index, shards, error, *match: str) -> None:  # type: ignore[no-untyped-def]
    before = _raw(old)
    with pytest.raises(error) as info:
        apply_delta(old, index, shards, base_version="v1", source="deltas/v2")
    for text in match:
        assert text in str(info.value)
    assert _raw(old) == before


def test_checksum_mismatch(delta) -> None:  # type: ignore[no-untyped-def]
    old, index, shards = delta
    [(name, shard)] = shards.items()
    bad = {name: _rewrite(shard, metadata={"b.w": "00000001"})}
    _check_refused(old, index, bad, SnapshotChecksumError, "b.w", name, "deltas/v2")
    assert verify_delta(old, index, shards, base_version="v1") == ["a.w", "b.w"]
    with pytest.raises(SnapshotChecksumError, match=r"b\.w"):
        verify_delta(old, index, bad)


def test_truncated_frame(delta) -> None:  # type: ignore[no-untyped-def]
    old, index, shards = delta
    [(name, shard)] = shards.items()
    bad = {name: _rewrite(shard, payload={"a.w": _frame(shard, "a.w")[:-2]})}
    _check_refused(old, index, bad, SnapshotError, "a.w", name, "truncated")


def test_trailing_bytes_after_frame(delta) -> None:  # type: ignore[no-untyped-def]
    old, index, shards = delta
    [(name, shard)] = shards.items()
    bad = {name: _rewrite(shard, payload={"a.w": _frame(shard, "a.w") + b"\0"})}
    _check_refused(old, index, bad, SnapshotError, "a.w", "after the zstd frame")


def test_frame_without_content_size(delta) -> None:  # type: ignore[no-untyped-def]
    old, index, shards = delta
    [(name, shard)] = shards.items()
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(b"\1" * 16)
    bad = {name: _rewrite(shard, payload={"a.w": frame})}
    _check_refused(old, index, bad, SnapshotError, "a.w", "content size is absent")


def test_frame_of_wrong_size(delta) -> None:  # type: ignore[no-untyped-def]
    old, index, shards = delta
    [(name, shard)] = shards.items()
    frame = zstandard.ZstdCompressor().compress(b"\1" * 12)
    bad = {name: _rewrite(shard, payload={"a.w": frame})}
    _check_refused(old, index, bad, SnapshotError, "a.w", "has 16 bytes")


def test_garbage_payload(delta) -> None:  # type: ignore[no-untyped-def]
    old, index, shards = delta
    [(name, shard)] = shards.items()
    bad = {name: _rewrite(shard, payload={"b.w": b"garbage!"})}
    _check_refused(old, index, bad, SnapshotError, "b.w", "not a zstd frame")


def test_wrong_base_version(delta) -> None:  # type: ignore[no-untyped-def]
    old, index, shards = delta
    index["metadata"]["base_version"] = "v0"
    _check_refused(old, index, shards, SnapshotError, "v0", "v1")


def test_missing_shard(delta) -> None:  # type: ignore[no-untyped-def]
    old, index, _ = delta
    _check_refused(old, index, {}, SnapshotNotFoundError, "model-00000-of-00001.safetensors", "missing")


def test_garbage_header(delta) -> None:  # type: ignore[no-untyped-def]
    old, index, shards = delta
    [name] = shards
    _check_refused(old, index, {name: b"\x05\0\0\0\0\0\0\0{oops"}, SnapshotError, name, "invalid safetensors header")


def test_unsupported_encoding(delta) -> None:  # type: ignore[no-untyped-def]
    old, index, shards = delta
    index["metadata"]["delta_encoding"] = "overwrite"
    _check_refused(old, index, shards, SnapshotError, "overwrite")


def test_base_lacks_tensor(delta) -> None:  # type: ignore[no-untyped-def]
    old, index, shards = delta
    del old["b.w"]
    _check_refused(old, index, shards, SnapshotError, "b.w", "no such tensor")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda t: TensorData("F16", (8,), t.data), "a.w"),
        (lambda t: TensorData("F32", (2, 2), t.data), "a.w"),
    ],
)
def test_encode_refuses_dtype_or_shape_change(change, match: str) -> None:  # type: ignore[no-untyped-def]
    old = {"a.w": TensorData("F32", (4,), np.zeros(4, np.float32))}
    with DeltaEncoder(workers=1) as enc, pytest.raises(SnapshotError, match="FULL") as info:
        enc.encode({"a.w": change(old["a.w"])}, old)
    assert match in str(info.value)


def test_encode_refuses_different_tensor_sets() -> None:
    old = {"a": TensorData("U8", (1,), b"a"), "b": TensorData("U8", (1,), b"b")}
    with DeltaEncoder(workers=1) as enc, pytest.raises(SnapshotError, match="tensor sets differ") as info:
        enc.encode({"a": old["a"], "c": old["b"]}, old)
    assert "'c'" not in str(info.value) and "c" in str(info.value) and "b" in str(info.value)


def test_encode_refuses_data_of_wrong_size() -> None:
    old = {"a": TensorData("F32", (2,), b"12345678")}
    with DeltaEncoder(workers=1) as enc, pytest.raises(SnapshotError, match="needs 8 bytes, data has 7"):
        enc.encode({"a": TensorData("F32", (2,), b"1234567")}, old)


def test_load_full_checksum_mismatch(encoder: DeltaEncoder) -> None:
    snap = encoder.encode_full({"x": TensorData("U8", (3,), b"abc")})
    [file] = snap.files
    index = json.loads(snap.index.tobytes())
    data = bytearray(file.tobytes())
    data[-1] ^= 1
    with pytest.raises(SnapshotChecksumError, match="'x'"):
        load_full(index, {file.name: bytes(data)})
    assert load_full(index, {file.name: bytes(data)}, verify=False)["x"].nbytes == 3


def test_load_full_refuses_delta_and_missing_checksums(encoder: DeltaEncoder) -> None:
    with pytest.raises(SnapshotError, match="is a delta"):
        load_full({"metadata": {"delta_encoding": "xor"}, "weight_map": {"a": "m.safetensors"}}, {})
    snap = encoder.encode_full({"x": TensorData("U8", (3,), b"abc")}, shard_metadata={"format": "pt"})
    [file] = snap.files
    header = header_of_bytes(file.tobytes(), source="s")
    text = json.dumps({"x": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]}}).encode()
    bare = struct.pack("<Q", len(text)) + text + b"abc"
    assert header.metadata == {"format": "pt", "x": f"{zlib.adler32(b'abc'):08x}"}
    with pytest.raises(SnapshotError, match="no Adler-32"):
        load_full(json.loads(snap.index.tobytes()), {file.name: bare})


def test_in_flight_work_stays_within_the_budget() -> None:
    import threading
    import time as _time

    class Probe(DeltaEncoder):
        def __init__(self, **kw: int) -> None:
            super().__init__(**kw)
            self.lock = threading.Lock()
            self.running = 0
            self.peak = 0

        def _encode_one(self, name, new, old, stats):  # type: ignore[no-untyped-def]
            with self.lock:
                self.running += new.nbytes
                self.peak = max(self.peak, self.running)
            _time.sleep(0.01)
            try:
                return super()._encode_one(name, new, old, stats)
            finally:
                with self.lock:
                    self.running -= new.nbytes

    size = 1 << 20
    old = {f"t{i:02d}": TensorData("U8", (size,), np.zeros(size, np.uint8)) for i in range(12)}
    new = {n: TensorData("U8", (size,), np.ones(size, np.uint8)) for n in old}
    with Probe(workers=4, memory_budget=2 * size) as probe:
        snap = probe.encode(new, old)
    assert len(snap.changed) == 12 and 0 < probe.peak <= 2 * size
    with Probe(workers=4, memory_budget=8 * size) as probe:
        probe.encode(new, old)
    assert probe.peak > 2 * size  # the limit, not the pool, was what held it back


def test_mid_sized_tensors_use_shared_buffers_and_round_trip() -> None:
    n = (9 << 20) + 6  # above the per-thread buffer size, odd length (no 8-byte XOR)
    rng = np.random.default_rng(5)
    old = {f"m{i}": TensorData("U8", (n,), rng.integers(0, 255, n, dtype=np.uint8)) for i in range(3)}
    new = {}
    for name, t in old.items():
        arr = np.array(t.data)
        arr[rng.integers(0, n, 100)] ^= 0x5A
        new[name] = TensorData("U8", (n,), arr)
    with DeltaEncoder(workers=2) as enc:
        first = enc.encode(new, old)
        second = enc.encode(new, old)  # buffers come back from the pool
    assert [f.sha256() for f in first.files] == [f.sha256() for f in second.files]
    assert _raw(apply_delta(old, json.loads(first.index.tobytes()), _shards(first))) == _raw(new)
