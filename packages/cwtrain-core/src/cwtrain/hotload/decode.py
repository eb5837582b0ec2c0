"""Decoding snapshots: apply XOR deltas, load FULL snapshots, replay chains, verify everything.

Used by the engine replicas of ``cwtrain-local`` (index dicts and shard bytes fetched
from object storage), by the trainer's mirror and by ``cwtrain snapshot apply|verify``.

::

    new = apply_delta(base, index, shards, base_version="run-v000001")
    full = load_full(index, shards)                     # views into the shard bytes
    weights = replay_chain(full, [(index1, shards1), (index2, shards2)], root_version="run-v000000")
    with read_snapshot_dir("deltas/weight_v000002") as snap:   # index + shards read with pread
        verify_delta(base, snap.index, snap.shards)
    report = verify_snapshot_dir("deltas/weight_v000002", base="ckpt/v1")   # what `snapshot verify` does
    new = apply_delta_dir("ckpt/v1", "deltas/weight_v000002")               # in memory

``index`` is the parsed index dict, ``shards`` maps shard names to their bytes: any
bytes-like, or a :class:`~cwtrain.hotload.tensors.FileRegion` of an open file (read with
``pread``, never memory-mapped, so a file that shrinks is a ``SnapshotError``, not a
``SIGBUS``). Tensors given as ``base`` are bytes-likes or file regions too.

Every payload must be exactly one zstd frame whose content size equals the base
tensor's size; :mod:`cwtrain.hotload.frames` (whose names are re-exported here) checks
each frame's block headers before decompressing anything and then decodes it 1 MiB at
a time through reused buffers (XOR with the base, Adler-32 of the result), so memory
stays at the decoder's window plus a few chunks per thread, whatever a frame declares;
threads share a memory budget (``CWTRAIN_HOTLOAD_MEMORY_BUDGET``, default 1 GiB), as
the encoder's do. Results are kept only by :func:`apply_delta` (the new tensors, in
memory) and whatever sink :func:`stream_payload` is given (``cwtrain snapshot apply``
writes to a file).

Every Adler-32 is checked before anything is returned; the base is never modified.
Errors are :class:`~cwtrain.errors.SnapshotError` (``SnapshotChecksumError`` for
checksums, ``SnapshotNotFoundError`` for a missing shard) naming the shard and the
tensor; nothing else escapes, whatever the bytes (a fuzz test holds this).
"""

from __future__ import annotations

import os
from collections.abc import Buffer, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypedDict, Unpack

from cwtrain.closing import Closing
from cwtrain.errors import SnapshotChecksumError, SnapshotError, SnapshotNotFoundError
from cwtrain.hotload.chain import MAX_CHAIN_DELTAS
from cwtrain.hotload.format import (
    CHECKSUM_FORMAT,
    check_delta_metadata,
    index_metadata,
    is_checksum,
    is_delta_index,
    read_directory_index,
)
from cwtrain.hotload.frames import (
    MAX_WINDOW_BYTES,
    MemoryBudget,
    U8Array,
    apply_payload,
    as_uint8,
    decode_frame,
    default_workers,
    run_parallel,
    stream_payload,
    tensor_checksum,
    zstd_frame_size,
)
from cwtrain.hotload.safetensors import (
    SafetensorsHeader,
    TensorEntry,
    check_weight_map,
    header_of_bytes,
    read_header_at,
)
from cwtrain.hotload.tensors import FileRegion, TensorData

__all__ = [
    "DeltaOptions",
    "DeltaTensor",
    "MAX_WINDOW_BYTES",
    "MemoryBudget",
    "ShardData",
    "SnapshotDir",
    "U8Array",
    "VerifyReport",
    "apply_delta",
    "apply_delta_dir",
    "apply_payload",
    "as_uint8",
    "decode_frame",
    "default_workers",
    "delta_tensors",
    "load_full",
    "load_full_dir",
    "read_snapshot_dir",
    "replay_chain",
    "run_parallel",
    "shard_header",
    "stream_payload",
    "tensor_data",
    "verify_delta",
    "verify_frames",
    "verify_snapshot_dir",
    "zstd_frame_size",
]

