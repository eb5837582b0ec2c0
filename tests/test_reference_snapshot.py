"""The reference reader (tests/_reference_snapshot.py) on the format page's own worked example.

Section 11 of ``shared/spec/snapshot-format.md`` gives every byte of one delta: the shard as a
hex dump, the uploaded index, the old and new tensor bytes. The reference reader, which the
end-to-end tests trust to check served weights, must turn the old bytes into the new ones
from exactly those objects, and refuse each broken variant. Nothing of cwtrain is used here.
"""

from __future__ import annotations

import json
import struct

import pytest
from _reference_snapshot import INDEX, ReferenceError, decode_chain, read_safetensors

# section 11: the 258-byte shard model-00000-of-00001.safetensors
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
SHARD = bytes.fromhex("".join(SHARD_HEX.split()))
DELTA_INDEX = (
    b'{\n "metadata": {\n  "version": "grpo-a-v000002",\n  "base_version": "grpo-a-v000001",\n'
    b'  "delta_encoding": "xor",\n  "compression_format": "zstd",\n  "checksum_format": "adler32"\n },\n'
    b' "weight_map": {\n  "lm_head.weight": "model-00000-of-00001.safetensors",\n'
    b'  "model.norm.weight": "model-00000-of-00001.safetensors"\n }\n}'
)
OLD = {
    "lm_head.weight": bytes.fromhex("003f80be003e0040"),
    "model.norm.weight": bytes.fromhex("803f803f803f803f"),
    "model.embed_tokens.weight": bytes.fromhex("0000803f"),
}
NEW = {"lm_head.weight": bytes.fromhex("013f80be003e0040"), "model.norm.weight": bytes.fromhex("803f813f803f7e3f")}


def _safetensors(tensors: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    """A FULL shard for the predecessor, built here by the rules of section 4 (not by cwtrain)."""
    header: dict[str, object] = {}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(data for _, _, data in tensors.values())


def _objects(shard: bytes = SHARD, index: bytes = DELTA_INDEX) -> dict[str, bytes]:
    base = {
        "lm_head.weight": ("BF16", [2, 2], OLD["lm_head.weight"]),
        "model.norm.weight": ("BF16", [4], OLD["model.norm.weight"]),
        "model.embed_tokens.weight": ("BF16", [2], OLD["model.embed_tokens.weight"]),
    }
    full_index = {"metadata": {}, "weight_map": dict.fromkeys(base, "model.safetensors")}
    return {
        f"grpo-a-v000001/{INDEX}": json.dumps(full_index).encode(),
        "grpo-a-v000001/model.safetensors": _safetensors(base),
        f"grpo-a-v000002/{INDEX}": index,
        "grpo-a-v000002/model-00000-of-00001.safetensors": shard,
    }


def test_the_worked_example_decodes_to_the_new_bytes() -> None:
    assert len(SHARD) == 258 and len(DELTA_INDEX) == 313  # as the page says
    metadata, tensors = read_safetensors(SHARD)
    assert metadata == {"lm_head.weight": "097901fd", "model.norm.weight": "0dfa02fc"}
    assert {name: (t[0], t[1], len(t[2])) for name, t in tensors.items()} == {
        "lm_head.weight": ("U8", (17,), 17),
        "model.norm.weight": ("U8", (17,), 17),
    }
    objects = _objects()
    weights = decode_chain(objects.__getitem__, "grpo-a-v000002")
    assert {name: data for name, (_, _, data) in weights.items()} == {**OLD, **NEW}
    assert weights["lm_head.weight"][:2] == ("BF16", (2, 2))  # dtype and shape from the predecessor
    assert decode_chain(objects.__getitem__, "grpo-a-v000001")["lm_head.weight"][2] == OLD["lm_head.weight"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda o: o.update({"grpo-a-v000002/model-00000-of-00001.safetensors": SHARD[:-1] + b"\x01"}), "Adler-32"),
        (lambda o: o.update({f"grpo-a-v000002/{INDEX}": DELTA_INDEX.replace(b'"xor"', b'"overwrite"')}), "xor"),
        (lambda o: o.update({f"grpo-a-v000002/{INDEX}": DELTA_INDEX.replace(b'"adler32"', b'"blake3"')}), "adler32"),
        (lambda o: o.update({f"grpo-a-v000002/{INDEX}": DELTA_INDEX.replace(b'v000002"', b'v000009"')}), "version"),
        (  # the frame's content size (8) must equal the tensor's: here the predecessor's tensor is longer
            lambda o: o.update(
                {
                    "grpo-a-v000001/model.safetensors": _safetensors(
                        {
                            "lm_head.weight": ("BF16", [2, 3], OLD["lm_head.weight"] + b"\0\0\0\0"),
                            "model.norm.weight": ("BF16", [4], OLD["model.norm.weight"]),
                            "model.embed_tokens.weight": ("BF16", [2], OLD["model.embed_tokens.weight"]),
                        }
                    )
                }
            ),
            "content size",
        ),
        (  # an XOR applied to bytes that are not the predecessor's: only the checksum can tell
            lambda o: o.update(
                {
                    "grpo-a-v000001/model.safetensors": _safetensors(
                        {
                            "lm_head.weight": ("BF16", [2, 2], bytes(8)),
                            "model.norm.weight": ("BF16", [4], OLD["model.norm.weight"]),
                            "model.embed_tokens.weight": ("BF16", [2], OLD["model.embed_tokens.weight"]),
                        }
                    )
                }
            ),
            "Adler-32",
        ),
        (lambda o: o.update({"grpo-a-v000002/model-00000-of-00001.safetensors": SHARD + b"\0"}), "after the last"),
    ],
)
def test_every_broken_variant_is_refused(change: object, message: str) -> None:
    objects = _objects()
    change(objects)  # type: ignore[operator]
    with pytest.raises(ReferenceError, match=message):
        decode_chain(objects.__getitem__, "grpo-a-v000002")
