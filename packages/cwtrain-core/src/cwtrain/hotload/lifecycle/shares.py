"""What crosses between the ranks of a distributed publish and the committing process; the commit.

At scale every trainer rank encodes and uploads the tensors it holds, and one process (rank 0,
or a driver) writes the index over every rank's shards and runs the version's cycle. The
sequence is :mod:`cwtrain.hotload.lifecycle.protocol`'s; one rank's side of it is
:class:`~cwtrain.hotload.lifecycle.rank.RankShare`. This module holds what travels between
them, and the commit:

* :class:`SharePlan`: what one version asks of every rank (picklable: it travels to Ray
  workers or over a process group); :class:`ShareResult`: what a rank reports back of a step
  (its shard bytes and file count, its tensors' checksums, or its error);
  :class:`EncodedShare`: a rank's encoded share between the steps.
* Shard names, agreed with nothing staged: :func:`layout_by_sizes` fixes them from the tensor
  sizes every rank knows before anything is encoded (NeMo-RL's gathering generators yield
  every tensor on every rank); :func:`number_by_counts` numbers each rank's files once the
  ranks' file counts are known (slime's chunks: each rank sees only its own).
* :func:`commit_shares` writes the index last, refusing until every shard it names is stored.

A snapshot is byte-identical to one encoded by a single process from the same tensors with
the same shard layout.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cwtrain.errors import SnapshotError
from cwtrain.hotload.format.index import (
    CHECKSUM_FORMAT,
    DEFAULT_SHARD_BYTES,
    INDEX_NAME,
    SnapshotFile,
    full_shard_name,
    serialize_index,
    shard_name,
    upload_index_bytes,
)
from cwtrain.hotload.store.prefix import SnapshotStore, StoredSnapshot
from cwtrain.infra.enums import SnapshotType

__all__ = [
    "EncodedShare",
    "PlannedVersion",
    "SharePlan",
    "ShareResult",
    "commit_shares",
    "layout_by_sizes",
    "merge_weight_maps",
    "number_by_counts",
]


class PlannedVersion(Protocol):
    """What a share plan takes from a session's version plan (:class:`~cwtrain.hotload.lifecycle.session.VersionPlan`)."""

    @property
    def identity(self) -> str:
        """The new snapshot identity."""
        ...

    @property
    def full(self) -> bool:
        """FULL or delta."""
        ...

    @property
    def previous_identity(self) -> str | None:
        """The predecessor of a delta."""
        ...


@dataclass(frozen=True)
class SharePlan:
    """What one version asks of every rank.

    Attributes:
        identity: the new snapshot identity.
        full: FULL snapshot (with checksums) or XOR delta.
        previous_identity: the predecessor of a delta.
        bucket: the deployment's hot-load bucket.
        path_prefix: the deployment's hot-load path prefix.
        upload_workers: objects uploaded in parallel per rank.
        shard_bytes: payload limit of one shard.

    The cost rule is the committing process's: it weighs the ranks' shard bytes and sends a
    FULL plan for the cut (:func:`~cwtrain.hotload.lifecycle.protocol.publish_shares`).
    """

    identity: str
    full: bool
    previous_identity: str | None
    bucket: str
    path_prefix: str
    upload_workers: int = 8
    shard_bytes: int = DEFAULT_SHARD_BYTES

    @classmethod
    def of(cls, plan: PlannedVersion, store: SnapshotStore, *, upload_workers: int = 8) -> SharePlan:
        """The share plan of a session's version plan, for the deployment's store."""
        return cls(plan.identity, plan.full, plan.previous_identity, store.bucket, store.path_prefix, upload_workers)


@dataclass
class EncodedShare:
    """One rank's encoded share of a version.

    Attributes:
        files: its shard files (final names once numbered).
        weight_map: tensor → shard for the tensors it wrote (the changed ones of a delta).
        checksums: Adler-32 (8 hex) of every tensor it owns, at the new version.
        total_size: raw bytes of the tensors it owns.
        bytes_changed: raw bytes of the tensors it wrote.
        stage_seconds: the encode's wall time.
    """

    files: list[SnapshotFile]
    weight_map: dict[str, str]
    checksums: dict[str, str]
    total_size: int = 0
    bytes_changed: int = 0
    stage_seconds: float = 0.0


@dataclass(frozen=True)
class ShareResult:
    """What one rank reports to the committing process.

    Attributes:
        rank: the rank.
        weight_map: tensor → shard for the tensors it wrote.
        checksums: Adler-32 (8 hex) of every tensor it owns, at the new version.
        total_size: raw bytes of the tensors it owns.
        tensors_changed: tensors it wrote.
        bytes_changed: raw bytes of those tensors.
        payload_bytes: bytes of its shard files.
        wire_bytes: bytes it sent (less than ``payload_bytes`` when a retry found some stored).
        stage_seconds: its encode's wall time.
        upload_seconds: its upload's wall time.
        files: its shard files (for :func:`number_by_counts`).
        error: what went wrong on this rank (``None``: nothing).
    """

    rank: int
    weight_map: dict[str, str] = field(default_factory=dict)
    checksums: dict[str, str] = field(default_factory=dict)
    total_size: int = 0
    tensors_changed: int = 0
    bytes_changed: int = 0
    payload_bytes: int = 0
    wire_bytes: int = 0
    stage_seconds: float = 0.0
    upload_seconds: float = 0.0
    files: int = 0
    error: str | None = None


