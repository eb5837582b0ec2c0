"""The numpy codec: XOR + zstd + Adler-32 deltas and checksummed FULL snapshots.

Encode (the trainer side)::

    with DeltaEncoder(workers=None, memory_budget=None) as encoder:
        snap = encoder.encode(new, base, version="run-v000002", base_version="run-v000001")
    snap.empty          # no tensor changed: nothing to upload (spec 5.4)
    snap.files          # shards as SnapshotFile (header + one zstd frame per changed tensor)
    snap.index          # model.safetensors.index.json, in the uploaded form (spec 5.2)
    snap.checksums      # Adler-32 of every new tensor (for manifests and FULL cuts)

``new`` and ``base`` are ``Mapping[str, TensorData]`` (raw little-endian bytes in any
bytes-like, or a :class:`FileRegion` of a safetensors file). The encoder XORs each
tensor against its base, skips unchanged ones, and writes one zstd frame (level 1,
content size set, no checksum) per changed tensor. Work runs in a thread pool (numpy,
zstd and Adler-32 release the GIL); at most ``memory_budget`` bytes (default 1 GiB,
``CWTRAIN_HOTLOAD_MEMORY_BUDGET``) of tensors are in flight. Each tensor is read, XORed,
checksummed and fed to a streaming compressor 1 MiB at a time, so no tensor-sized
buffer is ever allocated and each chunk stays in cache between the steps.
Tensors larger than :data:`BIG_TENSOR_BYTES` are compressed with zstd's own worker
threads (still one frame), so one big embedding does not serialise the run. The
output depends only on the input: the same tensors always give the same bytes,
whatever ``workers`` or ``memory_budget``.

``encode_full(tensors)`` writes a FULL snapshot with every tensor's Adler-32 in the
shard ``__metadata__`` (spec 3.3).

Decoding (apply, verify, replay) lives in :mod:`cwtrain.hotload.codec.decode`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Buffer, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

import numpy as np
import zstandard

from cwtrain.closing import Closing
from cwtrain.errors import SnapshotError
from cwtrain.hotload.codec.common import default_workers, memory_budget_from_env
from cwtrain.hotload.codec.stages import Mark, StageStats
from cwtrain.hotload.format.checksum import adler32, checksum_metadata, tensor_adler32
from cwtrain.hotload.format.fileio import pread_into
from cwtrain.hotload.format.index import (
    CHECKSUM_FORMAT,
    COMPRESSION_FORMAT,
    DEFAULT_SHARD_BYTES,
    DELTA_ENCODING,
    INDEX_NAME,
    SINGLE_FILE_NAME,
    SnapshotFile,
    full_shard_name,
    local_index_bytes,
    serialize_index,
    shard_name,
    upload_index_bytes,
)
from cwtrain.hotload.format.safetensors import TensorEntry, dtype_nbytes, encode_header
from cwtrain.hotload.format.tensors import FileRegion, TensorData, U8Array, as_uint8

__all__ = [
    "BIG_TENSOR_BYTES",
    "DeltaEncoder",
    "EncodeStats",
    "EncodedSnapshot",
    "FullOptions",
    "FullSnapshotPlan",
    "ShardSink",
    "TensorResult",
    "check_compatible",
    "delta_shard_header",
]

#: Tensors above this size compress with zstd's worker threads (one frame still).
#: Part of the output definition: changing it changes the bytes of big frames.
BIG_TENSOR_BYTES = 256 << 20
ZSTD_LEVEL = 1
#: Tensors are read, XORed, checksummed and fed to zstd in chunks this size, so each chunk
#: stays in cache between the steps and no tensor-sized buffer is ever allocated.
_CHUNK = 1 << 20
_GROUP_BYTES = 1 << 20
#: Most tasks queued at once (besides the memory budget).
_MAX_PENDING = 1024


TensorSource = Buffer | FileRegion


# ------------------------------------------------------------------------------ encode


@dataclass(frozen=True)
class EncodeStats:
    """Figures of one encode.

    Attributes:
        tensors: tensors compared.
        tensors_changed: tensors with at least one changed byte.
        bytes_total: raw bytes of all new tensors.
        bytes_changed: raw bytes of the changed tensors.
        payload_bytes: compressed bytes written (frames only).
        seconds: wall time of the encode.
    """

    tensors: int
    tensors_changed: int
    bytes_total: int
    bytes_changed: int
    payload_bytes: int
    seconds: float

    @property
    def ratio(self) -> float:
        """``payload_bytes / bytes_total`` (0 for an empty checkpoint)."""
        return self.payload_bytes / self.bytes_total if self.bytes_total else 0.0


@dataclass(frozen=True)
class EncodedSnapshot:
    """An encoded snapshot held in memory.

    Attributes:
        files: the shards, in name order.
        index: ``model.safetensors.index.json`` (uploaded form when both versions were
            given, else the compact local form).
        index_json: the index as a dict (the local form's content).
        changed: names of changed tensors (ascending); every tensor for a FULL.
        checksums: Adler-32 (8 hex) of every new tensor, changed or not.
        empty: no tensor changed (never upload an empty delta).
        stats: figures of the run.
    """

    files: list[SnapshotFile]
    index: SnapshotFile
    index_json: dict[str, Any]
    changed: list[str]
    checksums: dict[str, str]
    empty: bool
    stats: EncodeStats

    @property
    def all_files(self) -> list[SnapshotFile]:
        """Shards, then the index (the upload order)."""
        return [*self.files, self.index]

    @property
    def stored_bytes(self) -> int:
        """Bytes of the shards and the index: what storing it takes (the side files of a FULL aside)."""
        return sum(file.size for file in self.all_files)


@dataclass
class TensorResult:
    """One tensor's encode result: its Adler-32 and, when changed, its frame pieces."""

    name: str
    nbytes: int
    adler: int
    pieces: list[Buffer] | None  # None: unchanged

    @property
    def payload(self) -> int:
        return sum(memoryview(p).nbytes for p in self.pieces or ())


class ShardSink:
    """Receives changed tensors in ascending name order and packs them into shards.

    The default keeps frames in memory and builds :class:`SnapshotFile` objects;
    :mod:`cwtrain.hotload.files.write` subclasses it to stream shards to disk and
    :mod:`cwtrain.hotload.lifecycle.shares` to pack a rank's share. It is core's own seam,
    not an extension point: :mod:`cwtrain.hotload` does not export it, and plug-ins, which
    import core only from package roots (``tests/test_imports.py``), cannot subclass it.
    """

    def __init__(self, shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        if shard_bytes < 1:
            raise ValueError("shard_bytes must be >= 1")
        self.shard_bytes = shard_bytes
        self.shards: list[list[tuple[str, list[Buffer], int]]] = []
        self._size = 0

    def add(self, name: str, pieces: list[Buffer], length: int) -> None:
        """Append one tensor's frame (given as pieces totalling ``length`` bytes)."""
        if not self.shards or (self.shards[-1] and self._size + length > self.shard_bytes):
            if self.shards:
                self.close_shard(len(self.shards) - 1)
            self.shards.append([])
            self._size = 0
        self.shards[-1].append((name, pieces, length))
        self._size += length

    def close_shard(self, position: int) -> None:
        """Called when shard ``position`` is full (its final name is not known yet)."""

    def finish(self, checksums: Mapping[str, int]) -> list[SnapshotFile]:
        """Build the shard files once every tensor is in; ``checksums`` are the Adler-32s."""
        count = len(self.shards)
        files = []
        for position, members in enumerate(self.shards):
            header = _delta_header(members, checksums)
            buffers: list[Buffer] = [header]
            for _, pieces, _ in members:
                buffers.extend(pieces)
            files.append(SnapshotFile(shard_name(position, count), tuple(buffers)))
        return files

    def weight_map(self) -> dict[str, str]:
        """Tensor → shard name, ascending by tensor name."""
        count = len(self.shards)
        return {name: shard_name(i, count) for i, members in enumerate(self.shards) for name, _, _ in members}


def delta_shard_header(members: Sequence[tuple[str, Any, int]], checksums: Mapping[str, int]) -> bytes:
    """The header of a delta shard: ``(name, _, payload length)`` members in order, Adler-32s by name."""
    return _delta_header(members, checksums)


def _delta_header(members: Sequence[tuple[str, Any, int]], checksums: Mapping[str, int]) -> bytes:
    entries = []
    offset = 0
    for name, _, length in members:
        entries.append(TensorEntry(name, "U8", (length,), offset, offset + length))
        offset += length
    metadata = {name: f"{checksums[name]:08x}" for name, _, _ in members}
    return encode_header(entries, metadata)


class _ThreadState(threading.local):
    """Per-thread chunk buffers (reused: fresh memory page-faults at ~1 GB/s) and compressor."""

    def __init__(self) -> None:
        self.new_chunk = np.empty(_CHUNK, np.uint8)
        self.old_chunk = np.empty(_CHUNK, np.uint8)
        self.xor_chunk = np.empty(_CHUNK, np.uint8)
        self.zeros: U8Array | None = None
        self.cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, write_checksum=False)

    def zero_chunk(self) -> U8Array:
        if self.zeros is None:
            self.zeros = np.zeros(_CHUNK, np.uint8)
        return self.zeros


def _read(source: TensorSource, offset: int, length: int, scratch: U8Array) -> U8Array:
    if isinstance(source, FileRegion):
        view = scratch[:length]
        pread_into(source.fd, view, source.offset + offset, source=source.source)
        return view
    return as_uint8(source)[offset : offset + length]


class FullOptions(TypedDict, total=False):
    """How :meth:`DeltaEncoder.encode_full` and :meth:`~DeltaEncoder.plan_full` lay out a FULL snapshot.

    Attributes:
        layout: tensor → shard file name; default one ``model.safetensors`` up to
            ``shard_bytes``, else HF-style 1-based ``model-{i:05d}-of-{N:05d}``.
        shard_metadata: ``__metadata__`` entries before the checksums (default
            ``{"format": "pt"}``).
        index_meta: the index ``metadata`` to keep; ``total_size`` and
            ``checksum_format`` are set (appended when new).
        checksums: Adler-32s already known (else computed).
        shard_entries: exact header entries per shard (header order and data offsets of
            a source checkpoint, so the bytes equal a rewrite of it); the layout is taken
            from them.
        shard_metadata_by_shard: ``__metadata__`` per shard, overriding ``shard_metadata``.
    """

    layout: Mapping[str, str] | None
    shard_metadata: Mapping[str, str] | None
    index_meta: Mapping[str, Any] | None
    checksums: Mapping[str, str] | None
    shard_entries: Mapping[str, Sequence[TensorEntry]] | None
    shard_metadata_by_shard: Mapping[str, Mapping[str, str]] | None


class DeltaEncoder(Closing):
    """Encodes XOR deltas (and checksummed FULL snapshots) from tensors in memory or files.

    Args:
        workers: threads (default: the CPUs available).
        memory_budget: bytes of tensors in flight (default ``CWTRAIN_HOTLOAD_MEMORY_BUDGET``,
            1 GiB); at least one tensor is always in flight.
        shard_bytes: a shard is closed before its payload would pass this (default 2 GiB).

    Use as a context manager, or call :meth:`close`; the thread pool and its buffers are
    reused across calls.
    """

    def __init__(
        self,
        *,
        workers: int | None = None,
        memory_budget: int | None = None,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
    ) -> None:
        self.workers = workers if workers is not None else default_workers()
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        self.memory_budget = memory_budget if memory_budget is not None else memory_budget_from_env()
        self.shard_bytes = shard_bytes
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._state = _ThreadState()
        # One big tensor at a time: each already uses every core through zstd's threads.
        self._big_lock = threading.Lock()

    def close(self) -> None:
        """Stop the thread pool."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    @property
    def pool(self) -> ThreadPoolExecutor:
        """The encoder's thread pool (started on first use)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="cwtrain-codec")
            return self._pool

    # -- public API

    def encode(
        self,
        new: Mapping[str, TensorData],
        base: Mapping[str, TensorData],
        *,
        version: str | None = None,
        base_version: str | None = None,
        sink: ShardSink | None = None,
        on_progress: Callable[[int], None] | None = None,
        stats: StageStats | None = None,
    ) -> EncodedSnapshot:
        """Encode the delta from ``base`` to ``new``.

        Args:
            new: the new tensors.
            base: what is served (same names, dtypes and shapes).
            version: the new version or identity (index ``metadata.version``).
            base_version: the predecessor's version or identity.
            sink: where shards go (default: memory).
            on_progress: called with raw bytes done as tensors finish.
            stats: where to record the ``read``, ``xor``, ``adler`` and ``zstd`` stages
                (:mod:`cwtrain.hotload.codec.stages`); nothing is measured without it.

        Raises:
            SnapshotError: tensor sets, dtypes, shapes or sizes differ (publish FULL).
        """
        start = time.perf_counter()
        names = check_compatible(new, base)

        def task(name: str) -> TensorResult:
            return self._encode_one(name, new[name], base[name], stats)

        results = self._ordered(names, task, lambda name: new[name].nbytes)
        return self.assemble(
            results, start=start, version=version, base_version=base_version, sink=sink, on_progress=on_progress
        )

    def assemble(
        self,
        results: Iterator[TensorResult],
        *,
        start: float,
        version: str | None = None,
        base_version: str | None = None,
        sink: ShardSink | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> EncodedSnapshot:
        """Pack per-tensor results (ascending names) into shards and the index.

        Shared by the numpy path and :mod:`cwtrain.hotload.codec.device`, so both give the same bytes.
        """
        sink = sink if sink is not None else ShardSink(self.shard_bytes)
        checksums: dict[str, int] = {}
        changed: list[str] = []
        total = changed_bytes = payload = count = 0
        for result in results:
            count += 1
            checksums[result.name] = result.adler
            total += result.nbytes
            if result.pieces is not None:
                length = result.payload
                sink.add(result.name, result.pieces, length)
                changed.append(result.name)
                changed_bytes += result.nbytes
                payload += length
            if on_progress is not None:
                on_progress(result.nbytes)
        files = sink.finish(checksums)
        metadata: dict[str, Any] = {}
        if version is not None:
            metadata["version"] = version
        if base_version is not None:
            metadata["base_version"] = base_version
        metadata.update(
            delta_encoding=DELTA_ENCODING, compression_format=COMPRESSION_FORMAT, checksum_format=CHECKSUM_FORMAT
        )
        index_json = {"metadata": metadata, "weight_map": sink.weight_map()}
        if version is not None and base_version is not None:
            index_bytes = upload_index_bytes(index_json, version=version, base_version=base_version)
        else:
            index_bytes = local_index_bytes(index_json)
        stats = EncodeStats(count, len(changed), total, changed_bytes, payload, time.perf_counter() - start)
        return EncodedSnapshot(
            files=files,
            index=SnapshotFile.from_bytes(INDEX_NAME, index_bytes),
            index_json=index_json,
            changed=changed,
            checksums={name: f"{value:08x}" for name, value in checksums.items()},
            empty=not changed,
            stats=stats,
        )

    def compress_xor(self, xor: U8Array) -> list[Buffer]:
        """One zstd frame of a whole XOR buffer, by the same rule as :meth:`encode`.

        Thread-safe; run it in :attr:`pool`. The buffer is fed to a streaming compressor
        in chunks, as :meth:`encode` does, so both give the same bytes.
        """
        n = xor.size
        with self._turn(n):
            compressor = self._compressor(n)
            pieces: list[Buffer] = []
            for offset in range(0, n, _CHUNK):
                _append(pieces, compressor.compress(memoryview(xor[offset : offset + _CHUNK])))
            _append(pieces, compressor.flush())
            return pieces

    def _turn(self, n: int) -> contextlib.AbstractContextManager[object]:
        """Held while an ``n``-byte tensor compresses: one big tensor at a time (each uses every core)."""
        return self._big_lock if n > BIG_TENSOR_BYTES else contextlib.nullcontext()

    def _compressor(self, n: int) -> Any:
        """The streaming compressor of one ``n``-byte frame: zstd's threads above :data:`BIG_TENSOR_BYTES`."""
        if n > BIG_TENSOR_BYTES:
            return zstandard.ZstdCompressor(
                level=ZSTD_LEVEL, write_content_size=True, write_checksum=False, threads=self.workers
            ).compressobj(size=n)
        return self._state.cctx.compressobj(size=n)

    def checksums(self, tensors: Mapping[str, TensorData], *, stats: StageStats | None = None) -> dict[str, str]:
        """Adler-32 (8 hex) of every tensor, computed in the thread pool (``stats``: the ``adler`` stage)."""
        names = sorted(tensors)
        out: dict[str, str] = {}

        def task(name: str) -> TensorResult:
            tensor = tensors[name]
            mark = stats.clock() if stats is not None else (0.0, 0.0)
            value = tensor_adler32(tensor.data, self._state.new_chunk)
            if stats is not None:
                stats.lap("adler", tensor.nbytes, mark)
            return TensorResult(name, tensor.nbytes, value, None)

        for result in self._ordered(names, task, lambda name: min(tensors[name].nbytes, _CHUNK)):
            out[result.name] = f"{result.adler:08x}"
        return {name: out[name] for name in tensors}

    def encode_full(self, tensors: Mapping[str, TensorData], **options: Unpack[FullOptions]) -> EncodedSnapshot:
        """A FULL snapshot with checksums (spec 3.3) from tensors in memory.

        Args:
            tensors: the weights, in the order they are written.
            **options: the layout and metadata, as :class:`FullOptions` describes.

        Raises:
            SnapshotError: a tensor without a shard, or one that does not match its entry.
        """
        start = time.perf_counter()
        plan = self.plan_full(tensors, **options)
        if options.get("checksums") is None:
            plan.checksums.update(self.checksums(tensors))  # one pool run over every tensor
        files = [plan.build(shard) for shard in plan.shards]
        return plan.snapshot(files, seconds=time.perf_counter() - start)

    def plan_full(
        self, tensors: Mapping[str, TensorData], *, stats: StageStats | None = None, **options: Unpack[FullOptions]
    ) -> FullSnapshotPlan:
        """The streaming form of :meth:`encode_full` (same arguments, same bytes).

        The layout, every header entry and the index are fixed (and checked) here,
        before any tensor byte is read; :meth:`FullSnapshotPlan.build` then makes one
        shard at a time, computing only its tensors' Adler-32s, so a caller can upload
        shard k while shard k+1 is checksummed::

            plan = encoder.plan_full(tensors)
            with store.open_upload(identity) as upload:
                for shard in plan.shards:
                    upload.add(plan.build(shard))
                upload.commit(plan.index)

        Raises:
            SnapshotError: a tensor without a shard, or one that does not match its entry.
        """
        return FullSnapshotPlan(self, tensors, stats=stats, **options)

    # -- machinery

    def _ordered(
        self, names: Sequence[str], task: Callable[[str], TensorResult], cost: Callable[[str], int]
    ) -> Iterator[TensorResult]:
        """Run ``task`` over ``names`` in the pool; yield results in order, within the budget.

        Consecutive small tensors go to the pool together (at least :data:`_GROUP_BYTES`
        per task), so norms and biases do not pay one task each. Only the budget (and a
        generous task count) limits what is queued: a short queue stalls behind a big
        tensor at its head and leaves the other workers idle.
        """

        def run(group: list[str]) -> list[TensorResult]:
            return [task(name) for name in group]

        pending: deque[tuple[Future[list[TensorResult]], int]] = deque()
        in_flight = 0
        try:
            for group, weight in _groups(names, cost):
                while pending and (in_flight + weight > self.memory_budget or len(pending) >= _MAX_PENDING):
                    future, held = pending.popleft()
                    in_flight -= held
                    yield from future.result()
                pending.append((self.pool.submit(run, group), weight))
                in_flight += weight
            while pending:
                future, held = pending.popleft()
                yield from future.result()
        finally:
            for future, _ in pending:
                future.cancel()
            for future, _ in pending:
                if not future.cancelled():
                    future.exception()

    def _encode_one(self, name: str, new: TensorData, old: TensorData, stats: StageStats | None) -> TensorResult:
        n = new.nbytes
        with self._turn(n):
            return self._stream(name, new.data, old.data, n, stats)

    def _stream(
        self, name: str, new: TensorSource, old: TensorSource, n: int, stats: StageStats | None = None
    ) -> TensorResult:
        """Read, XOR, checksum and compress one tensor chunk by chunk (each chunk stays in cache).

        The compressor starts at the first chunk with a set bit (the zero chunks before it
        are fed then, as zeros), so an unchanged tensor costs no compression at all and
        needs no second pass to be detected. zstd's streaming output does not depend on
        how the input is cut, so this gives the bytes :meth:`compress_xor` gives. With
        ``stats``, each step of each chunk is timed where it runs.
        """
        state = self._state
        compressor: Any = None
        pieces: list[Buffer] = []
        zero_prefix = 0
        value = 1
        mark: Mark = stats.clock() if stats is not None else (0.0, 0.0)
        for offset in range(0, n, _CHUNK):
            length = min(_CHUNK, n - offset)
            a = _read(new, offset, length, state.new_chunk)
            if stats is not None:
                mark = stats.lap("read", length, mark)
            value = adler32(a, value)  # the chunk is still in cache
            if stats is not None:
                mark = stats.lap("adler", length, mark)
            b = _read(old, offset, length, state.old_chunk)
            xor = state.xor_chunk[:length]
            if stats is not None:
                mark = stats.lap("read", 0, mark)
            _xor_into(a, b, xor)
            fed = length
            if compressor is None:
                if not _any(xor):
                    if stats is not None:
                        mark = stats.lap("xor", length, mark)
                    zero_prefix += length
                    continue
                if stats is not None:
                    mark = stats.lap("xor", length, mark)
                compressor = self._compressor(n)
                zeros = state.zero_chunk()
                for start in range(0, zero_prefix, _CHUNK):
                    _append(pieces, compressor.compress(zeros[: min(_CHUNK, zero_prefix - start)]))
                fed += zero_prefix
            elif stats is not None:
                mark = stats.lap("xor", length, mark)
            _append(pieces, compressor.compress(xor))
            if stats is not None:
                mark = stats.lap("zstd", fed, mark)
        if compressor is None:
            return TensorResult(name, n, value, None)
        _append(pieces, compressor.flush())
        if stats is not None:
            stats.lap("zstd", 0, mark)
        return TensorResult(name, n, value, pieces)


class FullSnapshotPlan:
    """A FULL snapshot laid out but not yet built: shard names, header entries and the index.

    Made by :meth:`DeltaEncoder.plan_full`. :attr:`shards` lists the shard names in
    upload order; :meth:`build` returns one shard (checksumming the tensors whose
    Adler-32 is not known yet); :attr:`index` does not depend on any checksum.
    """

    def __init__(
        self,
        encoder: DeltaEncoder,
        tensors: Mapping[str, TensorData],
        *,
        stats: StageStats | None = None,
        **options: Unpack[FullOptions],
    ) -> None:
        layout = options.get("layout")
        shard_metadata = options.get("shard_metadata")
        index_meta = options.get("index_meta")
        checksums = options.get("checksums")
        shard_entries = options.get("shard_entries")
        shard_metadata_by_shard = options.get("shard_metadata_by_shard")
        self._encoder = encoder
        self._tensors = tensors
        self._stats = stats
        #: Adler-32s (8 hex) known so far: given ones, then each built shard's.
        self.checksums: dict[str, str] = dict(checksums) if checksums is not None else {}
        if shard_entries is not None:
            layout = {entry.name: shard for shard, entries in shard_entries.items() for entry in entries}
        if layout is None:
            layout = _default_layout(tensors, encoder.shard_bytes)
        groups: dict[str, list[str]] = {}
        for name in tensors:
            shard = layout.get(name)
            if shard is None:
                raise SnapshotError(f"tensor {name!r} has no shard in the layout")
            groups.setdefault(shard, []).append(name)
        self._entries: dict[str, list[TensorEntry]] = {}
        self._meta: dict[str, dict[str, str]] = {}
        for shard, members in groups.items():
            entries: list[TensorEntry] = []
            if shard_entries is not None:
                entries = list(shard_entries[shard])
                for entry in entries:
                    t = tensors[entry.name]
                    if (t.dtype, tuple(t.shape), t.nbytes) != (entry.dtype, entry.shape, entry.nbytes):
                        raise SnapshotError(f"tensor {entry.name!r} does not match its header entry in {shard}")
            else:
                offset = 0
                for name in members:
                    t = tensors[name]
                    size = _checked_size(t, f"tensor {name!r}")
                    entries.append(TensorEntry(name, t.dtype, tuple(t.shape), offset, offset + size))
                    offset += size
            self._entries[shard] = entries
            if shard_metadata_by_shard is not None and shard in shard_metadata_by_shard:
                self._meta[shard] = dict(shard_metadata_by_shard[shard])
            else:
                self._meta[shard] = dict(shard_metadata) if shard_metadata is not None else {"format": "pt"}
            # a tensor named like a non-checksum entry ("format") is refused before any byte is read
            checksum_metadata(self._meta[shard], dict.fromkeys((e.name for e in entries), "0" * 8), source=shard)
        #: Shard file names, in the order :meth:`build` should be called (first shard first).
        self.shards: list[str] = list(groups)
        self.total_size = sum(t.nbytes for t in tensors.values())
        metadata = dict(index_meta or {})
        metadata.pop("delta_encoding", None)
        metadata["total_size"] = self.total_size
        metadata["checksum_format"] = CHECKSUM_FORMAT
        #: The index as a dict.
        self.index_json: dict[str, Any] = {"metadata": metadata, "weight_map": {name: layout[name] for name in tensors}}
        #: ``model.safetensors.index.json``.
        self.index = SnapshotFile.from_bytes(INDEX_NAME, serialize_index(self.index_json))

    def build(self, shard: str) -> SnapshotFile:
        """Shard ``shard``: its header (with every member's Adler-32), then the tensor bytes (not copied)."""
        entries = self._entries[shard]
        missing = {e.name: self._tensors[e.name] for e in entries if e.name not in self.checksums}
        if missing:
            self.checksums.update(self._encoder.checksums(missing, stats=self._stats))
        meta = checksum_metadata(self._meta[shard], {e.name: self.checksums[e.name] for e in entries}, source=shard)
        buffers: list[Buffer] = [encode_header(entries, meta)]
        for entry in sorted(entries, key=lambda e: e.begin):
            data = self._tensors[entry.name].data
            if entry.nbytes:
                buffers.append(data.read() if isinstance(data, FileRegion) else data)
        return SnapshotFile(shard, tuple(buffers))

    def snapshot(self, files: Sequence[SnapshotFile], *, seconds: float) -> EncodedSnapshot:
        """The :class:`EncodedSnapshot` of the built ``files`` (every shard built)."""
        total = self.total_size
        count = len(self._tensors)
        return EncodedSnapshot(
            files=sorted(files, key=lambda f: f.name),
            index=self.index,
            index_json=self.index_json,
            changed=list(self._tensors),
            checksums={name: self.checksums[name] for name in self._tensors},
            empty=False,
            stats=EncodeStats(count, count, total, total, total, seconds),
        )


def _xor_into(a: U8Array, b: U8Array, out: U8Array) -> None:
    """``out = a ^ b``, eight bytes at a time when the length allows it."""
    if a.size % 8 == 0:
        np.bitwise_xor(a.view(np.uint64), b.view(np.uint64), out=out.view(np.uint64))
    else:
        np.bitwise_xor(a, b, out=out)


def _any(data: U8Array) -> bool:
    """Whether any bit is set (eight bytes at a time when the length allows it)."""
    return bool(data.view(np.uint64).any() if data.size % 8 == 0 else data.any())


def _groups(names: Sequence[str], cost: Callable[[str], int]) -> Iterator[tuple[list[str], int]]:
    group: list[str] = []
    weight = 0
    for name in names:
        size = max(1, min(cost(name), BIG_TENSOR_BYTES))
        if group and (weight >= _GROUP_BYTES or size >= _GROUP_BYTES):
            yield group, weight
            group, weight = [], 0
        group.append(name)
        weight += size
    if group:
        yield group, weight


def _append(pieces: list[Buffer], chunk: bytes) -> None:
    if chunk:
        pieces.append(chunk)


def _checked_size(tensor: TensorData, where: str) -> int:
    size = dtype_nbytes(tensor.dtype, tensor.shape, where=where)
    if size != tensor.nbytes:
        raise SnapshotError(
            f"{where}: {tensor.dtype} {list(tensor.shape)} needs {size} bytes, data has {tensor.nbytes}"
        )
    return size


def check_compatible(new: Mapping[str, TensorData], base: Mapping[str, TensorData]) -> list[str]:
    """Sorted tensor names, after checking both sides hold the same tensors.

    Raises:
        SnapshotError: a tensor is missing on one side, or its dtype, shape or size
            differs (a delta cannot express that; publish a FULL snapshot).
    """
    missing = sorted(set(base) - set(new))
    extra = sorted(set(new) - set(base))
    if missing or extra:
        parts = []
        if extra:
            parts.append(f"new tensors not in the base: {', '.join(extra[:5])}")
        if missing:
            parts.append(f"base tensors missing from the new weights: {', '.join(missing[:5])}")
        raise SnapshotError("tensor sets differ (" + "; ".join(parts) + "); publish a FULL snapshot instead")
    names = sorted(new)
    for name in names:
        a, b = new[name], base[name]
        if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
            raise SnapshotError(
                f"tensor {name!r} changed from {b.dtype} {list(b.shape)} to {a.dtype} {list(a.shape)}; "
                "a delta cannot change dtypes or shapes: publish a FULL snapshot instead"
            )
        _checked_size(a, f"new tensor {name!r}")
        _checked_size(b, f"base tensor {name!r}")
    return names


def _default_layout(tensors: Mapping[str, TensorData], shard_bytes: int) -> dict[str, str]:
    groups: list[list[str]] = [[]]
    size = 0
    for name, tensor in tensors.items():
        if groups[-1] and size + tensor.nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += tensor.nbytes
    if len(groups) == 1:
        return dict.fromkeys(tensors, SINGLE_FILE_NAME)
    count = len(groups)
    return {name: full_shard_name(i, count) for i, group in enumerate(groups) for name in group}
