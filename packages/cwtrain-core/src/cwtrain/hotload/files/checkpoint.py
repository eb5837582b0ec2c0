"""Reading snapshot and checkpoint directories: the one directory opener, and reads built on it.

::

    with open_snapshot_dir("deltas/weight_v000002") as snap:    # index + shard files (pread, never mapped)
        verify_delta(base, snap.index, snap.shards)
    with open_checkpoint("ckpt/v1") as ckpt:                     # + validated headers, tensors as file regions
        ckpt.tensors["lm_head.weight"]                           # TensorData(dtype, shape, FileRegion)
    weights = load_full_dir("ckpt/v1")                           # in memory, every Adler-32 checked
    new = apply_delta_dir("ckpt/v1", "deltas/weight_v000002")    # in memory
    report = verify_snapshot_dir("deltas/weight_v000002", base="ckpt/v1")   # what `snapshot verify` does

A directory holds ``model.safetensors.index.json`` and the shards it names, or a lone
``model.safetensors`` (whose index is generated, snapshot-format.md section 3.2). Shards are
opened read-only and read with ``pread`` through descriptors held until the directory is
closed (use it as a context manager), so a file that shrinks is a ``SnapshotError``, not a
``SIGBUS``. A LoRA adapter directory is refused with the fix.

Every listing of a snapshot or checkpoint directory goes through :func:`directory_files`,
and every file name taken from an index through :func:`checked_file_name`: a name that is
not valid UTF-8 (Linux hands it over as lone surrogates) can be neither an object key nor an
index entry, so it is one ``SnapshotError`` naming the directory and the name's bytes::

    directory_files("ckpt/v1")     # [Path("ckpt/v1/config.json"), ...], sorted by name
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cwtrain.closing import Closing
from cwtrain.errors import SnapshotError, SnapshotNotFoundError
from cwtrain.hotload.codec.decode import (
    apply_delta,
    load_full,
    load_full_checked,
    verify_delta,
    verify_frames,
)
from cwtrain.hotload.format.checksum import is_checksum
from cwtrain.hotload.format.index import INDEX_NAME, SINGLE_FILE_NAME, is_delta_index, read_directory_index
from cwtrain.hotload.format.safetensors import SafetensorsHeader, check_weight_map, read_header_at
from cwtrain.hotload.format.tensors import FileRegion, TensorData, as_uint8

__all__ = [
    "SnapshotDirectory",
    "VerifyReport",
    "apply_delta_dir",
    "check_checksum_room",
    "checked_file_name",
    "directory_files",
    "load_full_dir",
    "open_checkpoint",
    "open_snapshot_dir",
    "refuse_adapter",
    "side_files",
    "side_paths",
    "verify_snapshot_dir",
]


@dataclass
class SnapshotDirectory(Closing):
    """An open snapshot or checkpoint directory.

    Attributes:
        path: the directory.
        index: the parsed index (generated for a lone ``model.safetensors``).
        index_generated: the directory had a lone ``model.safetensors`` and no index.
        shards: every shard the index names, as a region covering the whole file.
        headers: shard name → validated header (:func:`open_checkpoint` only).
        tensors: tensor → :class:`TensorData` whose ``data`` is a :class:`FileRegion`
            (:func:`open_checkpoint` only).
    """

    path: Path
    index: dict[str, Any]
    index_generated: bool = False
    shards: dict[str, FileRegion] = field(default_factory=dict)
    headers: dict[str, SafetensorsHeader] = field(default_factory=dict)
    tensors: dict[str, TensorData] = field(default_factory=dict)

    def close(self) -> None:
        """Close the shard files."""
        shards, self.shards = self.shards, {}
        for region in shards.values():
            os.close(region.fd)

    def shard_fd(self, shard: str) -> int:
        """The open descriptor of a shard."""
        return self.shards[shard].fd


def checked_file_name(directory: str | Path, name: str) -> str:
    """``name``, a file of ``directory``, when it is valid UTF-8; else a one-line ``SnapshotError``.

    Raises:
        SnapshotError: the name holds bytes that are not UTF-8 (or lone surrogates).
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        try:
            raw = os.fsencode(name)  # what the file system holds
        except UnicodeEncodeError:  # a lone surrogate from a JSON escape
            raw = name.encode("utf-8", "surrogatepass")
        shown = os.fsdecode(directory)
        shown = shown if shown.isprintable() and shown.encode("utf-8", "ignore").decode() == shown else ascii(shown)
        raise SnapshotError(
            f"{shown}: the file name {raw!r} is not valid UTF-8; snapshot file names become "
            "object keys and index entries, which are UTF-8: rename the file or move it out of the directory"
        ) from None
    return name


