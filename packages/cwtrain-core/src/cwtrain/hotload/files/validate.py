"""Local validation of a snapshot directory before upload (``cwtrain hotload inspect``).

::

    info = inspect_snapshot("ckpt/weight_v000007")          # SnapshotInfo, or SnapshotError
    info.type                                              # "FULL" or "INCREMENTAL"
    info.to_json()                                         # the CLI's snapshot-info shape
    body = delta_index_for_upload(info, "grpo-a-v000007")  # the index bytes to upload

Classification (spec 3.1): INCREMENTAL iff the index ``metadata`` has the key
``delta_encoding``, else FULL. Checks, all before any network use:

- FULL: ``config.json``; an index (or a lone ``model.safetensors``, whose index is
  generated, spec 3.2); a non-empty ``weight_map`` whose shards exist as immediate
  files; every shard header valid and every tensor in it mapped to it; no LoRA
  adapter; no predecessor.
- INCREMENTAL: ``xor``/``zstd``/``adler32`` metadata; shards present and valid; every
  mapped tensor a 1-D ``U8`` payload starting with a zstd frame header with its
  Adler-32 in the shard ``__metadata__``; a predecessor (``previous_identity``, else
  ``identity_for_version(metadata.base_version)``, default spec section 2); an empty
  ``weight_map`` is refused unless ``allow_empty_delta`` (it must never be uploaded).

Every immediate regular file is part of the snapshot; subdirectories are skipped
with a warning. Failures raise :class:`~cwtrain.errors.SnapshotError` naming the file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cwtrain.errors import SnapshotError, SnapshotNotFoundError
from cwtrain.hotload.codec.frames import frame_header
from cwtrain.hotload.files.checkpoint import checked_file_name
from cwtrain.hotload.format.checksum import is_checksum
from cwtrain.hotload.format.dtypes import check_declared_dtype
from cwtrain.hotload.format.identity import identity_for_base_version, validate_identity
from cwtrain.hotload.format.index import (
    INDEX_NAME,
    SINGLE_FILE_NAME,
    check_delta_metadata,
    generated_index_bytes,
    index_metadata,
    is_delta_index,
    read_directory_index,
    upload_index_bytes,
)
from cwtrain.hotload.format.safetensors import check_weight_map, read_header
from cwtrain.jsondoc import load_json

__all__ = ["SnapshotInfo", "delta_index_for_upload", "inspect_snapshot"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotInfo:
    """A validated snapshot directory.

    Attributes:
        path: the directory.
        type: ``"FULL"`` or ``"INCREMENTAL"``.
        files: every immediate regular file, sorted (the objects to upload besides a
            generated index).
        total_bytes: the files' total size (plus a generated index).
        empty_delta: an INCREMENTAL with no changed tensor (never uploaded).
        previous_identity: the predecessor of an INCREMENTAL, else ``None``.
        index: the parsed index.
        index_generated: the index was generated for a lone ``model.safetensors``.
        generated_index: the generated index bytes (``None`` when the directory has one).
        shards: the shard files the index names.
        tensor_bytes: raw bytes of the tensors the snapshot holds (a delta's: its frames'
            content sizes).
    """

    path: Path
    type: str
    files: tuple[Path, ...]
    total_bytes: int
    empty_delta: bool
    previous_identity: str | None
    index: Mapping[str, Any] = field(repr=False)
    index_generated: bool = False
    generated_index: bytes | None = field(default=None, repr=False)
    shards: tuple[str, ...] = ()
    tensor_bytes: int = 0

    @property
    def incremental(self) -> bool:
        """Whether this is a delta."""
        return self.type == "INCREMENTAL"

    @property
    def index_metadata(self) -> dict[str, Any]:
        """The index ``metadata`` object."""
        return index_metadata(self.index)

    def uploaded_index(self, identity: str) -> bytes:
        """The index bytes uploaded under ``identity`` (a checked identity: see :func:`delta_index_for_upload`).

        For a delta: the section 5.2 form with ``version`` = ``identity`` and
        ``base_version`` = the predecessor. For a FULL: the directory's index file as is,
        or the generated index.

        Raises:
            SnapshotError: an empty delta (never uploaded).
        """
        if not self.incremental:
            if self.generated_index is not None:
                return self.generated_index
            return (self.path / INDEX_NAME).read_bytes()
        if self.empty_delta:
            raise SnapshotError(f"{self.path}: empty delta; an empty delta is never uploaded")
        assert self.previous_identity is not None
        return upload_index_bytes(self.index, version=identity, base_version=self.previous_identity)

    def stored_bytes(self, identity: str) -> int:
        """What uploading this directory under ``identity`` stores: its files, the index in its uploaded form."""
        files = sum(path.stat().st_size for path in self.files if path.name != INDEX_NAME)
        return files + len(self.uploaded_index(identity))

    def to_json(self) -> dict[str, Any]:
        """The CLI's snapshot-info shape (interface.md section 1.2)."""
        incremental = None
        if self.incremental:
            incremental = {
                "previous_snapshot_identity": self.previous_identity,
                "compression_format": "ZSTD",
                "checksum_format": "ADLER32",
            }
        return {
            "path": str(self.path),
            "type": self.type,
            "files": [str(f) for f in self.files],
            "total_bytes": self.total_bytes,
            "empty_delta": self.empty_delta,
            "incremental": incremental,
            "index_metadata": dict(self.index_metadata),
            "index_generated": self.index_generated,
        }


