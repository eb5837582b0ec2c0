"""Snapshot directories: write a delta between two checkpoints, write checksummed FULL copies.

::

    stats = write_delta("ckpt/v1", "ckpt/v2", "out/v2", version="000002", base_version="000001")
    stats.empty                                  # nothing changed: only an index with {} is written
    write_full_snapshot("ckpt/v2", "full/v2")    # shards with Adler-32s in __metadata__ (spec 3.3)
    applied = write_applied_snapshot("ckpt/v1", "out/v2", "full/v2")   # the same bytes, from the delta
    checkpoint_checksums("ckpt/v2")              # {"tensor": "097901fd", ...}

Checkpoint directories hold ``model.safetensors.index.json`` and its shards, or a lone
``model.safetensors``. Tensor bytes are read with ``pread`` into reused buffers (never
memory-mapped), so memory stays within the encoder's budget whatever the model size;
:func:`write_applied_snapshot` streams the same way (each tensor decoded 1 MiB at a
time, XORed with the base and written out), within the decoders' budget. Shards of a
delta are written as they fill. Output appears atomically: everything is written into
a hidden sibling directory that is renamed into place at the end, so a failure leaves
no partial output; an output path that cannot be used (a file, a non-empty directory,
a dangling link) is refused before any work starts, and a link to an empty directory
is followed. Errors are :class:`~cwtrain.errors.SnapshotError` naming the file and the
tensor.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Buffer, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cwtrain.errors import SnapshotChecksumError, SnapshotError
from cwtrain.hotload.codec.common import MemoryBudget, run_parallel
from cwtrain.hotload.codec.decode import DeltaTensor, delta_tensors, stream_payload
from cwtrain.hotload.codec.encode import DeltaEncoder, ShardSink, delta_shard_header
from cwtrain.hotload.files.checkpoint import (
    SnapshotDirectory,
    check_checksum_room,
    open_checkpoint,
    open_snapshot_dir,
    side_paths,
)
from cwtrain.hotload.format.checksum import adler32, checksum_metadata, is_checksum
from cwtrain.hotload.format.identity import same_version
from cwtrain.hotload.format.index import (
    CHECKSUM_FORMAT,
    DEFAULT_SHARD_BYTES,
    INDEX_NAME,
    SnapshotFile,
    index_metadata,
    local_index_bytes,
    serialize_index,
    shard_name,
)
from cwtrain.hotload.format.safetensors import SafetensorsHeader, TensorEntry, encode_header
from cwtrain.hotload.format.tensors import FileRegion

__all__ = [
    "AppliedDelta",
    "DeltaStats",
    "checkpoint_checksums",
    "write_applied_snapshot",
    "write_delta",
    "write_full_snapshot",
]


@dataclass(frozen=True)
class DeltaStats:
    """What :func:`write_delta` did.

    Attributes:
        path: the delta directory.
        tensors: tensors compared.
        tensors_changed: tensors written.
        bytes_total: raw bytes of the new checkpoint's tensors.
        bytes_changed: raw bytes of the changed tensors.
        payload_bytes: compressed bytes written.
        shards: shard files written.
        seconds: wall time.
        empty: no tensor changed (the delta is an index with ``{}`` and must not be uploaded).
    """

    path: Path
    tensors: int
    tensors_changed: int
    bytes_total: int
    bytes_changed: int
    payload_bytes: int
    shards: int
    seconds: float
    empty: bool

    @property
    def ratio(self) -> float:
        """Payload as a fraction of the full tensor bytes."""
        return self.payload_bytes / self.bytes_total if self.bytes_total else 0.0

    def to_json(self) -> dict[str, Any]:
        """The CLI summary."""
        return {
            "path": str(self.path),
            "tensors": self.tensors,
            "tensors_changed": self.tensors_changed,
            "bytes_total": self.bytes_total,
            "bytes_changed": self.bytes_changed,
            "payload_bytes": self.payload_bytes,
            "ratio": round(self.ratio, 6),
            "shards": self.shards,
            "empty": self.empty,
            "seconds": round(self.seconds, 3),
        }


class _DiskSink(ShardSink):
    """Streams frames into per-shard data files; headers are prepended when the shard closes."""

    def __init__(self, directory: Path, shard_bytes: int) -> None:
        super().__init__(shard_bytes)
        self.directory = directory
        self._data: list[Path] = []
        self._out: Any = None

    def add(self, name: str, pieces: list[Buffer], length: int) -> None:
        before = len(self.shards)
        super().add(name, [], length)
        if len(self.shards) != before:
            self._open(len(self.shards) - 1)
        for piece in pieces:
            self._out.write(piece)

    def _open(self, position: int) -> None:
        if self._out is not None:
            self._out.close()
        path = self.directory / f".shard-{position:05d}.data"
        self._data.append(path)
        self._out = open(path, "wb")  # noqa: SIM115 - closed when the shard closes

    def finish(self, checksums: Mapping[str, int]) -> list[SnapshotFile]:
        if self._out is not None:
            self._out.close()
            self._out = None
        count = len(self.shards)
        for position, members in enumerate(self.shards):
            header = delta_shard_header(members, checksums)
            target = self.directory / shard_name(position, count)
            with open(target, "wb") as out, open(self._data[position], "rb") as data:
                out.write(header)
                _copy_all(data.fileno(), out)
            self._data[position].unlink()
        return []

    def abort(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


def _copy_all(fd_in: int, out: Any, offset: int = 0, count: int | None = None) -> None:
    """Copy ``count`` bytes (default: to the end) of ``fd_in`` from ``offset`` to ``out``."""
    out.flush()
    fd_out = out.fileno()
    remaining = os.fstat(fd_in).st_size - offset if count is None else count
    while remaining > 0:
        try:
            sent = os.copy_file_range(fd_in, fd_out, remaining, offset)
        except OSError:
            sent = 0
        if sent <= 0:  # not supported here: plain reads
            while remaining > 0:
                block = os.pread(fd_in, min(remaining, 16 << 20), offset)
                if not block:
                    raise SnapshotError(f"unexpected end of file while copying at offset {offset}")
                os.write(fd_out, block)
                offset += len(block)
                remaining -= len(block)
            break
        offset += sent
        remaining -= sent


def usable_output(dest: str | Path) -> Path:
    """The directory an output path names, checked before any work: a new path or an empty directory.

    A symbolic link to an empty directory is followed (the output lands there); a
    link to anything else, a dangling link, a file or a non-empty directory is refused.

    Raises:
        SnapshotError: the path cannot receive the output.
    """
    target = Path(dest)
    if target.is_symlink():
        resolved = target.resolve()
        if not resolved.is_dir():
            raise SnapshotError(
                f"{target}: is a link to {resolved}, which is not a directory; choose an output directory"
            )
        target = resolved
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise SnapshotError(f"{target}: already exists and is not empty; choose a new output directory")
    return target


@contextlib.contextmanager
def staged_directory(dest: str | Path) -> Iterator[Path]:
    """A hidden sibling directory that becomes ``dest`` on success and vanishes on failure.

    ``dest`` is checked first (:func:`usable_output`), so a bad one fails before any work.

    Raises:
        SnapshotError: ``dest`` exists and is not an empty directory (or a link to one).
    """
    target = usable_output(dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    # The name is chosen before the directory exists and the directory made inside the ``try``:
    # an interrupt (Ctrl-C, SIGTERM) that lands just after it is made still removes it
    # (``tempfile.mkdtemp`` could be interrupted between making it and returning its name).
    stage = target.parent / f".{target.name}.{secrets.token_hex(6)}.partial"
    try:
        while True:
            try:
                stage.mkdir(mode=0o700)
                break
            except FileExistsError:
                stage = target.parent / f".{target.name}.{secrets.token_hex(6)}.partial"
        yield stage
        for child in stage.iterdir():
            if child.is_file():
                with open(child, "rb") as handle:
                    os.fsync(handle.fileno())
        if target.exists():
            target.rmdir()
        os.rename(stage, target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def write_delta(
    base: str | Path,
    new: str | Path,
    out: str | Path,
    *,
    version: str,
    base_version: str,
    workers: int | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    memory_budget: int | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
) -> DeltaStats:
    """Write the XOR delta from checkpoint ``base`` to checkpoint ``new`` into ``out``.

    The index metadata holds ``version``, ``base_version`` and the encoding keys (the
    compact local form); an empty delta is an index with ``"weight_map": {}`` and no
    shards (never upload it). ``out`` is checked before the checkpoints are read.
    ``on_total`` gets the new checkpoint's tensor bytes once both are open, then
    ``on_progress`` the bytes of each tensor done.

    Raises:
        SnapshotError: a missing or invalid checkpoint, different tensor sets, dtypes or
            shapes (publish FULL instead), or ``out`` already holding files.
    """
    start = time.perf_counter()
    usable_output(out)
    with open_checkpoint(base) as old, open_checkpoint(new) as cur:
        check_checksum_room(old, why="`snapshot apply` could never apply a delta against it")
        with staged_directory(out) as stage:
            if on_total is not None:
                on_total(sum(t.nbytes for t in cur.tensors.values()))
            sink = _DiskSink(stage, shard_bytes)
            try:
                with DeltaEncoder(workers=workers, memory_budget=memory_budget, shard_bytes=shard_bytes) as encoder:
                    snap = encoder.encode(cur.tensors, old.tensors, sink=sink, on_progress=on_progress)
            except SnapshotError as exc:
                sink.abort()
                raise SnapshotError(f"{old.path} -> {cur.path}: {exc}") from None
            except BaseException:
                sink.abort()
                raise
            index = {
                "metadata": {"version": version, "base_version": base_version, **snap.index_json["metadata"]},
                "weight_map": snap.index_json["weight_map"],
            }
            (stage / INDEX_NAME).write_bytes(local_index_bytes(index))
            stats = snap.stats
    return DeltaStats(
        path=Path(out),
        tensors=stats.tensors,
        tensors_changed=stats.tensors_changed,
        bytes_total=stats.bytes_total,
        bytes_changed=stats.bytes_changed,
        payload_bytes=stats.payload_bytes,
        shards=len(sink.shards),
        seconds=time.perf_counter() - start,
        empty=snap.empty,
    )


def checkpoint_checksums(path: str | Path, *, workers: int | None = None) -> dict[str, str]:
    """Adler-32 (8 lowercase hex) of every tensor of a checkpoint, in index order."""
    with open_checkpoint(path) as ckpt, DeltaEncoder(workers=workers) as encoder:
        return encoder.checksums(ckpt.tensors)


def write_full_snapshot(
    src: str | Path,
    dest: str | Path,
    checksums: Mapping[str, str] | None = None,
    *,
    names: Sequence[str] | None = None,
    workers: int | None = None,
) -> Path:
    """Copy checkpoint ``src`` to ``dest`` as a FULL snapshot with checksums (spec 3.3).

    Shard headers are rewritten (existing ``__metadata__`` first, then one Adler-32 per
    tensor in header order, an existing entry updated in place); tensor bytes are
    copied verbatim. With ``names``, only those tensors are kept and each shard is
    repacked without gaps in source data order (shards left empty are dropped). The
    index keeps the source metadata (minus ``delta_encoding``), sets
    ``checksum_format`` and, when tensors are dropped, ``total_size``; it is written in
    the section 5.2 serialisation. Other immediate files (``config.json``, tokenizer,
    ...) are copied; ``*.safetensors`` files not in the index are not.

    Args:
        src: the checkpoint directory.
        dest: the output directory (must not exist or be empty).
        checksums: Adler-32s already known (e.g. the mirror's); missing ones are computed.
        names: tensors to keep (default: all).

    Returns:
        ``dest``.
    """
    usable_output(dest)
    with open_checkpoint(src) as ckpt, staged_directory(dest) as stage:
        keep = list(ckpt.tensors) if names is None else list(names)
        unknown = [n for n in keep if n not in ckpt.tensors]
        if unknown:
            raise SnapshotError(f"{ckpt.path}: tensors not in the checkpoint: {', '.join(unknown[:5])}")
        keep_set = set(keep)
        dropped = len(keep_set) != len(ckpt.tensors)
        known = dict(checksums or {})
        missing = {n: ckpt.tensors[n] for n in keep if n not in known}
        if missing:
            with DeltaEncoder(workers=workers) as encoder:
                known.update(encoder.checksums(missing))
        weight_map: dict[str, str] = {}
        for shard, header in ckpt.headers.items():
            kept = [e for e in header.tensors.values() if e.name in keep_set]
            if not kept:
                continue
            metadata = checksum_metadata(
                header.metadata, {e.name: known[e.name] for e in kept}, source=str(ckpt.path / shard)
            )
            if dropped:
                entries = []
                offset = 0
                for entry in sorted(kept, key=lambda e: e.begin):
                    entries.append(TensorEntry(entry.name, entry.dtype, entry.shape, offset, offset + entry.nbytes))
                    offset += entry.nbytes
                order = {e.name: i for i, e in enumerate(kept)}
                entries.sort(key=lambda e: order[e.name])
            else:
                entries = list(header.tensors.values())
            with open(stage / shard, "wb") as out:
                out.write(encode_header(entries, metadata))
                fd = ckpt.shard_fd(shard)
                if dropped:
                    for entry in sorted(kept, key=lambda e: e.begin):
                        _copy_all(fd, out, header.data_start + entry.begin, entry.nbytes)
                else:
                    _copy_all(fd, out, header.data_start, header.data_size)
            for entry in kept:
                weight_map[entry.name] = shard
        _write_full_index(ckpt, stage, keep_set if dropped else None)
    return Path(dest)


def _write_full_index(ckpt: SnapshotDirectory, stage: Path, keep: set[str] | None) -> None:
    """The index of a FULL copy (source metadata minus delta_encoding, checksum_format set) and the small files."""
    index_meta: dict[str, Any] = dict(index_metadata(ckpt.index))
    index_meta.pop("delta_encoding", None)
    index_meta["checksum_format"] = CHECKSUM_FORMAT
    if keep is not None:
        index_meta["total_size"] = sum(ckpt.tensors[n].nbytes for n in keep)
    kept_map = {n: s for n, s in ckpt.index["weight_map"].items() if keep is None or n in keep}
    index = {
        key: index_meta if key == "metadata" else kept_map if key == "weight_map" else value
        for key, value in ckpt.index.items()
    }
    (stage / INDEX_NAME).write_bytes(serialize_index(index))
    for child in side_paths(ckpt.path):
        shutil.copyfile(child, stage / child.name)


@dataclass(frozen=True)
class AppliedDelta:
    """What :func:`write_applied_snapshot` did.

    Attributes:
        path: the FULL snapshot written.
        version: the delta's ``metadata.version`` (``None`` when absent).
        base_version: its ``metadata.base_version`` (``None`` when absent).
        changed: the tensors the delta replaced (each one's Adler-32 verified).
        bytes_changed: their raw bytes.
        seconds: wall time.
    """

    path: Path
    version: str | None
    base_version: str | None
    changed: tuple[str, ...]
    bytes_changed: int
    seconds: float


def write_applied_snapshot(
    base: str | Path,
    delta: str | Path,
    out: str | Path,
    *,
    base_version: str | None = None,
    workers: int | None = None,
    memory_budget: int | None = None,
) -> AppliedDelta:
    """Apply delta directory ``delta`` to checkpoint ``base`` and write the result into ``out``.

    The output is the FULL snapshot with checksums that :func:`write_full_snapshot` writes
    of the new checkpoint (same bytes): shard headers with one Adler-32 per tensor, tensor
    data in the base's layout, the base's index metadata and small files. Each changed
    tensor is decoded 1 MiB at a time (XOR with the base, Adler-32 checked against the
    delta), unchanged ones are copied and checksummed (and checked against the base's own
    checksums where it has them). Memory stays within the decoders' budget
    (``memory_budget``, default ``CWTRAIN_HOTLOAD_MEMORY_BUDGET``) whatever the model size;
    nothing appears in ``out`` unless every check passed.

    Args:
        base: the checkpoint the delta was made against.
        delta: the delta directory.
        out: the output directory (must not exist or be empty).
        base_version: when given, the delta's ``metadata.base_version`` must name it
            (the same string, or the same number: ``"1"`` and ``"000001"``).
        workers: threads (default: CPUs).
        memory_budget: bytes the decoders may hold at once.

    Raises:
        SnapshotError: a bad output path, checkpoint or delta, another base version, or a
            frame that does not fit its tensor (``SnapshotChecksumError`` for an Adler-32).
    """
    start = time.perf_counter()
    usable_output(out)
    with open_checkpoint(base) as ckpt, open_snapshot_dir(delta) as snap:
        check_checksum_room(ckpt, why="the applied snapshot could not carry its checksums")
        metadata = index_metadata(snap.index)
        declared = metadata.get("base_version")
        if base_version is not None and not same_version(str(declared), base_version):
            raise SnapshotError(
                f"{snap.path}: delta is against base_version {declared!r}, not {base_version!r}; "
                "apply the deltas in order"
            )
        jobs = delta_tensors(ckpt.tensors, snap.index, snap.shards, source=str(snap.path))
        changed = {job.name: job for job in jobs}
        bytes_changed = sum(ckpt.tensors[name].nbytes for name in changed)
        budget = MemoryBudget(memory_budget)
        with staged_directory(out) as stage:
            for shard, header in ckpt.headers.items():
                _write_applied_shard(ckpt, shard, header, changed, stage / shard, budget, workers)
            _write_full_index(ckpt, stage, None)
    return AppliedDelta(
        path=Path(out),
        version=None if metadata.get("version") is None else str(metadata["version"]),
        base_version=None if declared is None else str(declared),
        changed=tuple(changed),
        bytes_changed=bytes_changed,
        seconds=time.perf_counter() - start,
    )


_COPY_CHUNK = 1 << 20


def _write_applied_shard(
    ckpt: SnapshotDirectory,
    shard: str,
    header: SafetensorsHeader,
    changed: Mapping[str, DeltaTensor],
    path: Path,
    budget: MemoryBudget,
    workers: int | None,
) -> None:
    """One shard of the applied snapshot: a placeholder header, every tensor, then the real header."""
    entries = list(header.tensors.values())
    source = str(ckpt.path / shard)
    placeholder = encode_header(
        entries, checksum_metadata(header.metadata, dict.fromkeys(header.tensors, "00000000"), source=source)
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        data_start = len(placeholder)

        def one(group: list[TensorEntry]) -> list[tuple[str, int]]:
            return [
                (entry.name, _write_tensor(ckpt, shard, header, entry, changed, fd, data_start, budget))
                for entry in group
            ]

        sums: dict[str, str] = {}
        for results in run_parallel(one, _tensor_groups(entries), workers):
            sums.update((name, f"{value:08x}") for name, value in results)
        final = encode_header(
            entries, checksum_metadata(header.metadata, {e.name: sums[e.name] for e in entries}, source=source)
        )
        assert len(final) == data_start
        _pwrite_all(fd, memoryview(final), 0)
        os.ftruncate(fd, data_start + header.data_size)
    finally:
        os.close(fd)


def _tensor_groups(entries: Sequence[TensorEntry]) -> list[list[TensorEntry]]:
    """Entries in groups of at least 1 MiB (one job each), so small tensors do not pay a job each."""
    groups: list[list[TensorEntry]] = [[]]
    weight = 0
    for entry in entries:
        if groups[-1] and weight >= _COPY_CHUNK:
            groups.append([])
            weight = 0
        groups[-1].append(entry)
        weight += entry.nbytes
    return [group for group in groups if group]


def _write_tensor(
    ckpt: SnapshotDirectory,
    shard: str,
    header: SafetensorsHeader,
    entry: TensorEntry,
    changed: Mapping[str, DeltaTensor],
    fd: int,
    data_start: int,
    budget: MemoryBudget,
) -> int:
    """Write one tensor of the applied snapshot at its offset; its Adler-32."""
    region = ckpt.tensors[entry.name].data
    assert isinstance(region, FileRegion)
    out_offset = data_start + entry.begin

    def sink(position: int, chunk: Any) -> None:
        _pwrite_all(fd, memoryview(chunk), out_offset + position)

    job = changed.get(entry.name)
    if job is not None:
        return stream_payload(job.payload, region, expected=job.expected, where=job.where, sink=sink, budget=budget)
    value = 1
    for position in range(0, entry.nbytes, _COPY_CHUNK):
        chunk = FileRegion(
            region.fd, region.offset + position, min(_COPY_CHUNK, entry.nbytes - position), region.source
        ).read()
        value = adler32(chunk, value)
        sink(position, chunk)
    recorded = (header.metadata or {}).get(entry.name)
    if recorded is not None and is_checksum(recorded) and int(recorded, 16) != value:
        raise SnapshotChecksumError(
            f"{ckpt.path / shard}: tensor {entry.name!r}: Adler-32 is {value:08x}, the shard's __metadata__ "
            f"says {recorded} (the base checkpoint is corrupt)"
        )
    return value


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < data.nbytes:
        done += os.pwrite(fd, data[done:], offset + done)
