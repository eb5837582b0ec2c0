"""Decoding snapshots: apply XOR deltas, load FULL snapshots, replay chains, verify everything.

Used by the engine replicas of ``cwtrain-local`` (index dicts and shard bytes fetched
from object storage), by the trainer's mirror and by ``cwtrain snapshot apply|verify``.

::

    new = apply_delta(base, index, shards, base_version="run-v000001")
    full = load_full(index, shards)                     # views into the shard bytes
    weights = replay_chain(full, [(index1, shards1), (index2, shards2)], root_version="run-v000000")

Directories are read by :mod:`cwtrain.hotload.files.checkpoint` (``open_snapshot_dir``,
``load_full_dir``, ``apply_delta_dir``, ``verify_snapshot_dir``).

``index`` is the parsed index dict, ``shards`` maps shard names to their bytes: any
bytes-like, or a :class:`~cwtrain.hotload.format.tensors.FileRegion` of an open file (read with
``pread``, never memory-mapped, so a file that shrinks is a ``SnapshotError``, not a
``SIGBUS``). Tensors given as ``base`` are bytes-likes or file regions too.

Every payload must be exactly one zstd frame whose content size equals the base
tensor's size; :mod:`cwtrain.hotload.codec.frames` checks
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

from collections.abc import Buffer, Mapping, Sequence
from typing import Any, NamedTuple, TypedDict, Unpack

from cwtrain.errors import SnapshotChecksumError, SnapshotError, SnapshotNotFoundError
from cwtrain.hotload.codec.common import MemoryBudget, run_parallel
from cwtrain.hotload.codec.frames import (
    MAX_WINDOW_BYTES,
    apply_payload,
    decode_frame,
    stream_payload,
    zstd_frame_size,
)
from cwtrain.hotload.format.chain import MAX_CHAIN_DELTAS
from cwtrain.hotload.format.checksum import is_checksum, tensor_adler32
from cwtrain.hotload.format.index import (
    CHECKSUM_FORMAT,
    check_delta_metadata,
    index_metadata,
    is_delta_index,
)
from cwtrain.hotload.format.safetensors import (
    SafetensorsHeader,
    TensorEntry,
    check_weight_map,
    header_of_bytes,
    read_header_at,
)
from cwtrain.hotload.format.tensors import FileRegion, TensorData, U8Array, as_uint8

__all__ = [
    "DeltaOptions",
    "DeltaTensor",
    "MAX_WINDOW_BYTES",
    "ShardData",
    "apply_delta",
    "apply_payload",
    "decode_frame",
    "delta_tensors",
    "load_full",
    "load_full_checked",
    "replay_chain",
    "shard_header",
    "stream_payload",
    "tensor_data",
    "verify_delta",
    "verify_frames",
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
        return FileRegion(shard.fd, shard.offset + start, entry.nbytes, shard.source)
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

    results = run_parallel(decode, jobs, options.get("workers"), name="cwtrain-decode")
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

    return run_parallel(check, jobs, options.get("workers"), name="cwtrain-decode")


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

    return run_parallel(check, jobs, workers, name="cwtrain-decode")


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
        actual = tensor_adler32(data)
        if actual != expected:
            raise SnapshotChecksumError(f"{where}: Adler-32 is {actual:08x}, expected {expected:08x}")

    run_parallel(check, checks, workers, name="cwtrain-decode")


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
    tensors, _, _ = load_full_checked(index, shards, verify=verify, workers=workers, source=source)
    return tensors


def load_full_checked(
    index: Mapping[str, Any],
    shards: Mapping[str, ShardData],
    *,
    verify: bool,
    workers: int | None,
    source: str,
) -> tuple[dict[str, TensorData], int, int]:
    """:func:`load_full`, also returning how many tensors had their Adler-32 checked and how many had none.

    Raises:
        SnapshotError: a delta, an empty weight map, or a bad shard (checksum failures as for ``load_full``).
    """
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
