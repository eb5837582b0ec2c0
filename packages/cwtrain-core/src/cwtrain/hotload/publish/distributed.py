"""Distributed publishing: many writers store shards, one commits the index.

At scale every trainer rank encodes and uploads the tensors it holds (with
:meth:`cwtrain.hotload.publish.upload.SnapshotUpload.finish_share`, which writes no index), and
one rank commits the snapshot with :func:`commit_shared_index`: it builds the index from
the ranks' weight maps, checks that every shard the index names is stored, then writes
small side files (``config.json`` for a FULL snapshot) and the index last. The framework
integrations (slime's live-tensor actor, NeMo-RL's policy workers) agree on shard names
their own way and share this commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cwtrain.errors import SnapshotError
from cwtrain.hotload.format.index import CHECKSUM_FORMAT, INDEX_NAME, SnapshotFile, serialize_index, upload_index_bytes
from cwtrain.hotload.publish.upload import SnapshotUpload
from cwtrain.infra.s3 import ObjectStoreLike

__all__ = ["commit_shared_index", "merge_weight_maps"]


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


def commit_shared_index(
    s3: ObjectStoreLike | None,
    *,
    bucket: str,
    identity: str,
    path_prefix: str,
    weight_map: Mapping[str, str],
    full: bool,
    total_size: int = 0,
    previous_identity: str | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> str | None:
    """Write the index of a snapshot whose shards other writers stored; returns its URI.

    Args:
        s3: the object store (or a boto3 client, wrapped); ``None`` builds one from the environment.
        bucket: the hot-load bucket.
        identity: the snapshot identity.
        path_prefix: the hot-load path prefix.
        weight_map: tensor → shard over every rank (see :func:`merge_weight_maps`).
        full: a FULL snapshot (index with ``total_size`` and ``checksum_format``) or a delta
            (the uploaded form of snapshot-format.md §5.2).
        total_size: raw bytes of all tensors (FULL).
        previous_identity: the predecessor (delta).
        extra_files: small files written before the index (``config.json``, tokenizer).

    Returns:
        the ``s3://`` URI, or ``None`` for an empty delta (nothing is written, spec §5.4).

    Raises:
        SnapshotError: a delta without predecessor, or shards named in the index not stored.
        SnapshotConflictError: the identity holds other objects.
    """
    ordered = dict(sorted(weight_map.items()))
    if not ordered and not full:
        return None
    if full:
        metadata = {"total_size": total_size, "checksum_format": CHECKSUM_FORMAT}
        index = serialize_index({"metadata": metadata, "weight_map": ordered})
    else:
        if previous_identity is None:
            raise SnapshotError(f"delta {identity!r} has no predecessor")
        index = upload_index_bytes(
            {"metadata": {}, "weight_map": ordered}, version=identity, base_version=previous_identity
        )
    shards = sorted(set(ordered.values()))
    with SnapshotUpload(s3, bucket=bucket, identity=identity, path_prefix=path_prefix, shared_files=shards) as upload:
        for name, data in sorted((extra_files or {}).items()):
            upload.add(SnapshotFile.from_bytes(name, data))
        return upload.commit(SnapshotFile.from_bytes(INDEX_NAME, index))
