"""The snapshot wire format: headers, index JSON, identities, shard names (spec snapshot-format.md)."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from cwtrain.errors import SnapshotError, SnapshotNotFoundError
from cwtrain.hotload.format import index as fmt
from cwtrain.hotload.format.checksum import adler32, adler32_hex
from cwtrain.hotload.format.identity import (
    identity_for_base_version,
    snapshot_prefix,
    validate_identity,
    version_identity,
)
from cwtrain.hotload.format.index import (
    SnapshotFile,
    check_delta_metadata,
    full_shard_name,
    generated_index_bytes,
    parse_index,
    serialize_index,
    shard_name,
    upload_index_bytes,
)
from cwtrain.hotload.format.safetensors import TensorEntry, dtype_nbytes, encode_header, header_of_bytes, read_header


def _file(header: dict[str, object], data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


# ----------------------------------------------------------------- safetensors headers


def test_encode_header_is_compact_ascii_metadata_first_and_padded() -> None:
    entries = [TensorEntry("b.é", "F32", (2,), 0, 8), TensorEntry("a", "BF16", (), 8, 10)]
    blob = encode_header(entries, {"format": "pt", "b.é": "00000001"})
    length = int.from_bytes(blob[:8], "little")
    assert length == len(blob) - 8 and length % 8 == 0
    text = blob[8:].decode("ascii")
    assert text.startswith('{"__metadata__":{"format":"pt","b.\\u00e9":"00000001"},"b.\\u00e9":{"dtype":"F32"')
    assert ": " not in text and ", " not in text
    assert text.rstrip(" ").endswith('"a":{"dtype":"BF16","shape":[],"data_offsets":[8,10]}}')
    assert set(text[len(text.rstrip(" ")) :]) <= {" "}


def test_encoded_header_is_read_by_safetensors(tmp_path: Path) -> None:
    data = np.arange(6, dtype=np.float32)
    header = encode_header([TensorEntry("x", "F32", (2, 3), 0, 24)], {"format": "np"})
    (tmp_path / "m.safetensors").write_bytes(header + data.tobytes())
    loaded = load_file(str(tmp_path / "m.safetensors"))
    assert np.array_equal(loaded["x"], data.reshape(2, 3))


def test_read_header_of_safetensors_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"b": np.zeros((3, 2), np.float16), "a": np.ones(4, np.int64)}, str(path), metadata={"k": "v"})
    header = read_header(path)
    assert header.metadata == {"k": "v"}
    assert {n: (t.dtype, t.shape, t.nbytes) for n, t in header.tensors.items()} == {
        "a": ("I64", (4,), 32),
        "b": ("F16", (3, 2), 12),
    }
    assert header.file_size == path.stat().st_size


@pytest.mark.parametrize(
    ("blob", "problem"),
    [
        (b"\x01\x02", "shorter than 8 bytes"),
        (struct.pack("<Q", 200_000_000) + b"{}", "exceeds"),
        (struct.pack("<Q", 50) + b"{}", "runs past the end"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "not UTF-8 JSON"),
        (_file([1, 2]), "not a JSON object"),  # type: ignore[arg-type]
        (_file({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "needs 8"),
        (_file({"x": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, b"\0"), "unknown safetensors dtype"),
        (_file({"x": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"\0" * 3), "gap or overlap"),
        (_file({"x": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 5), "truncated or padded"),
        (_file({"x": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"\0"), "truncated or padded"),
        (_file({"__metadata__": {"a": 1}}), "strings to strings"),
        (_file({"x": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}), "invalid shape"),
    ],
)
def test_bad_headers_are_refused_naming_the_file(tmp_path: Path, blob: bytes, problem: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    with pytest.raises(SnapshotError, match=problem) as info:
        read_header(path)
    assert str(path) in str(info.value)
    with pytest.raises(SnapshotError, match=problem):
        header_of_bytes(blob, source="mem")


def test_missing_file_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(SnapshotNotFoundError):
        read_header(tmp_path / "nope.safetensors")


def test_sub_byte_dtypes_need_whole_bytes() -> None:
    assert dtype_nbytes("F4", (2, 3)) == 3
    assert dtype_nbytes("F6_E2M3", (4,)) == 3
    with pytest.raises(SnapshotError, match="whole number of bytes"):
        dtype_nbytes("F4", (3,))


@pytest.mark.parametrize(
    ("dtype", "size"),
    [
        ("BOOL", 1),
        ("U8", 1),
        ("I8", 1),
        ("F8_E4M3", 1),
        ("F8_E5M2", 1),
        ("I16", 2),
        ("U16", 2),
        ("F16", 2),
        ("BF16", 2),
        ("I32", 4),
        ("U32", 4),
        ("F32", 4),
        ("I64", 8),
        ("U64", 8),
        ("F64", 8),
        ("C64", 8),
    ],
)
def test_dtype_sizes(dtype: str, size: int) -> None:
    assert dtype_nbytes(dtype, (3, 2)) == 6 * size
    assert dtype_nbytes(dtype, ()) == size
    assert dtype_nbytes(dtype, (0, 7)) == 0


# --------------------------------------------------------------------------- checksums


@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1))
def test_adler32_matches_zlib(data: bytes, start: int) -> None:
    assert adler32(data) == zlib.adler32(data)
    assert adler32(data, start) == zlib.adler32(data, start)
    assert adler32_hex(data) == f"{zlib.adler32(data):08x}"


def test_adler32_of_spec_example() -> None:
    assert adler32_hex(bytes.fromhex("013f80be003e0040")) == "097901fd"
    assert adler32_hex(bytes.fromhex("803f813f803f7e3f")) == "0dfa02fc"


# ------------------------------------------------------------------------------- index


def test_parse_index_defaults_and_refusals() -> None:
    index = parse_index(b'{"weight_map": {"a": "m.safetensors"}, "x": 1}', source="i")
    assert index["metadata"] == {} and index["x"] == 1
    assert parse_index(b'{"metadata": null, "weight_map": {}}', source="i")["metadata"] == {}
    for raw, problem in [
        (b"[]", "JSON object"),
        (b"{", "invalid index JSON"),
        (b'{"metadata": [], "weight_map": {}}', "metadata must be an object"),
        (b'{"metadata": {}}', "weight_map"),
        (b'{"weight_map": {"a": "sub/m.safetensors"}}', "immediate"),
        (b'{"weight_map": {"a": "m.bin"}}', "immediate"),
    ]:
        with pytest.raises(SnapshotError, match=problem):
            parse_index(raw, source="idx.json")


def test_generated_index_is_sorted_two_space_with_newline(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"z": np.zeros(3, np.float32), "é": np.zeros(2, np.int8)}, str(path))
    raw = generated_index_bytes(read_header(path))
    expected = {"metadata": {"total_size": 14}, "weight_map": {"z": "model.safetensors", "é": "model.safetensors"}}
    assert raw == (json.dumps(expected, indent=2, sort_keys=True) + "\n").encode()
    assert b"\\u00e9" in raw and raw.endswith(b"}\n") and not raw.endswith(b"\n\n")


def test_generated_index_refuses_no_tensors(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(_file({"__metadata__": {}}))
    with pytest.raises(SnapshotError, match="no tensors"):
        generated_index_bytes(read_header(tmp_path / "model.safetensors"))


def test_upload_index_keeps_order_and_appends_keys() -> None:
    index = {
        "weight_map": {"b": "model-00000-of-00001.safetensors"},
        "metadata": {"checksum_format": "ADLER-32", "note": "é", "version": "000007", "delta_encoding": "XOR"},
    }
    raw = upload_index_bytes(index, version="run-v000007", base_version="run-v000006")
    assert not raw.endswith(b"\n")
    parsed = json.loads(raw)
    assert list(parsed) == ["weight_map", "metadata"]
    assert list(parsed["metadata"]) == [
        "checksum_format",
        "note",
        "version",
        "delta_encoding",
        "base_version",
        "compression_format",
    ]
    assert parsed["metadata"]["checksum_format"] == "adler32" and parsed["metadata"]["delta_encoding"] == "xor"
    assert parsed["metadata"]["base_version"] == "run-v000006"
    assert b'"note": "\\u00e9"' in raw and raw.startswith(b'{\n "weight_map": {\n  "b"')
    assert serialize_index(parsed) == raw


@pytest.mark.parametrize(
    ("metadata", "ok"),
    [
        ({"delta_encoding": "XOR", "checksum_format": "Adler-32"}, True),
        ({"delta_encoding": "xor", "compression_format": "ZSTD", "checksum_format": "adler32"}, True),
        ({"delta_encoding": "overwrite", "checksum_format": "adler32"}, False),
        ({"delta_encoding": "xor", "compression_format": "lz4", "checksum_format": "adler32"}, False),
        ({"delta_encoding": "xor"}, False),
        ({"delta_encoding": "xor", "checksum_format": "xxh3-128"}, False),
        ({"delta_encoding": "xor", "checksum_format": "blake3"}, False),
    ],
)
def test_delta_metadata_rules(metadata: dict[str, str], ok: bool) -> None:
    if ok:
        check_delta_metadata(metadata, source="d")
    else:
        with pytest.raises(SnapshotError, match="d: "):
            check_delta_metadata(metadata, source="d")


def test_checksum_refusal_names_the_flag() -> None:
    with pytest.raises(SnapshotError, match="--update-weight-delta-checksum adler32"):
        check_delta_metadata({"delta_encoding": "xor", "checksum_format": "xxh3-128"}, source="d")


# -------------------------------------------------------------------------- identities


@pytest.mark.parametrize("identity", ["a", "grpo-a-v000002", "x" * 128, "weird name.v1"])
def test_valid_identities(identity: str) -> None:
    assert validate_identity(identity) == identity


@pytest.mark.parametrize("identity", ["", "x" * 129, "a/b", ".", "..", "initial", "_manifests", "_preflight"])
def test_invalid_identities(identity: str) -> None:
    with pytest.raises(SnapshotError, match="invalid identity"):
        validate_identity(identity)


def test_reserved_allowed_when_asked() -> None:
    assert validate_identity("initial", allow_reserved=True) == "initial"


def test_identity_rules() -> None:
    assert version_identity("grpo-a", 2) == "grpo-a-v000002"
    assert version_identity("r", 1234567) == "r-v1234567"
    assert identity_for_base_version("000006") == "weight_v000006"
    assert identity_for_base_version("7") == "weight_v000007"
    assert identity_for_base_version("run-v000006") == "run-v000006"
    with pytest.raises(SnapshotError, match="--previous-identity"):
        identity_for_base_version(None)


def test_snapshot_prefix_and_shard_names() -> None:
    assert snapshot_prefix("", "id") == "id"
    assert snapshot_prefix("/hotload/", "id") == "hotload/id"
    assert snapshot_prefix("a/b", "id") == "a/b/id"
    assert shard_name(0, 2) == "model-00000-of-00002.safetensors"
    assert fmt.SHARD_NAME_RE.match(shard_name(12, 100000))
    assert full_shard_name(0, 2) == "model-00001-of-00002.safetensors"
    assert full_shard_name(1, 2) == "model-00002-of-00002.safetensors"


# ------------------------------------------------------------------------ SnapshotFile


def test_snapshot_file_concatenates_buffers(tmp_path: Path) -> None:
    import hashlib

    parts = (b"abc", bytearray(b"de"), memoryview(b"fgh"), np.arange(3, dtype=np.uint16))
    file = SnapshotFile("x.bin", parts)
    whole = b"abcdefgh" + np.arange(3, dtype=np.uint16).tobytes()
    assert file.size == len(whole) and file.tobytes() == whole
    assert file.sha256() == hashlib.sha256(whole).hexdigest()
    file.write_to(tmp_path / "x.bin")
    assert (tmp_path / "x.bin").read_bytes() == whole


@pytest.mark.parametrize(
    ("identity", "run_id", "expected"),
    [
        ("run1-v000003", "run1", 3),
        ("run1-v1234567", "run1", 1234567),
        ("run-v1-v000002", "run-v1", 2),
        ("run2-v000003", "run1", None),  # another run's identity
        ("xrun1-v000003", "run1", None),
        ("run1-v00003", "run1", None),  # fewer than six digits: not a version identity
        ("initial", "run1", None),
        ("run1-v000003x", "run1", None),
        (None, "run1", None),
    ],
)
def test_identity_version_inverts_version_identity_for_one_run(
    identity: str | None, run_id: str, expected: int | None
) -> None:
    from cwtrain.hotload.format.identity import identity_version, split_version_identity

    assert identity_version(identity, run_id) == expected
    if expected is not None:
        assert version_identity(run_id, expected) == identity
        assert split_version_identity(identity) == (run_id, expected)


def test_split_version_identity_needs_a_run() -> None:
    from cwtrain.hotload.format.identity import split_version_identity

    assert split_version_identity("-v000001") is None
    assert split_version_identity("a-b-v000010") == ("a-b", 10)
