"""Spec snapshot-format.md section 11, reproduced byte for byte."""

from __future__ import annotations

import hashlib

import zstandard

from cwtrain.hotload.codec.decode import apply_delta
from cwtrain.hotload.codec.encode import DeltaEncoder
from cwtrain.hotload.format.index import parse_index
from cwtrain.hotload.format.tensors import TensorData

SHARD_HEX = """
d8 00 00 00 00 00 00 00 7b 22 5f 5f 6d 65 74 61 64 61 74 61 5f 5f 22 3a 7b 22 6c 6d 5f 68 65 61
64 2e 77 65 69 67 68 74 22 3a 22 30 39 37 39 30 31 66 64 22 2c 22 6d 6f 64 65 6c 2e 6e 6f 72 6d
2e 77 65 69 67 68 74 22 3a 22 30 64 66 61 30 32 66 63 22 7d 2c 22 6c 6d 5f 68 65 61 64 2e 77 65
69 67 68 74 22 3a 7b 22 64 74 79 70 65 22 3a 22 55 38 22 2c 22 73 68 61 70 65 22 3a 5b 31 37 5d
2c 22 64 61 74 61 5f 6f 66 66 73 65 74 73 22 3a 5b 30 2c 31 37 5d 7d 2c 22 6d 6f 64 65 6c 2e 6e
6f 72 6d 2e 77 65 69 67 68 74 22 3a 7b 22 64 74 79 70 65 22 3a 22 55 38 22 2c 22 73 68 61 70 65
22 3a 5b 31 37 5d 2c 22 64 61 74 61 5f 6f 66 66 73 65 74 73 22 3a 5b 31 37 2c 33 34 5d 7d 7d 20
28 b5 2f fd 20 08 41 00 00 01 00 00 00 00 00 00 00 28 b5 2f fd 20 08 41 00 00 00 00 01 00 00 00
fe 00
"""

INDEX_TEXT = """{
 "metadata": {
  "version": "grpo-a-v000002",
  "base_version": "grpo-a-v000001",
  "delta_encoding": "xor",
  "compression_format": "zstd",
  "checksum_format": "adler32"
 },
 "weight_map": {
  "lm_head.weight": "model-00000-of-00001.safetensors",
  "model.norm.weight": "model-00000-of-00001.safetensors"
 }
}"""

SHARD_SHA256 = "071823201b0b661322ed2a1ef5f781563ba0a1a311c885fb4d5a04de921b20da"
INDEX_SHA256 = "4b2da7ab83d6c00e2acf684e16a2254ab7b5cdcc21b0d90e2edc40991af282c0"


def _versions() -> tuple[dict[str, TensorData], dict[str, TensorData]]:
    old = {
        "lm_head.weight": TensorData("BF16", (2, 2), bytes.fromhex("003f80be003e0040")),
        "model.norm.weight": TensorData("BF16", (4,), bytes.fromhex("803f803f803f803f")),
        "model.embed_tokens.weight": TensorData("BF16", (3, 2), bytes.fromhex("0040" * 6)),
    }
    new = dict(old)
    new["lm_head.weight"] = TensorData("BF16", (2, 2), bytes.fromhex("013f80be003e0040"))
    new["model.norm.weight"] = TensorData("BF16", (4,), bytes.fromhex("803f813f803f7e3f"))
    return old, new


def test_worked_example_byte_for_byte() -> None:
    old, new = _versions()
    with DeltaEncoder(workers=2) as encoder:
        snap = encoder.encode(new, old, version="grpo-a-v000002", base_version="grpo-a-v000001")
    assert snap.changed == ["lm_head.weight", "model.norm.weight"] and not snap.empty
    [shard] = snap.files
    assert shard.name == "model-00000-of-00001.safetensors"
    data = shard.tobytes()
    assert data == bytes.fromhex("".join(SHARD_HEX.split()))
    assert len(data) == 258 and data[8:224].endswith(b"} ")
    assert hashlib.sha256(data).hexdigest() == SHARD_SHA256 == shard.sha256()
    index = snap.index.tobytes()
    assert index == INDEX_TEXT.encode() and len(index) == 313
    assert hashlib.sha256(index).hexdigest() == INDEX_SHA256
    assert snap.checksums["lm_head.weight"] == "097901fd" and snap.checksums["model.norm.weight"] == "0dfa02fc"


def test_worked_example_frames_decode_with_plain_zstandard() -> None:
    data = bytes.fromhex("".join(SHARD_HEX.split()))
    first, second = data[224:241], data[241:258]
    assert zstandard.ZstdDecompressor().decompress(first) == bytes.fromhex("0100000000000000")
    assert zstandard.ZstdDecompressor().decompress(second) == bytes.fromhex("000001000000fe00")


def test_worked_example_applies() -> None:
    old, new = _versions()
    shard = bytes.fromhex("".join(SHARD_HEX.split()))
    index = parse_index(INDEX_TEXT.encode(), source="index")
    result = apply_delta(old, index, {"model-00000-of-00001.safetensors": shard}, base_version="grpo-a-v000001")
    assert {n: bytes(memoryview(t.data)) for n, t in result.items()} == {
        n: bytes(memoryview(t.data)) for n, t in new.items()
    }