#: A shard as the decoders take it: its bytes in memory, or a region of an open file.
ShardData = Buffer | FileRegion

# ----------------------------------------------------------------------------- shards


def shard_header(shard: ShardData, *, source: str) -> SafetensorsHeader:
    """The validated header of a whole shard (in memory, or a file region read with pread)."""
    if isinstance(shard, FileRegion):
        return read_header_at(shard.fd, shard.nbytes, source=source, offset=shard.offset)
    return header_of_bytes(shard, source=source)


def tensor_data(shard: ShardData, header: SafetensorsHeader, entry: TensorEntry) -> Buffer | FileRegion:
    """One tensor's bytes within a shard: a view of a buffer, or a narrower file region."""
    start = header.data_start + entry.begin
    if isinstance(shard, FileRegion):
        return FileRegion(shard.fd, shard.offset + start, entry.nbytes)
    return as_uint8(shard)[start : start + entry.nbytes]


def _shard_headers(
    index: Mapping[str, Any], shards: Mapping[str, ShardData], source: str
) -> dict[str, SafetensorsHeader]:
    headers: dict[str, SafetensorsHeader] = {}
    weight_map: Mapping[str, str] = index.get("weight_map") or {}
    for shard in dict.fromkeys(weight_map.values()):
        if shard not in shards:
            raise SnapshotNotFoundError(f"{source}: shard {shard} named in the index is missing")
        headers[shard] = shard_header(shards[shard], source=f"{source}/{shard}")
    check_weight_map(source, weight_map, headers)
    return headers


def _expected_checksum(header: SafetensorsHeader, name: str, where: str, *, required: bool) -> int | None:
    text = (header.metadata or {}).get(name)
    if text is None or (not required and not is_checksum(text)):
        if required:
            raise SnapshotError(f"{where}: no Adler-32 for the tensor in the shard __metadata__")
        return None  # not a checksum: another metadata entry that shares the tensor's name
    if not is_checksum(text):
        raise SnapshotError(f"{where}: checksum {text[:40]!r} is not 8 lowercase hex digits")
    return int(text, 16)


# ------------------------------------------------------------------------------ deltas


class DeltaTensor(NamedTuple):
    """One changed tensor of a delta: its payload, the Adler-32 of its new bytes, how errors name it."""

    name: str
    payload: Buffer | FileRegion
    expected: int
    where: str


def delta_tensors(
    base: Mapping[str, TensorData] | None,
    index: Mapping[str, Any],
    shards: Mapping[str, ShardData],
    *,
    base_version: str | None = None,
    source: str = "delta",
) -> list[DeltaTensor]:
    """Check a delta's index and shard headers (against ``base`` when given); its changed tensors.

    Nothing is decompressed here.

    Raises:
        SnapshotError: not a delta, an encoding other than xor/zstd/adler32, another
            base version, a missing shard or tensor, a payload that is not 1-D ``U8``,
            a missing or malformed Adler-32, or a tensor the base does not have.
    """
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
    out = []
    for name, shard in weight_map.items():
        where = f"{source}/{shard}: tensor {name!r}"
        entry = headers[shard].tensors[name]
        if entry.dtype != "U8" or len(entry.shape) != 1:
            raise SnapshotError(f"{where}: delta payloads must be 1-D U8, got {entry.dtype} {list(entry.shape)}")
        if base is not None and name not in base:
            raise SnapshotError(f"{where}: the base has no such tensor")
        expected = _expected_checksum(headers[shard], name, where, required=True)
        assert expected is not None
        out.append(DeltaTensor(name, tensor_data(shards[shard], headers[shard], entry), expected, where))
    return out


class DeltaOptions(TypedDict, total=False):
    """How :func:`apply_delta` and :func:`verify_delta` read a delta.

    Attributes:
        base_version: when given, the index ``metadata.base_version`` must equal it.
        workers: decode threads (default: CPUs available).
        source: how errors name the delta (a path or URI; default ``"delta"``).
        memory_budget: bytes the decoders may hold (default ``CWTRAIN_HOTLOAD_MEMORY_BUDGET``).
    """

    base_version: str | None
    workers: int | None
    source: str
    memory_budget: int | None


