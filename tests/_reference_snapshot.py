"""A reference reader of snapshots, written from ``shared/spec/snapshot-format.md`` alone.

The end-to-end tests check served weights with it, so a bug that cwtrain's encoder and
decoder share (and so cancel out: the replicas decode with cwtrain's codec) cannot pass.
It uses only ``json``, ``struct``, ``zlib`` (Adler-32), ``zstandard`` and ``numpy``, never
cwtrain's code, and is small on purpose: no streaming, no memory budget, strict checks.

* :func:`read_safetensors` — section 4: the header (u64 LE length, JSON) and each tensor's bytes.
* :func:`decode_chain` — sections 3, 5 and 6: the snapshot ``identity`` as the engine would
  build it: follow ``base_version`` back to the FULL root (at most 63 deltas), load it, then
  per delta and tensor decompress the one zstd frame (its content size = the tensor's size),
  XOR into the previous bytes and check the Adler-32 of the result.
* :func:`bucket_reader` / :func:`replica_weights` — the objects of a snapshot prefix in a
  bucket; the weights a replica of the local stack serves (``GET /admin/weights``).
* :func:`tensor_bytes` — the raw little-endian bytes of a torch tensor, numpy array or
  ``(dtype, shape, data)`` value, to compare with.
"""

from __future__ import annotations

import json
import struct
import urllib.request
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import zstandard

INDEX = "model.safetensors.index.json"
MAX_DELTAS = 63


class ReferenceError(AssertionError):
    """The snapshot breaks a rule of the format page (the message names the rule and the object)."""


Tensor = tuple[str, tuple[int, ...], bytes]  # dtype, shape, raw bytes


def read_safetensors(data: bytes, source: str = "file") -> tuple[dict[str, str], dict[str, Tensor]]:
    """``(__metadata__, {name: (dtype, shape, bytes)})`` of one safetensors file (section 4)."""
    if len(data) < 8:
        raise ReferenceError(f"{source}: shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", data[:8])
    if 8 + length > len(data):
        raise ReferenceError(f"{source}: header length {length} runs past the file")
    header = json.loads(data[8 : 8 + length].decode("utf-8"))
    body = data[8 + length :]
    metadata = header.pop("__metadata__", None) or {}
    tensors: dict[str, Tensor] = {}
    spans = []
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        spans.append((begin, end))
        tensors[name] = (entry["dtype"], tuple(entry["shape"]), body[begin:end])
    spans.sort()
    position = 0
    for begin, end in spans:  # contiguous, no gaps, the last end is the data length
        if begin != position or end < begin:
            raise ReferenceError(f"{source}: tensor data not contiguous at byte {begin}")
        position = end
    if position != len(body):
        raise ReferenceError(f"{source}: {len(body) - position} bytes after the last tensor")
    return metadata, tensors


def _adler(data: bytes) -> str:
    return f"{zlib.adler32(data) & 0xFFFFFFFF:08x}"


def _check_delta_metadata(metadata: Mapping[str, Any], source: str) -> None:
    if str(metadata.get("delta_encoding", "")).lower() != "xor":
        raise ReferenceError(f"{source}: delta_encoding {metadata.get('delta_encoding')!r} is not xor")
    if metadata.get("compression_format", "zstd") != "zstd":
        raise ReferenceError(f"{source}: compression_format {metadata.get('compression_format')!r} is not zstd")
    if str(metadata.get("checksum_format", "")).lower().replace("-", "") != "adler32":
        raise ReferenceError(f"{source}: checksum_format {metadata.get('checksum_format')!r} is not adler32")


def _shards(index: Mapping[str, Any], read: Callable[[str], bytes], prefix: str) -> dict[str, dict[str, Any]]:
    """Every shard the index names, parsed; each tensor of a shard must be mapped to that shard."""
    weight_map = index["weight_map"]
    parsed: dict[str, dict[str, Any]] = {}
    for shard in sorted(set(weight_map.values())):
        metadata, tensors = read_safetensors(read(f"{prefix}/{shard}"), f"{prefix}/{shard}")
        for name in tensors:
            if weight_map.get(name) != shard:
                raise ReferenceError(f"{prefix}/{shard}: tensor {name} is not mapped to this shard")
        parsed[shard] = {"metadata": metadata, "tensors": tensors}
    return parsed