def _check_dtypes(root: Path, dtypes: Mapping[str, str]) -> None:
    """A FULL directory's tensors against its ``config.json``: the in-memory path's one rule (a ``DtypeWarning``).

    A ``config.json`` that is not a JSON object declares nothing to compare with (the engine
    reads it; cwtrain only requires that it exists).
    """
    try:
        config = load_json((root / "config.json").read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return
    if isinstance(config, dict):
        check_declared_dtype(dtypes, config, source=str(root))


def _immediate_files(root: Path) -> list[Path]:
    files = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        checked_file_name(root, entry.name)
        if entry.is_dir(follow_symlinks=True):
            log.warning("skipping subdirectory %s (only immediate files are part of a snapshot)", entry.path)
        elif entry.is_file(follow_symlinks=True):
            files.append(root / entry.name)
    return files


def inspect_snapshot(
    path: str | Path,
    *,
    previous_identity: str | None = None,
    identity_for_version: Callable[[str | None], str] = identity_for_base_version,
    allow_empty_delta: bool = False,
) -> SnapshotInfo:
    """Validate a snapshot directory and describe what would be uploaded.

    Args:
        path: the directory.
        previous_identity: predecessor identity of a delta (refused for a FULL).
        identity_for_version: maps a delta's ``metadata.base_version`` to its
            predecessor identity when ``previous_identity`` is not given.
        allow_empty_delta: accept a delta with no changed tensor (reported as
            ``empty_delta``) instead of refusing it.

    Raises:
        SnapshotNotFoundError: no such directory, no index, or a missing shard.
        SnapshotError: anything else the spec refuses (see the module docstring).
    """
    root = Path(path)
    if not root.is_dir():
        raise SnapshotNotFoundError(f"{root}: no such snapshot directory")
    files = _immediate_files(root)
    names = {f.name for f in files}
    if "adapter_config.json" in names and SINGLE_FILE_NAME not in names:
        raise SnapshotError(f"{root}: is a LoRA adapter (adapter_config.json); merge it into the base model first")
    index, lone_header = read_directory_index(root)
    generated = generated_index_bytes(lone_header) if lone_header is not None else None
    known = {SINGLE_FILE_NAME: lone_header} if lone_header is not None else {}
    index_path = root / INDEX_NAME
    weight_map: dict[str, str] = index["weight_map"]
    delta = is_delta_index(index)
    shards = tuple(dict.fromkeys(weight_map.values()))
    for shard in shards:
        if shard not in names:
            raise SnapshotNotFoundError(f"{root}: shard {shard} named in {INDEX_NAME} is missing")
    headers = {shard: known.get(shard) or read_header(root / shard) for shard in shards}
    check_weight_map(str(root), weight_map, headers)
    predecessor: str | None = None
    tensor_bytes = 0
    if delta:
        check_delta_metadata(index_metadata(index), source=str(index_path))
        if not weight_map and not allow_empty_delta:
            raise SnapshotError(
                f"{root}: empty delta (no tensor changed); an empty delta is never uploaded, "
                "publish the next version against the last published one"
            )
        fds = {}
        try:
            for shard in shards:
                fds[shard] = os.open(root / shard, os.O_RDONLY)
            for tensor, shard in weight_map.items():
                tensor_bytes += _check_payload(root / shard, fds[shard], headers[shard], tensor)
        finally:
            for fd in fds.values():
                os.close(fd)
        if previous_identity is None:
            predecessor = identity_for_version(index_metadata(index).get("base_version"))
        else:
            predecessor = previous_identity
        validate_identity(predecessor, what="previous identity", allow_reserved=predecessor == "initial")
    else:
        if previous_identity is not None:
            raise SnapshotError(
                f"{root}: is a FULL snapshot; a previous identity ({previous_identity!r}) applies only to deltas: "
                "publish it without one, or publish only its changes as a delta against the checkpoint "
                f"{previous_identity!r} holds (HotLoader.publish_diff(checkpoint, base, identity, "
                "previous_identity=...), or cwtrain hotload publish --base BASE)"
            )
        if "config.json" not in names:
            raise SnapshotError(f"{root}: a FULL snapshot needs config.json")
        if not weight_map:
            raise SnapshotError(f"{index_path}: weight_map is empty")
        _check_dtypes(root, {tensor: headers[shard].tensors[tensor].dtype for tensor, shard in weight_map.items()})
        tensor_bytes = sum(headers[shard].tensors[tensor].nbytes for tensor, shard in weight_map.items())
    total = sum(f.stat().st_size for f in files) + (len(generated) if generated is not None else 0)
    return SnapshotInfo(
        path=root,
        type="INCREMENTAL" if delta else "FULL",
        files=tuple(files),
        total_bytes=total,
        empty_delta=delta and not weight_map,
        previous_identity=predecessor,
        index=index,
        index_generated=generated is not None,
        generated_index=generated,
        shards=shards,
        tensor_bytes=tensor_bytes,
    )


def _check_payload(shard_path: Path, fd: int, header: Any, tensor: str) -> int:
    """Check one delta payload's header entry, checksum and frame header; returns the tensor's raw bytes."""
    where = f"{shard_path}: tensor {tensor!r}"
    entry = header.tensors[tensor]
    if entry.dtype != "U8" or len(entry.shape) != 1:
        raise SnapshotError(f"{where}: delta payloads must be 1-D U8, got {entry.dtype} {list(entry.shape)}")
    checksum = (header.metadata or {}).get(tensor)
    if checksum is None or not is_checksum(checksum):
        shown = None if checksum is None else checksum[:40]
        raise SnapshotError(f"{where}: needs its Adler-32 as 8 lowercase hex digits in __metadata__, got {shown!r}")
    head = os.pread(fd, min(entry.nbytes, 18), header.data_start + entry.begin)
    try:
        _, content, _ = frame_header(head)
    except ValueError as exc:
        raise SnapshotError(f"{where}: payload is not a zstd frame ({exc})") from None
    if content < 0:
        raise SnapshotError(f"{where}: the zstd frame must carry its content size (Frame_Content_Size)")
    return content


def delta_index_for_upload(info: SnapshotInfo, identity: str) -> bytes:
    """The index bytes to upload for ``info`` under ``identity`` (:meth:`SnapshotInfo.uploaded_index`).

    Raises:
        SnapshotError: an invalid identity, or an empty delta (never uploaded).
    """
    return info.uploaded_index(validate_identity(identity))