def _delta_jobs(
    base: Mapping[str, TensorData], index: Mapping[str, Any], shards: Mapping[str, ShardData], options: DeltaOptions
) -> tuple[list[DeltaTensor], MemoryBudget]:
    source = options.get("source", "delta")
    jobs = delta_tensors(base, index, shards, base_version=options.get("base_version"), source=source)
    return jobs, MemoryBudget(options.get("memory_budget"))


def apply_delta(
    base: Mapping[str, TensorData],
    index: Mapping[str, Any],
    shards: Mapping[str, ShardData],
    **options: Unpack[DeltaOptions],
) -> dict[str, TensorData]:
    """Apply a delta to ``base`` and return the new weights; ``base`` is not modified.

    Every frame is decoded and every Adler-32 checked before anything is returned.
    Memory: the changed tensors' new bytes (the result) plus the decoders' budget.

    Args:
        base: the predecessor's tensors.
        index: the delta's parsed index (``metadata`` with ``delta_encoding``).
        shards: shard name → shard bytes (or file region).
        **options: base version check, threads, error naming and memory (:class:`DeltaOptions`).

    Raises:
        SnapshotError: wrong encoding, wrong base version, missing shard or tensor,
            malformed or truncated frame, a size that does not match the base.
        SnapshotChecksumError: an Adler-32 does not match.
    """
    jobs, budget = _delta_jobs(base, index, shards, options)

    def decode(job: DeltaTensor) -> tuple[str, U8Array]:
        return job.name, apply_payload(base[job.name].data, job.payload, job.expected, where=job.where, budget=budget)

    results = run_parallel(decode, jobs, options.get("workers"))
    out = dict(base)
    for name, data in results:
        old = base[name]
        out[name] = TensorData(old.dtype, tuple(old.shape), data)
    return out


def verify_delta(
    base: Mapping[str, TensorData],
    index: Mapping[str, Any],
    shards: Mapping[str, ShardData],
    **options: Unpack[DeltaOptions],
) -> list[str]:
    """Check that a delta applies to ``base`` (every frame, every Adler-32) without keeping the result.

    Memory stays within the decoders' budget, whatever the delta's size (the on-disk
    mirror verifies this way before it writes anything).

    Returns:
        The names of the tensors the delta changes.

    Raises:
        SnapshotError: as :func:`apply_delta`.
    """
    jobs, budget = _delta_jobs(base, index, shards, options)

    def check(job: DeltaTensor) -> str:
        stream_payload(job.payload, base[job.name].data, expected=job.expected, where=job.where, budget=budget)
        return job.name

    return run_parallel(check, jobs, options.get("workers"))


def verify_frames(
    index: Mapping[str, Any],
    shards: Mapping[str, ShardData],
    *,
    workers: int | None = None,
    source: str = "delta",
    memory_budget: int | None = None,
) -> list[str]:
    """Check a delta without its base: index, headers, and that every frame decodes to the size it declares.

    No Adler-32 can be checked without the base. Work is bounded by the sizes the frames
    declare (which their blocks must be able to hold), memory by the budget.

    Returns:
        The names of the tensors the delta changes.

    Raises:
        SnapshotError: as :func:`delta_tensors`, or a malformed frame.
    """
    jobs = delta_tensors(None, index, shards, source=source)
    budget = MemoryBudget(memory_budget)

    def check(job: DeltaTensor) -> str:
        stream_payload(job.payload, None, where=job.where, budget=budget)
        return job.name

    return run_parallel(check, jobs, workers)