def load_full(index: Mapping[str, Any], read: Callable[[str], bytes], prefix: str) -> dict[str, Tensor]:
    """A FULL snapshot's tensors; where a shard carries Adler-32s (section 3.3) they must match."""
    out: dict[str, Tensor] = {}
    for shard, parsed in _shards(index, read, prefix).items():
        for name, (dtype, shape, data) in parsed["tensors"].items():
            expected = parsed["metadata"].get(name)
            if expected is not None and expected != _adler(data):
                raise ReferenceError(
                    f"{prefix}/{shard}: Adler-32 of {name} is {_adler(data)}, the header says {expected}"
                )
            out[name] = (dtype, shape, data)
    if set(out) != set(index["weight_map"]):
        raise ReferenceError(
            f"{prefix}: the index maps tensors no shard holds: {sorted(set(index['weight_map']) - set(out))}"
        )
    return out


def apply_delta(
    base: Mapping[str, Tensor], index: Mapping[str, Any], read: Callable[[str], bytes], prefix: str
) -> dict[str, Tensor]:
    """``base`` with one delta applied (sections 5.3 and 6); tensors the delta does not name keep their bytes."""
    _check_delta_metadata(index["metadata"], f"{prefix}/{INDEX}")
    out = dict(base)
    for shard, parsed in _shards(index, read, prefix).items():
        for name, (dtype, shape, payload) in parsed["tensors"].items():
            where = f"{prefix}/{shard}: {name}"
            if name not in base:
                raise ReferenceError(f"{where}: not a tensor of the predecessor")
            if dtype != "U8" or shape != (len(payload),):
                raise ReferenceError(f"{where}: payload entry is {dtype} {list(shape)}, not U8 [{len(payload)}]")
            old_dtype, old_shape, old = base[name]
            frame = zstandard.get_frame_parameters(payload)
            if frame.content_size != len(old):
                raise ReferenceError(
                    f"{where}: frame content size {frame.content_size}, the tensor has {len(old)} bytes"
                )
            if frame.dict_id:
                raise ReferenceError(f"{where}: the frame names a dictionary")
            decompressor = zstandard.ZstdDecompressor().decompressobj()
            xor = decompressor.decompress(payload)
            if not decompressor.eof or decompressor.unused_data or len(xor) != len(old):
                raise ReferenceError(f"{where}: not exactly one zstd frame of {len(old)} bytes")
            new = (np.frombuffer(old, np.uint8) ^ np.frombuffer(xor, np.uint8)).tobytes()
            expected = parsed["metadata"].get(name)
            if expected != _adler(new):
                raise ReferenceError(f"{where}: Adler-32 after XOR is {_adler(new)}, the header says {expected}")
            out[name] = (old_dtype, old_shape, new)
    return out


def decode_chain(read: Callable[[str], bytes], identity: str) -> dict[str, Tensor]:
    """The weights of snapshot ``identity``: its chain from the FULL root, every delta applied in order.

    Args:
        read: bytes of an object by its key below the hot-load prefix (``"<identity>/<file>"``).
        identity: the snapshot to build.
    """
    chain: list[tuple[str, dict[str, Any]]] = []
    current: str | None = identity
    while current is not None:
        if len(chain) > MAX_DELTAS or any(current == seen for seen, _ in chain):
            raise ReferenceError(f"{identity}: the chain passes {MAX_DELTAS} deltas or loops at {current}")
        index = json.loads(read(f"{current}/{INDEX}").decode("utf-8"))
        metadata = index.get("metadata") or {}
        chain.append((current, index))
        if "delta_encoding" not in metadata:
            current = None  # the FULL root
        else:
            if metadata.get("version") != current:
                raise ReferenceError(f"{current}/{INDEX}: metadata.version is {metadata.get('version')!r}")
            current = metadata["base_version"]
    root, root_index = chain.pop()
    weights = load_full(root_index, read, root)
    for name, index in reversed(chain):
        weights = apply_delta(weights, index, read, name)
    return weights


