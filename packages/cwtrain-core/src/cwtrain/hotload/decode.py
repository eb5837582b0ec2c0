"""Decoding snapshots: apply XOR deltas, load FULL snapshots, replay chains, verify everything.

Used by the engine replicas of ``cwtrain-local`` (index dicts and shard bytes fetched
from object storage), by the trainer's mirror and by ``cwtrain snapshot apply|verify``.

::

    new = apply_delta(base, index, shards, base_version="run-v000001")
    full = load_full(index, shards)                     # views into the shard bytes
    weights = replay_chain(full, [(index1, shards1), (index2, shards2)], root_version="run-v000000")
    snap = read_snapshot_dir("deltas/weight_v000002")   # index + memory-mapped shards
    new = apply_delta_dir("ckpt/v1", "deltas/weight_v000002")

``index`` is the parsed index dict, ``shards`` maps shard names to their bytes. Each
payload must be exactly one zstd frame whose content size equals the base tensor's
size (:func:`zstd_frame_size` walks the block headers, so a truncated frame or
trailing bytes are caught before decompression). Every Adler-32 is checked before
anything is returned; the base is never modified. Errors are
:class:`~cwtrain.errors.SnapshotError` (``SnapshotChecksumError`` for checksums,
``SnapshotNotFoundError`` for a missing shard) naming the shard and the tensor.
"""

from __future__ import annotations

import os
from collections.abc import Buffer, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import zstandard

from cwtrain.errors import SnapshotChecksumError, SnapshotError, SnapshotNotFoundError
from cwtrain.hotload.chain import MAX_CHAIN_DELTAS
from cwtrain.hotload.format import (
    CHECKSUM_FORMAT,
    INDEX_NAME,
    SINGLE_FILE_NAME,
    adler32,
    check_delta_metadata,
    generated_index_bytes,
    index_metadata,
    is_delta_index,
    parse_index,
)
from cwtrain.hotload.safetensors import SafetensorsHeader, TensorEntry, header_of_bytes, read_header
from cwtrain.hotload.tensors import FileRegion, TensorData

__all__ = [
    "SnapshotDir",
    "U8Array",
    "apply_delta",
    "apply_delta_dir",
    "apply_payload",
    "as_uint8",
    "decode_frame",
    "default_workers",
    "load_full",
    "load_full_dir",
    "read_snapshot_dir",
    "replay_chain",
    "verify_delta",
    "zstd_frame_size",
]

