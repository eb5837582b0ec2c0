"""Snapshot directories: write a delta between two checkpoints, write checksummed FULL copies.

::

    stats = write_delta("ckpt/v1", "ckpt/v2", "out/v2", version="000002", base_version="000001")
    stats.empty                                  # nothing changed: only an index with {} is written
    write_full_snapshot("ckpt/v2", "full/v2")    # shards with Adler-32s in __metadata__ (spec 3.3)
    checkpoint_checksums("ckpt/v2")              # {"tensor": "097901fd", ...}

Checkpoint directories hold ``model.safetensors.index.json`` and its shards, or a lone
``model.safetensors``. Tensor bytes are read with ``pread`` into reused buffers (never
memory-mapped), so memory stays within the encoder's budget whatever the model size.
Shards of a delta are written as they fill. Output appears atomically: everything is
written into a hidden sibling directory that is renamed into place at the end, so a
failure leaves no partial output. Errors are :class:`~cwtrain.errors.SnapshotError`
naming the file and the tensor.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Buffer, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cwtrain.errors import SnapshotError, SnapshotNotFoundError
from cwtrain.hotload.codec import DeltaEncoder, ShardSink, delta_shard_header
from cwtrain.hotload.format import (
    CHECKSUM_FORMAT,
    DEFAULT_SHARD_BYTES,
    INDEX_NAME,
    SINGLE_FILE_NAME,
    SnapshotFile,
    generated_index_bytes,
    index_metadata,
    is_delta_index,
    local_index_bytes,
    parse_index,
    serialize_index,
    shard_name,
)
from cwtrain.hotload.safetensors import SafetensorsHeader, TensorEntry, encode_header, read_header
from cwtrain.hotload.tensors import FileRegion, TensorData

__all__ = [
    "Checkpoint",
    "DeltaStats",
    "checkpoint_checksums",
    "open_checkpoint",
    "write_delta",
    "write_full_snapshot",
]


@dataclass
class Checkpoint:
    """An open checkpoint directory: index, shard headers and tensors as file regions.

    Attributes:
        path: the directory.
        index: the parsed (or generated) index.
        headers: shard name → header.
        tensors: tensor → :class:`TensorData` whose ``data`` is a :class:`FileRegion`.
        index_generated: the directory had a lone ``model.safetensors`` and no index.
    """

    path: Path
    index: dict[str, Any]
    headers: dict[str, SafetensorsHeader]
    tensors: dict[str, TensorData]
    index_generated: bool
    _fds: dict[str, int]

    def close(self) -> None:
        """Close the shard files."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def shard_fd(self, shard: str) -> int:
        """The open descriptor of a shard."""
        return self._fds[shard]


def refuse_adapter(root: Path) -> None:
    """Refuse a LoRA adapter directory (``adapter_config.json`` without ``model.safetensors``)."""
    if (root / "adapter_config.json").is_file() and not (root / SINGLE_FILE_NAME).is_file():
        raise SnapshotError(
            f"{root}: is a LoRA adapter (adapter_config.json); merge it into the base model first "
            "and publish the merged checkpoint"
        )


def open_checkpoint(path: str | Path, *, allow_delta: bool = False) -> Checkpoint:
    """Open a checkpoint directory and validate its index and every shard header.

    Raises:
        SnapshotNotFoundError: no directory, no index, or a shard named but absent.
        SnapshotError: a LoRA adapter, a delta (unless ``allow_delta``), an invalid
            header, or a shard tensor that the index does not map to that shard.
    """
    root = Path(path)
    if not root.is_dir():
        raise SnapshotNotFoundError(f"{root}: no such checkpoint directory")
    refuse_adapter(root)
    index_path = root / INDEX_NAME
    generated = False
    if index_path.is_file():
        index = parse_index(index_path.read_bytes(), source=str(index_path))
    elif (root / SINGLE_FILE_NAME).is_file():
        index = parse_index(generated_index_bytes(read_header(root / SINGLE_FILE_NAME)), source=str(root))
        generated = True
    else:
        raise SnapshotNotFoundError(f"{root}: no {INDEX_NAME} and no {SINGLE_FILE_NAME}")
    if is_delta_index(index) and not allow_delta:
        raise SnapshotError(f"{root}: is a delta snapshot (index metadata has delta_encoding), not a checkpoint")
    weight_map: dict[str, str] = index["weight_map"]
    if not weight_map and not allow_delta:
        raise SnapshotError(f"{index_path}: weight_map is empty")
    headers: dict[str, SafetensorsHeader] = {}
    fds: dict[str, int] = {}
    try:
        for shard in dict.fromkeys(weight_map.values()):
            shard_path = root / shard
            if not shard_path.is_file():
                raise SnapshotNotFoundError(f"{root}: shard {shard} named in the index is missing")
            headers[shard] = read_header(shard_path)
            fds[shard] = os.open(shard_path, os.O_RDONLY)
        tensors: dict[str, TensorData] = {}
        for shard, header in headers.items():
            for name in header.tensors:
                if weight_map.get(name) != shard:
                    raise SnapshotError(f"{root / shard}: tensor {name!r} is not mapped to this shard by the index")
        for name, shard in weight_map.items():
            entry = headers[shard].tensors.get(name)
            if entry is None:
                raise SnapshotError(f"{root / shard}: tensor {name!r} named in the index is not in the shard")
            region = FileRegion(fds[shard], headers[shard].data_start + entry.begin, entry.nbytes)
            tensors[name] = TensorData(entry.dtype, entry.shape, region)
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return Checkpoint(root, index, headers, tensors, generated, fds)


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


@contextlib.contextmanager
def staged_directory(dest: str | Path) -> Iterator[Path]:
    """A hidden sibling directory that becomes ``dest`` on success and vanishes on failure.

    Raises:
        SnapshotError: ``dest`` exists and is not an empty directory.
    """
    target = Path(dest)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise SnapshotError(f"{target}: already exists and is not empty; choose a new output directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
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
) -> DeltaStats:
    """Write the XOR delta from checkpoint ``base`` to checkpoint ``new`` into ``out``.

    The index metadata holds ``version``, ``base_version`` and the encoding keys (the
    compact local form); an empty delta is an index with ``"weight_map": {}`` and no
    shards (never upload it).

    Raises:
        SnapshotError: a missing or invalid checkpoint, different tensor sets, dtypes or
            shapes (publish FULL instead), or ``out`` already holding files.
    """
    start = time.perf_counter()
    with open_checkpoint(base) as old, open_checkpoint(new) as cur, staged_directory(out) as stage:
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
            metadata = dict(header.metadata or {})
            for entry in kept:
                metadata[entry.name] = known[entry.name]
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
        index_meta: dict[str, Any] = dict(index_metadata(ckpt.index))
        index_meta.pop("delta_encoding", None)
        index_meta["checksum_format"] = CHECKSUM_FORMAT
        if dropped:
            index_meta["total_size"] = sum(ckpt.tensors[n].nbytes for n in keep)
        kept_map = {n: s for n, s in ckpt.index["weight_map"].items() if n in keep_set}
        index = {
            key: index_meta if key == "metadata" else kept_map if key == "weight_map" else value
            for key, value in ckpt.index.items()
        }
        (stage / INDEX_NAME).write_bytes(serialize_index(index))
        for child in sorted(ckpt.path.iterdir()):
            if child.name == INDEX_NAME or child.name.endswith(".safetensors") or not child.is_file():
                continue
            shutil.copyfile(child, stage / child.name)
    return Path(dest)