def bucket_reader(s3: Any, bucket: str, path_prefix: str) -> Callable[[str], bytes]:
    """``read`` for :func:`decode_chain` over a boto3 client: keys below ``path_prefix`` (section 1)."""
    base = path_prefix.strip("/")

    def read(key: str) -> bytes:
        return bytes(s3.get_object(Bucket=bucket, Key=f"{base}/{key}" if base else key)["Body"].read())

    return read


def replica_weights(url: str, token: str) -> tuple[str, dict[str, Tensor]]:
    """``(identity, weights)`` a local-stack replica serves: its ``GET /admin/weights`` safetensors file."""
    request = urllib.request.Request(url.rstrip("/") + "/admin/weights", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        metadata, tensors = read_safetensors(answer.read(), f"{url}/admin/weights")
    return metadata["identity"], tensors


def tensor_bytes(value: Any) -> bytes:
    """The raw little-endian bytes of a torch tensor, a numpy array, or a ``(dtype, shape, data)`` value."""
    if hasattr(value, "untyped_storage"):  # a torch tensor (torch is imported only when one comes)
        import torch

        flat = value.detach().contiguous().reshape(-1)
        return bytes(flat.view(torch.uint8).cpu().numpy().tobytes())
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value).tobytes()
    data = value[2] if isinstance(value, tuple) else value.data
    return bytes(memoryview(data).cast("B"))


def assert_same_weights(actual: Mapping[str, Tensor], expected: Mapping[str, Any], what: str) -> None:
    """Every tensor of ``expected`` (the trainer's) has the same bytes in ``actual``, and no other is there."""
    assert sorted(actual) == sorted(expected), f"{what}: tensor names differ"
    differ = [name for name in sorted(expected) if actual[name][2] != tensor_bytes(expected[name])]
    assert not differ, f"{what}: bytes differ from the trainer's for {differ[:5]} ({len(differ)} tensors)"


def checkpoint_weights(directory: Any) -> dict[str, Tensor]:
    """The tensors of a checkpoint directory's ``*.safetensors`` files, read by :func:`read_safetensors`."""
    from pathlib import Path

    out: dict[str, Tensor] = {}
    for path in sorted(Path(directory).glob("*.safetensors")):
        out.update(read_safetensors(path.read_bytes(), str(path))[1])
    return out


def served_by_replicas(stack: Any, deployment_id: str) -> list[tuple[str, dict[str, Tensor]]]:
    """``(identity, weights)`` of every running replica of a local-stack deployment."""
    slots = stack.supervisor.slots[deployment_id]
    return [replica_weights(s.process.url, s.process.token) for s in slots if s.process is not None]


def check_served(
    stack: Any, deployment_id: str, path_prefix: str, identity: str, expected: Mapping[str, Any], *, bucket: str = ""
) -> None:
    """Snapshot ``identity`` decoded from the bucket by this reader, and every replica's weights, are the trainer's.

    Args:
        stack: the :class:`cwtrain.local.LocalStack` (or a view of it) holding the deployment.
        deployment_id: the deployment whose replicas are asked.
        path_prefix: its hot-load path prefix.
        identity: the snapshot every replica must serve.
        expected: the trainer's weights at ``identity`` (torch tensors, numpy arrays, ``TensorData``).
        bucket: the hot-load bucket (default: the stack's).
    """
    read = bucket_reader(stack.s3_client(), bucket or stack.bucket, path_prefix)
    assert_same_weights(decode_chain(read, identity), expected, f"{identity} decoded from the bucket by the reference")
    replicas = served_by_replicas(stack, deployment_id)
    assert replicas, f"deployment {deployment_id} has no running replica"
    for served, weights in replicas:
        assert served == identity, f"a replica serves {served}, not {identity}"
        assert_same_weights(weights, expected, f"{identity} as a replica serves it")
