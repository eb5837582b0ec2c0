"""The trainer's byte-exact copy of the weights the replicas serve.

XOR deltas only work against exactly the bytes a replica holds (spec section 6), and a
FULL snapshot that cuts a chain must carry exactly the served weights. The mirror is
that copy: seeded from the very files the baseline was published from, advanced only
by applying (and verifying) the deltas that were published.

::

    mirror = WeightMirror.create("hf_checkpoint/", root=None, version="0")   # host memory
    mirror = WeightMirror.create("hf_checkpoint/", "state/mirror")          # on disk
    report = mirror.apply_delta("deltas/weight_v000001")   # verify every Adler-32, then swap
    mirror.advance("000002")                               # an empty delta: same bytes, new version
    mirror.write_full_snapshot("cuts/v000020")             # FULL with checksums (spec 3.3)
    mirror.manifest("run-v000020", deployment_id="...")    # spec 8.1 (serialised by the caller)
    WeightMirror("state/mirror")                           # reopen; recovers an interrupted apply

In host memory a delta is decoded and verified completely, then swapped in; nothing
changes on failure. On disk the mirror is a FULL checkpoint (``weights/``) plus
``state.json`` (version and every tensor's Adler-32). An apply first verifies the
whole delta, then records it in ``journal/`` (a copy of the delta, committed by an
atomic rename) before writing any tensor in place, then updates ``state.json`` and
drops the journal. Opening a mirror whose apply was interrupted finishes it: each
journalled tensor holds either its old bytes (applied now) or its new bytes (kept),
told apart by their Adler-32s; an uncommitted journal is discarded (rolled back).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cwtrain.closing import Closing
from cwtrain.errors import MirrorError, SnapshotError
from cwtrain.hotload.codec.decode import ShardData, apply_delta, apply_payload, shard_header, tensor_data, verify_delta
from cwtrain.hotload.codec.encode import DeltaEncoder, EncodedSnapshot
from cwtrain.hotload.files.checkpoint import SnapshotDirectory, open_checkpoint, open_snapshot_dir, side_files
from cwtrain.hotload.files.write import staged_directory
from cwtrain.hotload.files.write import write_full_snapshot as write_full_from_dir
from cwtrain.hotload.format.checksum import is_checksum, tensor_adler32
from cwtrain.hotload.format.fileio import pread_into
from cwtrain.hotload.format.identity import same_version
from cwtrain.hotload.format.index import (
    CHECKSUM_FORMAT,
    INDEX_NAME,
    SnapshotFile,
    index_metadata,
    is_delta_index,
    serialize_index,
)
from cwtrain.hotload.format.safetensors import TensorEntry
from cwtrain.hotload.format.tensors import FileRegion, TensorData, as_uint8

__all__ = ["DeltaReport", "MirrorError", "WeightMirror"]

log = logging.getLogger(__name__)

_STATE = "state.json"
_WEIGHTS = "weights"
_JOURNAL = "journal"
_JOURNAL_PARTIAL = ".journal.partial"


@dataclass(frozen=True)
class DeltaReport:
    """What applying one delta to the mirror did.

    Attributes:
        version: the mirror's version afterwards.
        base_version: its version before.
        changed: names of the tensors replaced.
        tensors_verified: tensors whose Adler-32 was checked (all changed ones).
        bytes_changed: raw bytes of the changed tensors.
        seconds: wall time.
    """

    version: str
    base_version: str
    changed: tuple[str, ...]
    tensors_verified: int
    bytes_changed: int
    seconds: float

    @property
    def tensors_changed(self) -> int:
        """``len(changed)``."""
        return len(self.changed)


@dataclass
class _Layout:
    """What a FULL written from memory needs: shard entries, shard metadata, index, small files."""

    entries: dict[str, list[TensorEntry]] = field(default_factory=dict)
    shard_metadata: dict[str, dict[str, str]] = field(default_factory=dict)
    index: dict[str, Any] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)


class WeightMirror(Closing):
    """The trainer's byte-exact copy of the served weights, in host memory or on disk.

    Args:
        root: an on-disk mirror to open (recovering an interrupted apply); ``None``
            for an empty in-memory mirror (use :meth:`create`).
        workers: decode and checksum threads.

    Raises:
        MirrorError: ``root`` holds no mirror or an inconsistent one.
    """

    def __init__(self, root: str | Path | None = None, *, workers: int | None = None) -> None:
        self.root = Path(root) if root is not None else None
        self.workers = workers
        self._version = "0"
        self._tensors: dict[str, TensorData] = {}
        self._checksums: dict[str, str] = {}
        self._layout = _Layout()
        self._fds: dict[str, int] = {}
        self._headers: dict[str, Any] = {}
        if self.root is not None:
            self._open_disk()

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(
        cls,
        base: str | Path | Mapping[str, TensorData],
        root: str | Path | None = None,
        *,
        version: str = "0",
        checksums: Mapping[str, str] | None = None,
        workers: int | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> WeightMirror:
        """Seed a mirror from the checkpoint (directory or tensors) that was published.

        Args:
            base: the baseline checkpoint directory, or its tensors (copied).
            root: on-disk location (must not exist or be empty); ``None`` = host memory.
            version: the mirror's version string.
            checksums: Adler-32s already known (else computed).
            workers: threads.
            files: small files (``config.json``, tokenizer, ...) carried into FULL
                snapshots, for a mirror seeded from tensors (a directory's own are kept).
        """
        if root is None:
            mirror = cls(None, workers=workers)
            mirror._seed_memory(base, checksums)
            mirror._layout.files.update(files or {})
            mirror._version = version
            return mirror
        target = Path(root)
        with staged_directory(target) as stage:
            weights = stage / _WEIGHTS
            if isinstance(base, (str, Path)):
                write_full_from_dir(base, weights, checksums, workers=workers)
            else:
                with DeltaEncoder(workers=workers) as encoder:
                    full = encoder.encode_full(base, checksums=checksums)
                weights.mkdir()
                for file in full.all_files:
                    file.write_to(weights / file.name)
            for name, data in (files or {}).items():
                (weights / name).write_bytes(data)
            with open_checkpoint(weights) as ckpt:
                sums = {
                    name: (header.metadata or {})[name] for header in ckpt.headers.values() for name in header.tensors
                }
            _write_json(stage / _STATE, {"version": version, "checksums": sums})
        return cls(target, workers=workers)

    def _seed_memory(self, base: str | Path | Mapping[str, TensorData], checksums: Mapping[str, str] | None) -> None:
        if isinstance(base, (str, Path)):
            with open_checkpoint(base) as ckpt:
                for shard, header in ckpt.headers.items():
                    self._layout.entries[shard] = list(header.tensors.values())
                    self._layout.shard_metadata[shard] = {  # without the tensors' old checksums
                        k: v for k, v in (header.metadata or {}).items() if not (k in header.tensors and is_checksum(v))
                    }
                self._layout.index = ckpt.index
                self._layout.files.update(side_files(ckpt.path))
                for shard, entries in self._layout.entries.items():
                    for entry in entries:
                        data = np.empty(entry.nbytes, np.uint8)
                        region = ckpt.tensors[entry.name].data
                        pread_into(
                            ckpt.shard_fd(shard), data, getattr(region, "offset", 0), source=f"{ckpt.path / shard}"
                        )
                        self._tensors[entry.name] = TensorData(entry.dtype, entry.shape, data)
        else:
            for name, tensor in base.items():
                self._tensors[name] = TensorData(tensor.dtype, tuple(tensor.shape), np.array(as_uint8(tensor.data)))
        known = dict(checksums or {})
        missing = {n: t for n, t in self._tensors.items() if n not in known}
        if missing:
            with DeltaEncoder(workers=self.workers) as encoder:
                known.update(encoder.checksums(missing))
        self._checksums = {name: known[name] for name in self._tensors}

    def _open_disk(self) -> None:
        assert self.root is not None
        if not (self.root / _STATE).is_file() or not (self.root / _WEIGHTS).is_dir():
            raise MirrorError(f"{self.root}: no weight mirror here (state.json and weights/ expected)")
        partial = self.root / _JOURNAL_PARTIAL
        if partial.exists():
            log.warning("%s: discarding an uncommitted apply (rolled back)", self.root)
            shutil.rmtree(partial)
        state = json.loads((self.root / _STATE).read_text())
        self._version = str(state["version"])
        self._checksums = dict(state["checksums"])
        self._reopen_weights()
        if (self.root / _JOURNAL).is_dir():
            self._recover()

    def _reopen_weights(self) -> None:
        assert self.root is not None
        self._close_fds()
        with open_checkpoint(self.root / _WEIGHTS) as ckpt:
            self._headers = dict(ckpt.headers)
            self._tensors = dict(ckpt.tensors)
            paths = {shard: self.root / _WEIGHTS / shard for shard in ckpt.headers}
        self._fds = {shard: os.open(path, os.O_RDWR) for shard, path in paths.items()}
        weight_map = {name: shard for shard, header in self._headers.items() for name in header.tensors}
        for name, tensor in list(self._tensors.items()):
            shard = weight_map[name]
            entry = self._headers[shard].tensors[name]
            region = FileRegion(
                self._fds[shard], self._headers[shard].data_start + entry.begin, entry.nbytes, str(paths[shard])
            )
            self._tensors[name] = TensorData(tensor.dtype, tensor.shape, region)

    def _close_fds(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def close(self) -> None:
        """Release open files (an on-disk mirror)."""
        self._close_fds()

    # -------------------------------------------------------------------- properties

    @property
    def version(self) -> str:
        """The version the mirror holds."""
        return self._version

    @property
    def tensors(self) -> Mapping[str, TensorData]:
        """The weights (read-only views; file regions for an on-disk mirror)."""
        return self._tensors

    @property
    def checksums(self) -> dict[str, str]:
        """Adler-32 (8 hex) of every tensor."""
        return dict(self._checksums)

    @property
    def files(self) -> dict[str, bytes]:
        """The small files (``config.json``, tokenizer, ...) a FULL snapshot of the mirror carries."""
        if self.root is None:
            return dict(self._layout.files)
        return side_files(self.root / _WEIGHTS)

    @property
    def on_disk(self) -> bool:
        """Whether the mirror lives on disk."""
        return self.root is not None

    # ------------------------------------------------------------------------ apply

    def apply_delta(self, delta_dir: str | Path) -> DeltaReport:
        """Apply and verify a delta directory; the mirror is unchanged on failure.

        Raises:
            MirrorError: the delta's ``base_version`` is not the mirror's version.
            SnapshotError: a bad delta (``SnapshotChecksumError`` for a checksum).
        """
        with open_snapshot_dir(delta_dir) as snap:
            return self._apply(snap.index, snap.shards, source=str(snap.path), snap=snap)

    def apply(self, index: Mapping[str, Any], shards: Mapping[str, ShardData], *, source: str = "delta") -> DeltaReport:
        """Apply a delta given as an index dict and shard bytes (or file regions)."""
        return self._apply(index, shards, source=source)

    def apply_encoded(self, encoded: EncodedSnapshot, *, version: str | None = None) -> DeltaReport:
        """Apply a delta just produced by :class:`~cwtrain.hotload.codec.encode.DeltaEncoder`.

        The frames are decoded and verified like any delta, so the mirror holds what a
        replica computes. ``version`` overrides the index ``metadata.version``.
        """
        index = dict(encoded.index_json)
        if version is not None:
            index["metadata"] = {**index_metadata(index), "version": version}
        shards = {file.name: file.tobytes() for file in encoded.files}
        return self._apply(index, shards, source="encoded delta")

    def _apply(
        self,
        index: Mapping[str, Any],
        shards: Mapping[str, ShardData],
        *,
        source: str,
        snap: SnapshotDirectory | None = None,
    ) -> DeltaReport:
        start = time.perf_counter()
        if not is_delta_index(index):
            raise SnapshotError(f"{source}: not a delta; create a new mirror from a FULL snapshot")
        metadata = index_metadata(index)
        base_version = metadata.get("base_version")
        if base_version is not None and not same_version(str(base_version), self._version):
            raise MirrorError(
                f"{source}: delta is against base_version {base_version!r} but the mirror holds "
                f"version {self._version!r}; apply the deltas in order"
            )
        new_version = str(metadata.get("version", self._version))
        previous = self._version
        if self.root is None:
            updated = apply_delta(self._tensors, index, shards, workers=self.workers, source=source)
            changed = tuple(index["weight_map"])
            sums = self._new_checksums(index, shards)
            self._tensors = updated
            self._checksums.update(sums)
            self._version = new_version
        else:
            changed = self._apply_disk(index, shards, source, new_version, snap)
        return DeltaReport(
            version=self._version,
            base_version=previous,
            changed=changed,
            tensors_verified=len(changed),
            bytes_changed=sum(self._tensors[n].nbytes for n in changed),
            seconds=time.perf_counter() - start,
        )

    @staticmethod
    def _new_checksums(index: Mapping[str, Any], shards: Mapping[str, ShardData]) -> dict[str, str]:
        sums: dict[str, str] = {}
        for shard in dict.fromkeys(index["weight_map"].values()):
            header = shard_header(shards[shard], source=shard)
            for name in header.tensors:
                sums[name] = (header.metadata or {})[name]
        return sums

    def _apply_disk(
        self,
        index: Mapping[str, Any],
        shards: Mapping[str, ShardData],
        source: str,
        new_version: str,
        snap: SnapshotDirectory | None,
    ) -> tuple[str, ...]:
        assert self.root is not None
        # 1. verify everything without touching the weights (nothing kept: memory stays small)
        verify_delta(self._tensors, index, shards, workers=self.workers, source=source)
        sums = self._new_checksums(index, shards)
        # 2. commit the intent: a copy of the delta and the target version
        partial = self.root / _JOURNAL_PARTIAL
        partial.mkdir()
        for shard in dict.fromkeys(index["weight_map"].values()):
            _write_shard(shards[shard], partial / shard)
        _write_json(partial / INDEX_NAME, dict(index))
        _write_json(partial / "target.json", {"version": new_version, "checksums": sums})
        _fsync_dir(partial)
        os.rename(partial, self.root / _JOURNAL)
        _fsync_dir(self.root)
        # 3. write in place, then finish
        self._recover()
        return tuple(index["weight_map"])

    def _recover(self) -> None:
        """Finish the journalled apply (tensor by tensor, idempotent), then drop the journal."""
        assert self.root is not None
        journal = self.root / _JOURNAL
        with open_snapshot_dir(journal) as snap:
            target = json.loads((journal / "target.json").read_text())
            new_sums: dict[str, str] = target["checksums"]
            self._replay_journal(snap, new_sums)
        for fd in self._fds.values():
            os.fsync(fd)
        checksums = {**self._checksums, **new_sums}
        _write_json(self.root / _STATE, {"version": target["version"], "checksums": checksums})
        shutil.rmtree(journal)
        self._checksums = checksums
        self._version = str(target["version"])

    def _replay_journal(self, snap: SnapshotDirectory, new_sums: Mapping[str, str]) -> None:
        for name, shard in snap.index["weight_map"].items():
            region = self._tensors[name].data
            current = tensor_adler32(region)
            want = int(new_sums[name], 16)
            if current == want:
                continue
            if f"{current:08x}" != self._checksums.get(name):
                raise MirrorError(
                    f"{self.root}: tensor {name!r} holds neither its old nor its new bytes after an "
                    "interrupted apply; recreate the mirror from a FULL snapshot"
                )
            header = shard_header(snap.shards[shard], source=str(snap.path / shard))
            payload = tensor_data(snap.shards[shard], header, header.tensors[name])
            out = apply_payload(region, payload, want, where=f"{snap.path / shard}: tensor {name!r}")
            assert isinstance(region, FileRegion)
            _pwrite_all(region.fd, memoryview(out), region.offset)

    def advance(self, version: str) -> None:
        """Set the version without changing bytes (an empty delta, spec 5.4)."""
        self._version = str(version)
        if self.root is not None:
            _write_json(self.root / _STATE, {"version": self._version, "checksums": self._checksums})

    # ------------------------------------------------------------------------ output

    def manifest(self, identity: str, **extra: Any) -> dict[str, Any]:
        """The manifest of spec 8.1 for the mirror's weights (``extra``: deployment_id, run_id, ...)."""
        body: dict[str, Any] = {
            "checksum_format": CHECKSUM_FORMAT,
            "identity": identity,
            "tensors": dict(sorted(self._checksums.items())),
        }
        body.update(extra)
        return dict(sorted(body.items()))

    def write_full_snapshot(self, dest: str | Path) -> Path:
        """Write the mirror's weights as a FULL snapshot with checksums into ``dest``."""
        if self.root is not None:
            return write_full_from_dir(self.root / _WEIGHTS, dest, self._checksums, workers=self.workers)
        with staged_directory(dest) as stage:
            layout = self._layout
            with DeltaEncoder(workers=self.workers) as encoder:
                full = encoder.encode_full(
                    self._tensors,
                    checksums=self._checksums,
                    shard_entries=layout.entries or None,
                    shard_metadata_by_shard=layout.shard_metadata or None,
                    index_meta=index_metadata(layout.index) if layout.index else None,
                )
            index: dict[str, Any] = full.index_json
            if layout.index:
                metadata = {**index_metadata(layout.index), "checksum_format": CHECKSUM_FORMAT}
                metadata.pop("delta_encoding", None)
                index = {k: (metadata if k == "metadata" else v) for k, v in layout.index.items()}
            for file in full.files:
                file.write_to(stage / file.name)
            (stage / INDEX_NAME).write_bytes(serialize_index(index))
            for name, data in layout.files.items():
                (stage / name).write_bytes(data)
        return Path(dest)


def _write_shard(shard: ShardData, path: Path) -> None:
    """A shard's bytes (in memory, or a file region copied 1 MiB at a time) into a new file."""
    if not isinstance(shard, FileRegion):
        SnapshotFile.from_bytes(path.name, shard).write_to(path)
        return
    with open(path, "wb") as out:
        for position in range(0, shard.nbytes, 1 << 20):
            out.write(
                FileRegion(
                    shard.fd, shard.offset + position, min(1 << 20, shard.nbytes - position), shard.source
                ).read()
            )


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < data.nbytes:
        done += os.pwrite(fd, data[done:], offset + done)


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as out:
        json.dump(value, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