def directory_files(directory: str | Path) -> list[Path]:
    """The regular files directly in ``directory`` (links followed), sorted by name, every name checked.

    Raises:
        SnapshotError: a name that is not valid UTF-8 (:func:`checked_file_name`), even of
            a subdirectory.
    """
    root = Path(directory)
    files = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        checked_file_name(root, entry.name)
        if entry.is_file(follow_symlinks=True):
            files.append(root / entry.name)
    return files


#: Suffixes of weight files, which are never side files.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx")


def side_paths(directory: str | Path) -> list[Path]:
    """The side files of a checkpoint directory: what a FULL snapshot carries besides its weights.

    Every regular file at the top of ``directory`` (``config.json``, ``generation_config.json``,
    the tokenizer's files, a chat template, ...) but weights (``*.safetensors``, ``*.bin``,
    ``*.pt``, ...), weight indexes (``*.index.json``) and hidden files, in name order.

    Raises:
        SnapshotError: a name in ``directory`` that is not valid UTF-8 (:func:`directory_files`).
    """
    return [
        child
        for child in directory_files(directory)
        if not child.name.startswith(".")
        and not child.name.endswith(".index.json")
        and not child.name.endswith(_WEIGHT_SUFFIXES)
    ]


def side_files(directory: str | Path) -> dict[str, bytes]:
    """:func:`side_paths` read: name → bytes."""
    return {child.name: child.read_bytes() for child in side_paths(directory)}


def check_checksum_room(ckpt: SnapshotDirectory, *, why: str) -> None:
    """Refuse a checkpoint one of whose tensors is named like a non-checksum ``__metadata__`` entry of its shard.

    A FULL snapshot with checksums (what ``snapshot apply``, the mirror and every chain cut
    write from this checkpoint's shards) keys each tensor's Adler-32 by its name in the
    shard's ``__metadata__``, beside entries such as ``"format": "pt"`` (snapshot-format.md
    section 3.3): a tensor ``format`` has no room there. ``snapshot diff`` and ``snapshot
    apply`` check the same base, so they refuse the same checkpoints, before any work.

    Raises:
        SnapshotError: naming the shard, the tensors, the entries and ``why`` it matters.
    """
    for shard, header in ckpt.headers.items():
        metadata = header.metadata or {}
        clashes = [name for name in header.tensors if name in metadata and not is_checksum(str(metadata[name]))]
        if clashes:
            shown = ", ".join(
                f"{name!r} (__metadata__ {name!r} = {str(metadata[name])[:40]!r})" for name in clashes[:3]
            )
            raise SnapshotError(
                f"{ckpt.path / shard}: tensors named like the shard's __metadata__ entries: {shown}; {why}: a FULL "
                "snapshot with checksums keys each tensor's Adler-32 by its name in __metadata__, where that entry "
                "already is. Rename the tensors or drop those entries"
            )


def refuse_adapter(root: Path) -> None:
    """Refuse a LoRA adapter directory (``adapter_config.json`` without ``model.safetensors``)."""
    if (root / "adapter_config.json").is_file() and not (root / SINGLE_FILE_NAME).is_file():
        raise SnapshotError(
            f"{root}: is a LoRA adapter (adapter_config.json); merge it into the base model first "
            "and publish the merged checkpoint"
        )