U8Array = npt.NDArray[np.uint8]
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def default_workers() -> int:
    """Threads used when ``workers`` is not given: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def as_uint8(data: Buffer | FileRegion) -> U8Array:
    """A flat ``uint8`` view of a bytes-like object (no copy; a :class:`FileRegion` is read).

    Raises:
        ValueError: a numpy array that is not C-contiguous.
    """
    if isinstance(data, FileRegion):
        return np.frombuffer(data.read(), dtype=np.uint8)
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            raise ValueError("tensor data must be C-contiguous")
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def zstd_frame_size(frame: Buffer) -> int:
    """Length of the one zstd frame at the start of ``frame``, by walking its block headers.

    Raises:
        ValueError: not a zstd frame, a dictionary frame, a reserved block type, or a
            frame that runs past the end (truncated).
    """
    view = memoryview(frame).cast("B")
    if view.nbytes < 6 or bytes(view[:4]) != _ZSTD_MAGIC:
        raise ValueError("not a zstd frame (bad magic)")
    descriptor = view[4]
    if descriptor & 0x08:
        raise ValueError("reserved bit set in the frame header")
    single = (descriptor >> 5) & 1
    dict_size = (0, 1, 2, 4)[descriptor & 3]
    if dict_size:
        raise ValueError("frame needs a dictionary")
    fcs_size = (single, 2, 4, 8)[descriptor >> 6]
    position = 5 + (0 if single else 1) + dict_size + fcs_size
    end = view.nbytes
    while True:
        if position + 3 > end:
            raise ValueError("truncated zstd frame")
        block = int.from_bytes(view[position : position + 3], "little")
        position += 3
        kind = (block >> 1) & 3
        if kind == 3:
            raise ValueError("reserved zstd block type")
        position += 1 if kind == 1 else block >> 3
        if position > end:
            raise ValueError("truncated zstd frame")
        if block & 1:
            break
    if descriptor & 0x04:
        position += 4
        if position > end:
            raise ValueError("truncated zstd frame")
    return position


def decode_frame(frame: Buffer, nbytes: int) -> U8Array:
    """Decompress one payload that must be exactly one zstd frame of ``nbytes`` content.

    Raises:
        ValueError: malformed, truncated, trailing bytes, or a content size other than
            ``nbytes`` (absent included).
    """
    view = memoryview(frame).cast("B")
    size = zstd_frame_size(view)
    if size != view.nbytes:
        raise ValueError(f"{view.nbytes - size} bytes after the zstd frame (expected exactly one frame)")
    content = zstandard.frame_content_size(view)
    if content != nbytes:
        shown = "absent" if content < 0 else str(content)
        raise ValueError(f"frame content size is {shown}, the tensor has {nbytes} bytes")
    try:
        out = zstandard.ZstdDecompressor().decompress(view, max_output_size=max(nbytes, 1))
    except zstandard.ZstdError as exc:
        raise ValueError(f"corrupt zstd frame: {exc}") from None
    if len(out) != nbytes:
        raise ValueError(f"frame decompressed to {len(out)} bytes, the tensor has {nbytes}")
    return np.frombuffer(out, np.uint8)


def apply_payload(old: Buffer | FileRegion, payload: Buffer, expected: int, *, where: str = "tensor") -> U8Array:
    """Decode one delta payload against the old tensor bytes and verify the result.

    Returns:
        A new array with the new tensor bytes (``old`` is not modified).

    Raises:
        SnapshotError: the payload is not exactly one zstd frame of the tensor's size.
        SnapshotChecksumError: the result's Adler-32 is not ``expected``.
    """
    old_bytes = as_uint8(old)
    try:
        xor = decode_frame(payload, old_bytes.size)
    except ValueError as exc:
        raise SnapshotError(f"{where}: {exc}") from None
    out = np.bitwise_xor(xor, old_bytes)
    actual = adler32(out)
    if actual != expected:
        raise SnapshotChecksumError(
            f"{where}: Adler-32 of the result is {actual:08x}, expected {expected:08x} "
            "(wrong base weights or corrupt delta)"
        )
    return out


def _shard_headers(index: Mapping[str, Any], shards: Mapping[str, Buffer], source: str) -> dict[str, SafetensorsHeader]:
    headers: dict[str, SafetensorsHeader] = {}
    weight_map: Mapping[str, str] = index.get("weight_map") or {}
    for shard in dict.fromkeys(weight_map.values()):
        if shard not in shards:
            raise SnapshotNotFoundError(f"{source}: shard {shard} named in the index is missing")
        headers[shard] = header_of_bytes(shards[shard], source=f"{source}/{shard}")
    for shard, header in headers.items():
        for name in header.tensors:
            if weight_map.get(name) != shard:
                raise SnapshotError(f"{source}/{shard}: tensor {name!r} is in the shard but not mapped to it")
    for name, shard in weight_map.items():
        if name not in headers[shard].tensors:
            raise SnapshotError(f"{source}: tensor {name!r} is mapped to {shard} but not in its header")
    return headers


def _tensor_bytes(shard: Buffer, header: SafetensorsHeader, entry: TensorEntry) -> U8Array:
    return as_uint8(shard)[header.data_start + entry.begin : header.data_start + entry.end]


def _expected_checksum(header: SafetensorsHeader, name: str, where: str, *, required: bool) -> int | None:
    text = (header.metadata or {}).get(name)
    if text is None:
        if required:
            raise SnapshotError(f"{where}: no Adler-32 for the tensor in the shard __metadata__")
        return None
    if len(text) != 8 or any(c not in "0123456789abcdef" for c in text):
        raise SnapshotError(f"{where}: checksum {text!r} is not 8 lowercase hex digits")
    return int(text, 16)


def apply_delta(
    base: Mapping[str, TensorData],
    index: Mapping[str, Any],
    shards: Mapping[str, Buffer],
    *,
    base_version: str | None = None,
    workers: int | None = None,
    source: str = "delta",
) -> dict[str, TensorData]:
    """Apply a delta to ``base`` and return the new weights; ``base`` is not modified.

    Every frame is decoded and every Adler-32 checked before anything is returned.

    Args:
        base: the predecessor's tensors.
        index: the delta's parsed index (``metadata`` with ``delta_encoding``).
        shards: shard name → shard bytes.
        base_version: when given, the index ``metadata.base_version`` must equal it.
        workers: decode threads (default: CPUs available).
        source: how errors name the delta (a path or URI).

    Raises:
        SnapshotError: wrong encoding, wrong base version, missing shard or tensor,
            malformed or truncated frame, a size that does not match the base.
        SnapshotChecksumError: an Adler-32 does not match.
    """
    jobs, headers = _delta_jobs(base, index, shards, base_version=base_version, source=source)

    def decode(job: tuple[str, str, TensorEntry, int, str]) -> tuple[str, U8Array]:
        name, shard, entry, expected, where = job
        payload = _tensor_bytes(shards[shard], headers[shard], entry)
        return name, apply_payload(base[name].data, payload, expected, where=where)

    results = _map(decode, jobs, workers)
    out = dict(base)
    for name, data in results:
        old = base[name]
        out[name] = TensorData(old.dtype, tuple(old.shape), data)
    return out


def verify_delta(
    base: Mapping[str, TensorData],
    index: Mapping[str, Any],
    shards: Mapping[str, Buffer],
    *,
    base_version: str | None = None,
    workers: int | None = None,
    source: str = "delta",
) -> list[str]:
    """Check that a delta applies to ``base`` (every frame, every Adler-32) without keeping the result.

    Memory stays at the tensors being decoded, whatever the delta's size (the on-disk
    mirror verifies this way before it writes anything).

    Returns:
        The names of the tensors the delta changes.

    Raises:
        SnapshotError: as :func:`apply_delta`.
    """
    jobs, headers = _delta_jobs(base, index, shards, base_version=base_version, source=source)

    def check(job: tuple[str, str, TensorEntry, int, str]) -> str:
        name, shard, entry, expected, where = job
        apply_payload(base[name].data, _tensor_bytes(shards[shard], headers[shard], entry), expected, where=where)
        return name

    return list(_map(check, jobs, workers))


def _delta_jobs(
    base: Mapping[str, TensorData],
    index: Mapping[str, Any],
    shards: Mapping[str, Buffer],
    *,
    base_version: str | None,
    source: str,
) -> tuple[list[tuple[str, str, TensorEntry, int, str]], dict[str, SafetensorsHeader]]:
    metadata = index_metadata(index)
    if not is_delta_index(index):
        raise SnapshotError(f"{source}: not a delta (index metadata has no delta_encoding)")
    check_delta_metadata(metadata, source=source)
    if base_version is not None and str(metadata.get("base_version")) != base_version:
        raise SnapshotError(
            f"{source}: delta is against base_version {metadata.get('base_version')!r}, "
            f"but it is being applied to {base_version!r}"
        )
    headers = _shard_headers(index, shards, source)
    weight_map: Mapping[str, str] = index["weight_map"]
    jobs = []
    for name, shard in weight_map.items():
        where = f"{source}/{shard}: tensor {name!r}"
        entry = headers[shard].tensors[name]
        if entry.dtype != "U8" or len(entry.shape) != 1:
            raise SnapshotError(f"{where}: delta payloads must be 1-D U8, got {entry.dtype} {list(entry.shape)}")
        if name not in base:
            raise SnapshotError(f"{where}: the base has no such tensor")
        expected = _expected_checksum(headers[shard], name, where, required=True)
        assert expected is not None
        jobs.append((name, shard, entry, expected, where))
    return jobs, headers


def load_full(
    index: Mapping[str, Any],
    shards: Mapping[str, Buffer],
    *,
    verify: bool = True,
    workers: int | None = None,
    source: str = "snapshot",
) -> dict[str, TensorData]:
    """Read a FULL snapshot's tensors (views into ``shards``, in weight-map order).

    With ``verify``, every Adler-32 in the shard ``__metadata__`` is checked (all are
    required when the index says ``checksum_format: adler32``) before returning.

    Raises:
        SnapshotError: a delta index, a missing shard, a malformed header.
        SnapshotChecksumError: an Adler-32 does not match.
    """
    if is_delta_index(index):
        raise SnapshotError(f"{source}: is a delta (index metadata has delta_encoding), not a FULL snapshot")
    weight_map: Mapping[str, str] = index.get("weight_map") or {}
    if not weight_map:
        raise SnapshotError(f"{source}: the index maps no tensors")
    headers = _shard_headers(index, shards, source)
    required = str(index_metadata(index).get("checksum_format", "")).lower().replace("-", "") == CHECKSUM_FORMAT
    tensors: dict[str, TensorData] = {}
    checks = []
    for name, shard in weight_map.items():
        header = headers[shard]
        entry = header.tensors[name]
        data = _tensor_bytes(shards[shard], header, entry)
        tensors[name] = TensorData(entry.dtype, entry.shape, data)
        if verify:
            where = f"{source}/{shard}: tensor {name!r}"
            expected = _expected_checksum(header, name, where, required=required)
            if expected is not None:
                checks.append((where, data, expected))

    def check(job: tuple[str, U8Array, int]) -> None:
        where, data, expected = job
        actual = adler32(data)
        if actual != expected:
            raise SnapshotChecksumError(f"{where}: Adler-32 is {actual:08x}, expected {expected:08x}")

    _map(check, checks, workers)
    return tensors


def replay_chain(
    root: Mapping[str, TensorData],
    deltas: Sequence[tuple[Mapping[str, Any], Mapping[str, Buffer]]],
    *,
    root_version: str | None = None,
    workers: int | None = None,
) -> dict[str, TensorData]:
    """Apply ``deltas`` in order on the FULL ``root``; each must follow the previous one.

    Raises:
        SnapshotError: more than 63 deltas, or a delta whose ``base_version`` is not
            the previous delta's ``version`` (or ``root_version`` for the first).
    """
    if len(deltas) > MAX_CHAIN_DELTAS:
        raise SnapshotError(f"chain of {len(deltas)} deltas exceeds {MAX_CHAIN_DELTAS}; publish a FULL snapshot")
    weights = dict(root)
    previous = root_version
    for position, (index, shards) in enumerate(deltas):
        source = f"delta #{position + 1} ({index_metadata(index).get('version', '?')})"
        weights = apply_delta(weights, index, shards, base_version=previous, workers=workers, source=source)
        version = index_metadata(index).get("version")
        previous = None if version is None else str(version)
    return weights


def _map(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int | None) -> list[Any]:
    count = workers if workers is not None else default_workers()
    if count <= 1 or len(jobs) <= 1:
        return [fn(job) for job in jobs]
    with ThreadPoolExecutor(min(count, len(jobs)), thread_name_prefix="cwtrain-decode") as pool:
        return list(pool.map(fn, jobs))


# --------------------------------------------------------------------------- directories


@dataclass
class SnapshotDir:
    """A snapshot directory read for decoding: its index and its shards (memory-mapped)."""

    path: Path
    index: dict[str, Any]
    shards: dict[str, Buffer] = field(default_factory=dict)
    index_generated: bool = False


def read_snapshot_dir(path: str | Path) -> SnapshotDir:
    """Read a snapshot directory's index (or generate it for a lone ``model.safetensors``)
    and map its shards read-only.

    Raises:
        SnapshotNotFoundError: no directory, no index (and no ``model.safetensors``), or
            a shard named in the index is absent.
    """
    import mmap

    root = Path(path)
    if not root.is_dir():
        raise SnapshotNotFoundError(f"{root}: not a directory")
    index_path = root / INDEX_NAME
    generated = False
    if index_path.is_file():
        index = parse_index(index_path.read_bytes(), source=str(index_path))
    elif (root / SINGLE_FILE_NAME).is_file():
        header = read_header(root / SINGLE_FILE_NAME)
        index = parse_index(generated_index_bytes(header), source=str(root / SINGLE_FILE_NAME))
        generated = True
    else:
        raise SnapshotNotFoundError(f"{root}: no {INDEX_NAME} (and no {SINGLE_FILE_NAME})")
    shards: dict[str, Buffer] = {}
    for shard in dict.fromkeys(index["weight_map"].values()):
        shard_path = root / shard
        if not shard_path.is_file():
            raise SnapshotNotFoundError(f"{root}: shard {shard} named in the index is missing")
        with open(shard_path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            shards[shard] = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    return SnapshotDir(root, index, shards, generated)


def load_full_dir(path: str | Path, *, verify: bool = True, workers: int | None = None) -> dict[str, TensorData]:
    """:func:`load_full` on a directory (tensors are views of memory-mapped shards)."""
    snap = read_snapshot_dir(path)
    return load_full(snap.index, snap.shards, verify=verify, workers=workers, source=str(snap.path))


def apply_delta_dir(
    base: Mapping[str, TensorData] | str | Path,
    delta: str | Path,
    *,
    base_version: str | None = None,
    workers: int | None = None,
) -> dict[str, TensorData]:
    """:func:`apply_delta` with the delta (and optionally the base) read from directories."""
    if isinstance(base, (str, Path)):
        base = load_full_dir(base, workers=workers)
    snap = read_snapshot_dir(delta)
    return apply_delta(base, snap.index, snap.shards, base_version=base_version, workers=workers, source=str(snap.path))