def _checksum_jobs(
    index: Mapping[str, Any], shards: Mapping[str, ShardData], headers: Mapping[str, SafetensorsHeader], source: str
) -> tuple[dict[str, TensorData], list[tuple[str, Buffer | FileRegion, int]], int]:
    required = str(index_metadata(index).get("checksum_format", "")).lower().replace("-", "") == CHECKSUM_FORMAT
    tensors: dict[str, TensorData] = {}
    checks: list[tuple[str, Buffer | FileRegion, int]] = []
    unchecked = 0
    weight_map: Mapping[str, str] = index.get("weight_map") or {}
    for name, shard in weight_map.items():
        header = headers[shard]
        entry = header.tensors[name]
        data = tensor_data(shards[shard], header, entry)
        tensors[name] = TensorData(entry.dtype, entry.shape, data)
        where = f"{source}/{shard}: tensor {name!r}"
        expected = _expected_checksum(header, name, where, required=required)
        if expected is None:
            unchecked += 1
        else:
            checks.append((where, data, expected))
    return tensors, checks, unchecked


def _verify_checksums(checks: Sequence[tuple[str, Buffer | FileRegion, int]], workers: int | None) -> None:
    def check(job: tuple[str, Buffer | FileRegion, int]) -> None:
        where, data, expected = job
        actual = tensor_checksum(data)
        if actual != expected:
            raise SnapshotChecksumError(f"{where}: Adler-32 is {actual:08x}, expected {expected:08x}")

    run_parallel(check, checks, workers)


def load_full(
    index: Mapping[str, Any],
    shards: Mapping[str, ShardData],
    *,
    verify: bool = True,
    workers: int | None = None,
    source: str = "snapshot",
) -> dict[str, TensorData]:
    """Read a FULL snapshot's tensors (views into ``shards``, or file regions, in weight-map order).

    With ``verify``, every Adler-32 in the shard ``__metadata__`` is checked (all are
    required when the index says ``checksum_format: adler32``) before returning; file
    regions are read 1 MiB at a time.

    Raises:
        SnapshotError: a delta index, a missing shard, a malformed header.
        SnapshotChecksumError: an Adler-32 does not match.
    """
    tensors, _, _ = _load_full(index, shards, verify=verify, workers=workers, source=source)
    return tensors


def _load_full(
    index: Mapping[str, Any],
    shards: Mapping[str, ShardData],
    *,
    verify: bool,
    workers: int | None,
    source: str,
) -> tuple[dict[str, TensorData], int, int]:
    if is_delta_index(index):
        raise SnapshotError(f"{source}: is a delta (index metadata has delta_encoding), not a FULL snapshot")
    weight_map: Mapping[str, str] = index.get("weight_map") or {}
    if not weight_map:
        raise SnapshotError(f"{source}: the index maps no tensors")
    headers = _shard_headers(index, shards, source)
    tensors, checks, unchecked = _checksum_jobs(index, shards, headers, source)
    if verify:
        _verify_checksums(checks, workers)
    return tensors, len(checks), unchecked