def open_snapshot_dir(path: str | Path) -> SnapshotDirectory:
    """Open a snapshot directory: read its index (or generate it) and open every shard it names.

    Raises:
        SnapshotNotFoundError: no directory, no index (and no ``model.safetensors``), or
            a shard named in the index is absent.
        SnapshotError: a LoRA adapter, or an invalid index.
    """
    root = Path(path)
    if not root.is_dir():
        raise SnapshotNotFoundError(f"{root}: no such directory")
    refuse_adapter(root)
    found = read_directory_index(root)
    opened = SnapshotDirectory(root, found.parsed, found.header is not None)
    try:
        for shard in dict.fromkeys(found.parsed["weight_map"].values()):
            shard_path = root / checked_file_name(root, shard)
            if not shard_path.is_file():
                raise SnapshotNotFoundError(f"{root}: shard {shard} named in the index is missing")
            fd = os.open(shard_path, os.O_RDONLY)
            opened.shards[shard] = FileRegion(fd, 0, os.fstat(fd).st_size, str(shard_path))
        if found.header is not None:
            opened.headers[SINGLE_FILE_NAME] = found.header
    except BaseException:
        opened.close()
        raise
    return opened


def open_checkpoint(path: str | Path, *, allow_delta: bool = False) -> SnapshotDirectory:
    """Open a checkpoint directory and validate its index and every shard header.

    The result's ``tensors`` map each tensor to its bytes in its shard (a file region).

    Raises:
        SnapshotNotFoundError: no directory, no index, or a shard named but absent.
        SnapshotError: a LoRA adapter, a delta (unless ``allow_delta``), an empty weight
            map, an invalid header, or a shard tensor that the index does not map to that shard.
    """
    opened = open_snapshot_dir(path)
    try:
        root, index = opened.path, opened.index
        if is_delta_index(index) and not allow_delta:
            raise SnapshotError(f"{root}: is a delta snapshot (index metadata has delta_encoding), not a checkpoint")
        weight_map: dict[str, str] = index["weight_map"]
        if not weight_map and not allow_delta:
            raise SnapshotError(f"{root / INDEX_NAME}: weight_map is empty")
        for shard, region in opened.shards.items():
            if shard not in opened.headers:
                opened.headers[shard] = read_header_at(region.fd, region.nbytes, source=region.source)
        check_weight_map(str(root), weight_map, opened.headers)
        for name, shard in weight_map.items():
            header, region = opened.headers[shard], opened.shards[shard]
            entry = header.tensors[name]
            opened.tensors[name] = TensorData(
                entry.dtype,
                entry.shape,
                FileRegion(region.fd, header.data_start + entry.begin, entry.nbytes, region.source),
            )
    except BaseException:
        opened.close()
        raise
    return opened


def _in_memory(tensors: Mapping[str, TensorData]) -> dict[str, TensorData]:
    return {
        name: TensorData(t.dtype, t.shape, t.data.read() if isinstance(t.data, FileRegion) else bytes(as_uint8(t.data)))
        for name, t in tensors.items()
    }


def load_full_dir(path: str | Path, *, verify: bool = True, workers: int | None = None) -> dict[str, TensorData]:
    """:func:`load_full` on a directory; the tensors are read into memory (the files are closed)."""
    with open_snapshot_dir(path) as snap:
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
    (:func:`cwtrain.hotload.files.write.write_applied_snapshot`).
    """
    if isinstance(base, (str, Path)):
        base = load_full_dir(base, workers=workers)
    with open_snapshot_dir(delta) as snap:
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
    with open_snapshot_dir(path) as snap:
        source = str(snap.path)
        if not is_delta_index(snap.index):
            tensors, verified, unchecked = load_full_checked(
                snap.index, snap.shards, verify=True, workers=workers, source=source
            )
            return VerifyReport(snap.path, "FULL", len(tensors), verified, unchecked)
        if base is None:
            names = verify_frames(snap.index, snap.shards, workers=workers, source=source, memory_budget=memory_budget)
            return VerifyReport(snap.path, "INCREMENTAL", len(names), 0, len(names))
        with open_snapshot_dir(base) as base_snap:
            base_tensors = load_full(base_snap.index, base_snap.shards, workers=workers, source=str(base_snap.path))
            names = verify_delta(
                base_tensors, snap.index, snap.shards, workers=workers, source=source, memory_budget=memory_budget
            )
        return VerifyReport(snap.path, "INCREMENTAL", len(names), len(names), 0)