# ------------------------------------------------------------------------------ shard names


def layout_by_sizes(
    sizes: Sequence[tuple[str, int]], rank: int, world_size: int, *, full: bool, shard_bytes: int = DEFAULT_SHARD_BYTES
) -> dict[str, str]:
    """The shard of every tensor owned by ``rank``, from the sequence every rank sees.

    Tensor ``i`` belongs to rank ``i % world_size``. Each rank gets ``S`` shard slots (enough
    for the largest share at ``shard_bytes`` each); rank ``r`` writes slots ``r*S .. r*S+S-1``
    of ``N = world_size * S`` (HF-style 1-based names for FULL, 0-based delta names). A
    rank whose share did not change writes nothing.

    Args:
        sizes: ``(name, raw bytes)`` in the order every rank uses.
        rank: this rank.
        world_size: number of ranks.
        full: FULL names or delta names.
        shard_bytes: payload limit of one shard.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    shares = [0] * world_size
    for i, (_, nbytes) in enumerate(sizes):
        shares[i % world_size] += nbytes
    slots = max(1, max(math.ceil(share / shard_bytes) for share in shares))
    count = world_size * slots
    mine = sorted((name, nbytes) for i, (name, nbytes) in enumerate(sizes) if i % world_size == rank)
    layout: dict[str, str] = {}
    slot, used = 0, 0
    for name, nbytes in mine:
        if used and used + nbytes > shard_bytes and slot < slots - 1:
            slot, used = slot + 1, 0
        position = rank * slots + slot
        layout[name] = full_shard_name(position, count) if full else shard_name(position, count)
        used += nbytes
    return layout


def number_by_counts(encoded: EncodedShare, counts: Sequence[int], rank: int, *, full: bool) -> EncodedShare:
    """Rename a rank's files to their place among every rank's (``counts``: files per rank, in rank order).

    A world of one keeps the encoder's own names (a lone FULL is ``model.safetensors``).
    """
    if full and len(counts) == 1:
        return encoded
    total, offset = sum(counts), sum(counts[:rank])
    renamed = {
        file.name: (full_shard_name if full else shard_name)(offset + i, total) for i, file in enumerate(encoded.files)
    }
    encoded.files = [SnapshotFile(renamed[f.name], tuple(f.buffers)) for f in encoded.files]
    encoded.weight_map = {name: renamed[shard] for name, shard in encoded.weight_map.items()}
    return encoded


# ------------------------------------------------------------------------------ commit


def merge_weight_maps(maps: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """One weight map from the ranks' maps, sorted by tensor name.

    Raises:
        SnapshotError: a tensor claimed by two ranks.
    """
    merged: dict[str, str] = {}
    for weight_map in maps:
        overlap = set(merged) & set(weight_map)
        if overlap:
            raise SnapshotError(f"tensors published by two ranks: {sorted(overlap)[:3]}")
        merged.update(weight_map)
    return dict(sorted(merged.items()))


def commit_shares(
    store: SnapshotStore,
    identity: str,
    shares: Sequence[ShareResult],
    *,
    full: bool,
    previous_identity: str | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> StoredSnapshot:
    """Write the index of a snapshot whose shards the ranks stored; the side files and the index last.

    Args:
        store: the deployment's snapshot store.
        identity: the snapshot identity.
        shares: every rank's result.
        full: a FULL snapshot (index with ``total_size`` and ``checksum_format``) or a delta
            (the uploaded form of snapshot-format.md §5.2).
        previous_identity: the predecessor (delta).
        extra_files: small files written before the index (``config.json``, tokenizer).

    Returns:
        what was stored; ``empty`` for an empty delta (nothing is written, spec §5.4).

    Raises:
        SnapshotError: a delta without predecessor, shards named in the index not stored,
            or a tensor claimed by two ranks.
        SnapshotConflictError: the identity holds other objects.
    """
    ordered = merge_weight_maps(share.weight_map for share in shares)
    kind = SnapshotType.FULL if full else SnapshotType.INCREMENTAL
    changed = sum(share.tensors_changed for share in shares)
    bytes_changed = sum(share.bytes_changed for share in shares)
    if not ordered and not full:
        return StoredSnapshot(None, kind, tensors_changed=0, bytes_changed=0)
    if full:
        total_size = sum(share.total_size for share in shares)
        metadata = {"total_size": total_size, "checksum_format": CHECKSUM_FORMAT}
        index = serialize_index({"metadata": metadata, "weight_map": ordered})
    else:
        if previous_identity is None:
            raise SnapshotError(f"delta {identity!r} has no predecessor")
        index = upload_index_bytes(
            {"metadata": {}, "weight_map": ordered}, version=identity, base_version=previous_identity
        )
    shards = sorted(set(ordered.values()))
    with store.open_upload(identity, shared_files=shards) as upload:
        for name, data in sorted((extra_files or {}).items()):
            upload.add(SnapshotFile.from_bytes(name, data))
        uri = upload.commit(SnapshotFile.from_bytes(INDEX_NAME, index))
        results = list(upload.results.values())
    payload = sum(share.payload_bytes for share in shares)
    return StoredSnapshot(
        uri,
        kind,
        snapshot_bytes=payload + sum(item.size for item in results),
        wire_bytes=sum(share.wire_bytes for share in shares)
        + sum(item.size for item in results if item.outcome == "uploaded"),
        tensors_changed=changed,
        bytes_changed=bytes_changed,
    )