def replay_chain(
    root: Mapping[str, TensorData],
    deltas: Sequence[tuple[Mapping[str, Any], Mapping[str, ShardData]]],
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


# --------------------------------------------------------------------------- directories


@dataclass
class SnapshotDir(Closing):
    """A snapshot directory open for decoding: its index and its shards as file regions.

    Shards are read with ``pread`` through descriptors held until :meth:`close` (use
    it as a context manager); tensors taken from it are valid until then.
    """

    path: Path
    index: dict[str, Any]
    shards: dict[str, ShardData] = field(default_factory=dict)
    index_generated: bool = False
    _fds: list[int] = field(default_factory=list, repr=False)

    def close(self) -> None:
        """Close the shard files."""
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def read_snapshot_dir(path: str | Path) -> SnapshotDir:
    """Read a snapshot directory's index (or generate it for a lone ``model.safetensors``)
    and open its shards read-only (regions read with ``pread``; close the result).

    Raises:
        SnapshotNotFoundError: no directory, no index (and no ``model.safetensors``), or
            a shard named in the index is absent.
        SnapshotError: an invalid index.
    """
    root = Path(path)
    if not root.is_dir():
        raise SnapshotNotFoundError(f"{root}: not a directory")
    index, generated, _ = read_directory_index(root)
    snap = SnapshotDir(root, index, {}, generated is not None)
    try:
        for shard in dict.fromkeys(index["weight_map"].values()):
            shard_path = root / shard
            if not shard_path.is_file():
                raise SnapshotNotFoundError(f"{root}: shard {shard} named in the index is missing")
            fd = os.open(shard_path, os.O_RDONLY)
            snap._fds.append(fd)
            snap.shards[shard] = FileRegion(fd, 0, os.fstat(fd).st_size)
    except BaseException:
        snap.close()
        raise
    return snap


def _in_memory(tensors: Mapping[str, TensorData]) -> dict[str, TensorData]:
    return {
        name: TensorData(t.dtype, t.shape, t.data.read() if isinstance(t.data, FileRegion) else bytes(as_uint8(t.data)))
        for name, t in tensors.items()
    }


def load_full_dir(path: str | Path, *, verify: bool = True, workers: int | None = None) -> dict[str, TensorData]:
    """:func:`load_full` on a directory; the tensors are read into memory (the files are closed)."""
    with read_snapshot_dir(path) as snap:
        tensors = load_full(snap.index, snap.shards, verify=verify, workers=workers, source=str(snap.path))
        return _in_memory(tensors)


def apply_delta_dir(
    base: Mapping[str, TensorData] | str | Path,
    delta: str | Path,
    *,
    base_version: str | None = None,
    workers: int | None = None,
) -> dict[str, TensorData]:
    """:func:`apply_delta` with the delta (and optionally the base) read from directories; the result is in memory.

    ``cwtrain snapshot apply`` streams instead
    (:func:`cwtrain.hotload.delta.write_applied_snapshot`).
    """
    if isinstance(base, (str, Path)):
        base = load_full_dir(base, workers=workers)
    with read_snapshot_dir(delta) as snap:
        result = apply_delta(
            base, snap.index, snap.shards, base_version=base_version, workers=workers, source=str(snap.path)
        )
        return _in_memory(result)


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify_snapshot_dir` checked.

    Attributes:
        path: the directory.
        type: ``"FULL"`` or ``"INCREMENTAL"``.
        tensors: tensors in the snapshot (changed ones for a delta).
        verified: tensors whose Adler-32 was checked.
        unchecked: tensors with no checksum to check (a delta without its base: all).
    """

    path: Path
    type: str
    tensors: int
    verified: int
    unchecked: int


def verify_snapshot_dir(
    path: str | Path,
    *,
    base: str | Path | None = None,
    workers: int | None = None,
    memory_budget: int | None = None,
) -> VerifyReport:
    """Check every checksum a snapshot directory allows, streaming (what ``cwtrain snapshot verify`` does).

    FULL: every Adler-32 in the shard ``__metadata__``. Delta: its index, headers and
    every frame; with ``base`` (a checkpoint directory, its own checksums checked too)
    every Adler-32 of the applied result. Memory: the decoders' budget, whatever the
    sizes; nothing is written.

    Raises:
        SnapshotError: the first problem found, naming the file and the tensor.
    """
    with read_snapshot_dir(path) as snap:
        source = str(snap.path)
        if not is_delta_index(snap.index):
            tensors, verified, unchecked = _load_full(
                snap.index, snap.shards, verify=True, workers=workers, source=source
            )
            return VerifyReport(snap.path, "FULL", len(tensors), verified, unchecked)
        if base is None:
            names = verify_frames(snap.index, snap.shards, workers=workers, source=source, memory_budget=memory_budget)
            return VerifyReport(snap.path, "INCREMENTAL", len(names), 0, len(names))
        with read_snapshot_dir(base) as base_snap:
            base_tensors = load_full(base_snap.index, base_snap.shards, workers=workers, source=str(base_snap.path))
            names = verify_delta(
                base_tensors, snap.index, snap.shards, workers=workers, source=source, memory_budget=memory_budget
            )
        return VerifyReport(snap.path, "INCREMENTAL", len(names), len(names), 0)
