"""Malformed snapshot bytes, fuzzed: nothing escapes the decoders but a ``SnapshotError``.

Hypothesis with a fixed seed (``derandomize``) and a fixed budget of examples, so CI runs
the same cases every time in a few seconds:

- safetensors headers: any bytes, JSON of any shape in a well-formed length prefix, entries
  with odd dtypes, shapes and offsets, deep nesting, huge numbers; through the in-memory
  and the ``pread`` readers;
- delta indexes: any JSON for ``metadata`` and ``weight_map`` over a valid shard, through
  ``parse_index`` and ``verify_delta``;
- zstd frames: valid frames (content size or not, checksum or not, single segment or not)
  with bits flipped, bytes cut, appended, spliced or overwritten in the header, decoded
  against a base and alone; a frame never yields more than its tensor's size;
- whole delta directories with a byte flipped anywhere, through ``verify_snapshot_dir``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cwtrain.errors import SnapshotError
from cwtrain.hotload.codec.decode import apply_payload, stream_payload, verify_delta
from cwtrain.hotload.files.checkpoint import verify_snapshot_dir
from cwtrain.hotload.files.write import write_delta
from cwtrain.hotload.format.index import parse_index
from cwtrain.hotload.format.safetensors import DTYPE_BITS, TensorEntry, encode_header, header_of_bytes, read_header_at
from cwtrain.hotload.format.tensors import FileRegion, TensorData

pytestmark = [pytest.mark.faults, pytest.mark.fault_row("decode-fuzz")]

#: The fixed budget: the same examples on every run, a few seconds in all.
FIXED = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
SHARD = "model-00000-of-00001.safetensors"
DELTA_METADATA = {
    "version": "2",
    "base_version": "1",
    "delta_encoding": "xor",
    "compression_format": "zstd",
    "checksum_format": "adler32",
}


def _only_snapshot_errors(call: Callable[[], object]) -> None:
    """Run ``call``; success or a SnapshotError are fine, anything else fails the test."""
    try:
        call()
    except SnapshotError:
        pass


# ------------------------------------------------------------------------- headers

JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(list(DTYPE_BITS))
)
JSON = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=16,
)
ENTRY = st.fixed_dictionaries(
    {},
    optional={
        "dtype": st.sampled_from([*DTYPE_BITS, "u8", "", "F128"]) | JSON,
        "shape": st.lists(st.integers(-2, 2**40) | JSON, max_size=4) | JSON,
        "data_offsets": st.lists(st.integers(-5, 2**65), max_size=3) | JSON,
    },
)
HEADERS = st.one_of(
    st.dictionaries(st.text(max_size=8), ENTRY, max_size=5),
    st.dictionaries(st.sampled_from(["__metadata__", "w", "format"]), JSON, max_size=3),
    JSON,
)


def _with_prefix(header: bytes, data: bytes) -> bytes:
    return len(header).to_bytes(8, "little") + header + data


@settings(FIXED, max_examples=60)
@given(header=HEADERS, data=st.binary(max_size=64))
@example(header={"w": {"dtype": "F32", "shape": [10**4000], "data_offsets": [0, 4]}}, data=b"")
@example(header={"w": {"dtype": "U8", "shape": [2**40] * 8, "data_offsets": [0, 1]}}, data=b"\x00")
def test_header_json_of_any_shape(header: Any, data: bytes) -> None:
    try:
        raw = json.dumps(header).encode()
    except ValueError:  # an integer too long for json to write
        return
    blob = _with_prefix(raw, data)
    _only_snapshot_errors(lambda: header_of_bytes(blob, source="fuzz"))


@FIXED
@given(blob=st.binary(max_size=96), nesting=st.integers(0, 3))
@example(blob=b"", nesting=2)
def test_header_bytes_of_any_kind(blob: bytes, nesting: int, tmp_path: Path) -> None:
    if nesting == 1:  # deep JSON nesting (a RecursionError for the parser)
        blob = _with_prefix(b"[" * 100_000 + b"]" * 100_000, b"")
    elif nesting == 2:  # a length that runs past the end, or a huge one
        blob = (len(blob) + 9).to_bytes(8, "little") + blob
    _only_snapshot_errors(lambda: header_of_bytes(blob, source="fuzz"))
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(blob)
    fd = os.open(path, os.O_RDONLY)
    try:
        _only_snapshot_errors(lambda: read_header_at(fd, len(blob), source="fuzz"))
        _only_snapshot_errors(lambda: read_header_at(fd, len(blob) + 100, source="fuzz"))  # the file is shorter
    finally:
        os.close(fd)


# ------------------------------------------------------------------------- frames


def _frame(data: bytes, level: int, content_size: bool, checksum: bool, chunked: bool) -> bytes:
    compressor = zstandard.ZstdCompressor(level=level, write_content_size=content_size, write_checksum=checksum)
    if not chunked:
        return compressor.compress(data)
    stream = compressor.compressobj(size=len(data) if content_size else -1)
    return stream.compress(data) + stream.flush()


@st.composite
def mutated_frames(draw: st.DrawFn) -> tuple[bytes, bytes, bytes]:
    """(old bytes, new bytes, a payload: the frame of old ^ new, perhaps damaged)."""
    size = draw(st.integers(0, 3000))
    old = draw(st.binary(min_size=size, max_size=size))
    kind = draw(st.sampled_from(["zeros", "sparse", "random"]))
    xor = bytearray(size)
    if kind == "sparse" and size:
        for position in draw(st.lists(st.integers(0, size - 1), max_size=8)):
            xor[position] = draw(st.integers(1, 255))
    elif kind == "random":
        xor = bytearray(draw(st.binary(min_size=size, max_size=size)))
    new = bytes(a ^ b for a, b in zip(old, xor, strict=True))
    frame = bytearray(
        _frame(
            bytes(xor), draw(st.sampled_from([1, 3, 19])), draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
        )
    )
    for _ in range(draw(st.integers(0, 3))):
        action = draw(st.sampled_from(["flip", "cut", "append", "splice", "header"]))
        if action == "flip" and frame:
            position = draw(st.integers(0, len(frame) - 1))
            frame[position] ^= 1 << draw(st.integers(0, 7))
        elif action == "cut":
            del frame[draw(st.integers(0, len(frame))) :]
        elif action == "append":
            frame += draw(st.binary(min_size=1, max_size=16))
        elif action == "splice" and frame:
            position = draw(st.integers(0, len(frame) - 1))
            frame[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif action == "header" and len(frame) > 5:
            position = draw(st.integers(4, min(len(frame) - 1, 17)))
            frame[position] = draw(st.integers(0, 255))
    return old, new, bytes(frame)


@FIXED
@given(case=mutated_frames())
@example(case=(b"\x00" * 8, b"\x01" + b"\x00" * 7, b"\x28\xb5\x2f\xfd"))
def test_damaged_frames(case: tuple[bytes, bytes, bytes]) -> None:
    from cwtrain.hotload.format.checksum import adler32

    old, new, payload = case
    expected = adler32(new)
    try:
        out = apply_payload(old, payload, expected, where="fuzz")
    except SnapshotError:
        out = None
    if out is not None:  # a damage zstd and the Adler-32 both missed: the bytes must still be right
        assert out.tobytes() == new
    seen: list[int] = []
    _only_snapshot_errors(
        lambda: stream_payload(payload, None, nbytes=len(old), sink=lambda pos, chunk: seen.append(pos + chunk.size))
    )
    assert max(seen, default=0) <= len(old)  # never past the tensor's size
    _only_snapshot_errors(lambda: stream_payload(payload, None, where="fuzz"))


@FIXED
@given(tail=st.binary(max_size=40), descriptor=st.integers(0, 255), window=st.integers(0, 255))
def test_frame_headers_of_any_kind(tail: bytes, descriptor: int, window: int) -> None:
    payload = b"\x28\xb5\x2f\xfd" + bytes([descriptor, window]) + tail
    _only_snapshot_errors(lambda: stream_payload(payload, None, where="fuzz"))
    _only_snapshot_errors(lambda: apply_payload(bytes(64), payload, 1, where="fuzz"))


# ------------------------------------------------------------------------- indexes


def _delta_shard() -> tuple[dict[str, TensorData], bytes]:
    base = {"w": TensorData("U8", (16,), bytes(16))}
    frame = _frame(bytes(range(16)), 1, True, False, True)
    entry = TensorEntry("w", "U8", (len(frame),), 0, len(frame))
    from cwtrain.hotload.format.checksum import adler32

    shard = encode_header([entry], {"w": f"{adler32(bytes(range(16))):08x}"}) + frame
    return base, shard


BASE, SHARD_BYTES = _delta_shard()
INDEX_VALUES = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"metadata": st.one_of(st.just(DELTA_METADATA), st.dictionaries(st.sampled_from(list(DELTA_METADATA)), JSON))},
        optional={"weight_map": st.one_of(st.just({"w": SHARD}), st.dictionaries(st.text(max_size=4), JSON))},
    ),
)


@FIXED
@given(index=INDEX_VALUES)
@example(index={"metadata": DELTA_METADATA, "weight_map": {"w": SHARD}})
@example(index={"metadata": DELTA_METADATA, "weight_map": {"w": "a\x00.safetensors"}})
def test_delta_indexes_of_any_shape(index: Any) -> None:
    try:
        raw = json.dumps(index).encode()
    except ValueError:
        return

    def verify() -> None:
        parsed = parse_index(raw, source="fuzz")
        verify_delta(BASE, parsed, {SHARD: SHARD_BYTES}, workers=1, source="fuzz")
        shard_region = _as_region(SHARD_BYTES)
        verify_delta(BASE, parsed, {SHARD: shard_region}, workers=1, source="fuzz")

    _only_snapshot_errors(verify)


_REGIONS: list[Any] = []


def _as_region(data: bytes) -> FileRegion:
    """``data`` as a region of an unlinked temporary file (kept open for the session)."""
    handle = tempfile.TemporaryFile()  # noqa: SIM115 - kept open: regions refer to its descriptor
    handle.write(data)
    handle.flush()
    _REGIONS.append(handle)
    return FileRegion(handle.fileno(), 0, len(data))


# --------------------------------------------------------------- whole directories


@pytest.fixture(scope="module")
def delta_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, bytes]:
    """A base checkpoint, and the bytes of a delta's shard and index against it."""
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("fuzz-dirs")
    rng = np.random.default_rng(1)
    weights = {f"t{i}": rng.standard_normal(64 + i, dtype=np.float32) for i in range(4)}
    for side, shift in (("base", 0.0), ("new", 0.5)):
        (root / side).mkdir()
        save_file({n: a + np.float32(shift) * (i % 2) for i, (n, a) in enumerate(weights.items())},
                  str(root / side / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
        (root / side / "config.json").write_text("{}")
    write_delta(root / "base", root / "new", root / "delta", version="2", base_version="1", workers=1)
    shard = next((root / "delta").glob("*.safetensors")).read_bytes()
    index = (root / "delta" / "model.safetensors.index.json").read_bytes()
    return root / "base", shard, index


@FIXED
@given(target=st.sampled_from(["shard", "index"]), position=st.integers(0, 10**6), bit=st.integers(0, 7))
def test_a_flipped_byte_anywhere_in_a_delta(
    target: str,
    position: int,
    bit: int,
    delta_pair: tuple[Path, bytes, bytes],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base, shard, index = delta_pair
    root = tmp_path_factory.mktemp("flip")
    data = bytearray(shard if target == "shard" else index)
    data[position % len(data)] ^= 1 << bit
    (root / SHARD).write_bytes(bytes(data) if target == "shard" else shard)
    (root / "model.safetensors.index.json").write_bytes(bytes(data) if target == "index" else index)
    _only_snapshot_errors(lambda: verify_snapshot_dir(root, base=base, workers=1))
    _only_snapshot_errors(lambda: verify_snapshot_dir(root, workers=1))
