"""Distributed publishing: every rank encodes and uploads its share, one writer commits the index.

NeMo-RL's gathering generators yield every parameter on every rank (they are
collectives), so each rank sees the same ``(name, tensor)`` sequence. Ownership is
decided from that sequence alone, with no extra communication: tensor ``i`` belongs to
rank ``i % world_size``. Shard names are fixed from raw sizes, which every rank knows:
``S`` shard slots per rank (enough for the largest share at 2 GiB each), rank ``r`` writes
slots ``r*S .. r*S+S-1`` of ``N = world_size * S`` (HF-style 1-based names for FULL
snapshots, the 0-based delta names of snapshot-format.md §5.1 for deltas). A rank whose
share did not change writes nothing.

On each rank, :class:`RankPublisher` keeps the served copy of its share where the
tensors live (on the GPU when they are there): deltas XOR against it on the device
(:class:`cwtrain.hotload.codec.device.TorchDeltaEncoder`), only the XOR of changed tensors is
copied to the host, compressed and uploaded with
:meth:`cwtrain.hotload.publish.upload.SnapshotUpload.finish_share` (no index, nothing on disk).
The served copy advances only on :meth:`RankPublisher.commit`, after the hot-load
completed. The driver merges the ranks' :class:`ShareResult` objects and commits the
index last with :func:`commit_index`. :func:`hf_side_files` picks the small files of an HF
checkpoint (config, generation config, tokenizer) that go beside the shards of a FULL
snapshot or an exported checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cwtrain.errors import SnapshotError
from cwtrain.hotload.codec.device import TorchDeltaEncoder, tensor_data
from cwtrain.hotload.codec.encode import ShardSink, delta_shard_header
from cwtrain.hotload.format.index import DEFAULT_SHARD_BYTES, SnapshotFile, full_shard_name, shard_name
from cwtrain.hotload.publish.distributed import commit_shared_index, merge_weight_maps
from cwtrain.hotload.publish.upload import SnapshotUpload
from cwtrain.infra.s3 import ObjectStoreLike

__all__ = ["PublishPlan", "RankPublisher", "ShareResult", "commit_index", "hf_side_files", "owned_layout"]

# Side files that match neither rule of hf_side_files but belong to a tokenizer.
_TOKENIZER_FILES = ("merges.txt",)


def hf_side_files(directory: str | Path) -> dict[str, bytes]:
    """The small files of an HF checkpoint that go beside its shards, by name.

    Every ``*.json`` file but the weight indexes (``*.index.json``, so never
    ``model.safetensors.index.json``), every ``tokenizer*`` file and ``merges.txt``, from
    the top of ``directory``; weights are never included.
    """
    files: dict[str, bytes] = {}
    for item in sorted(Path(directory).iterdir()):
        name = item.name
        json_file = name.endswith(".json") and not name.endswith(".index.json")
        wanted = json_file or name.startswith("tokenizer") or name in _TOKENIZER_FILES
        if wanted and item.is_file():
            files[name] = item.read_bytes()
    return files


@dataclass(frozen=True)
class PublishPlan:
    """What one publish asks of every rank (picklable: it travels to Ray workers).

    Attributes:
        identity: the new snapshot identity.
        full: FULL snapshot (with checksums) or XOR delta.
        previous_identity: the predecessor of a delta.
        bucket: the deployment's hot-load bucket.
        path_prefix: the deployment's hot-load path prefix.
        upload_workers: objects uploaded in parallel per rank.
        shard_bytes: payload limit of one shard.
    """

    identity: str
    full: bool
    previous_identity: str | None
    bucket: str
    path_prefix: str
    upload_workers: int = 8
    shard_bytes: int = DEFAULT_SHARD_BYTES


@dataclass(frozen=True)
class ShareResult:
    """What one rank stored.

    Attributes:
        rank: the rank.
        weight_map: tensor → shard for the tensors it wrote (changed ones for a delta).
        checksums: Adler-32 (8 hex) of every tensor it owns, at the new version.
        total_size: raw bytes of the tensors it owns.
        payload_bytes: bytes it uploaded.
        tensors_changed: tensors written.
    """

    rank: int
    weight_map: dict[str, str]
    checksums: dict[str, str]
    total_size: int
    payload_bytes: int
    tensors_changed: int


def owned_layout(
    sizes: Sequence[tuple[str, int]], rank: int, world_size: int, *, full: bool, shard_bytes: int = DEFAULT_SHARD_BYTES
) -> dict[str, str]:
    """The shard of every tensor owned by ``rank``, from the sequence every rank sees.

    Args:
        sizes: ``(name, raw bytes)`` in generator order (identical on every rank).
        rank: this rank.
        world_size: number of ranks.
        full: HF-style 1-based names (FULL) or 0-based delta names.
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


class _LayoutSink(ShardSink):
    """Packs changed tensors into the shards fixed by :func:`owned_layout`."""

    def __init__(self, layout: Mapping[str, str]) -> None:
        super().__init__()
        self.layout = layout
        self.members: dict[str, list[tuple[str, list[Any], int]]] = {}

    def add(self, name: str, pieces: list[Any], length: int) -> None:
        self.members.setdefault(self.layout[name], []).append((name, pieces, length))

    def finish(self, checksums: Mapping[str, int]) -> list[SnapshotFile]:
        files = []
        for shard in sorted(self.members):
            members = self.members[shard]
            buffers: list[Any] = [delta_shard_header(members, checksums)]
            for _, pieces, _ in members:
                buffers.extend(pieces)
            files.append(SnapshotFile(shard, tuple(buffers)))
        return files

    def weight_map(self) -> dict[str, str]:
        return {name: shard for shard, members in sorted(self.members.items()) for name, _, _ in members}


@dataclass
class RankPublisher:
    """One rank's side of a distributed publish; keeps the served copy of its share.

    Attributes:
        rank: this rank.
        world_size: number of ranks.
        served: the tensors replicas serve (this rank's share), on their device.
    """

    rank: int
    world_size: int
    served: dict[str, torch.Tensor] = field(default_factory=dict)
    _pending: dict[str, torch.Tensor] | None = None

    def publish(
        self, params: Iterable[tuple[str, torch.Tensor]], plan: PublishPlan, s3: ObjectStoreLike | None = None
    ) -> ShareResult:
        """Encode and upload this rank's share of ``params`` (every rank must call it).

        ``params`` is the full ``(name, tensor)`` sequence every rank sees (NeMo-RL's
        gathering generators); tensor ``i`` belongs to rank ``i % world_size``.

        Raises:
            SnapshotError: a delta without a served copy, or tensors that changed shape.
        """
        sizes: list[tuple[str, int]] = []
        owned: dict[str, torch.Tensor] = {}
        for i, (name, tensor) in enumerate(params):
            sizes.append((name, tensor.numel() * tensor.element_size()))
            if i % self.world_size == self.rank:
                owned[name] = tensor.detach().contiguous()
        return self.publish_share(sizes, owned, plan, s3)

    def publish_share(
        self,
        sizes: Sequence[tuple[str, int]],
        owned: Mapping[str, torch.Tensor],
        plan: PublishPlan,
        s3: ObjectStoreLike | None = None,
    ) -> ShareResult:
        """Like :meth:`publish` when the rank already holds only its share.

        Args:
            sizes: ``(name, raw bytes)`` of every tensor of the model, in the order every
                rank uses (``owned`` must be exactly the names at positions ``rank``,
                ``rank + world_size``, ...).
            owned: this rank's tensors.
            plan: the publish.
            s3: the object store, or a boto3 client (default: built from the environment).
        """
        expected = {name for i, (name, _) in enumerate(sizes) if i % self.world_size == self.rank}
        if set(owned) != expected:
            raise SnapshotError(
                f"rank {self.rank}: holds {sorted(owned)[:3]}..., expected its share {sorted(expected)[:3]}..."
            )
        layout = owned_layout(sizes, self.rank, self.world_size, full=plan.full, shard_bytes=plan.shard_bytes)
        with TorchDeltaEncoder(shard_bytes=plan.shard_bytes) as encoder:
            if plan.full:
                tensors = {name: tensor_data(owned[name]) for name in sorted(owned)}
                snap = encoder.encoder.encode_full(tensors, layout=layout) if tensors else None
            else:
                if not self.served or set(self.served) != set(owned):
                    raise SnapshotError(
                        f"rank {self.rank}: no served copy of this share to diff against; publish FULL first"
                    )
                snap = encoder.encode(
                    owned,
                    self.served,
                    version=plan.identity,
                    base_version=plan.previous_identity,
                    sink=_LayoutSink(layout),
                )
            files = [] if snap is None or snap.empty else snap.files
            checksums = dict(snap.checksums) if snap is not None else {}
            if files:
                with SnapshotUpload(
                    s3, bucket=plan.bucket, identity=plan.identity, path_prefix=plan.path_prefix,
                    workers=plan.upload_workers,
                ) as upload:  # fmt: skip
                    for file in files:
                        upload.add(file)
                    upload.finish_share()
        self._pending = {name: tensor.clone() for name, tensor in owned.items()}
        weight_map = {} if snap is None or snap.empty else {n: layout[n] for n in snap.changed}
        return ShareResult(
            rank=self.rank,
            weight_map=weight_map,
            checksums=checksums,
            total_size=sum(t.numel() * t.element_size() for t in owned.values()),
            payload_bytes=sum(f.size for f in files),
            tensors_changed=len(weight_map),
        )

    def commit(self) -> None:
        """The hot-load completed: what was published is now what replicas serve."""
        if self._pending is not None:
            self.served, self._pending = self._pending, None

    def discard(self) -> None:
        """The hot-load failed: keep the previous served copy (the next publish goes FULL)."""
        self._pending = None


def commit_index(
    results: Sequence[ShareResult],
    plan: PublishPlan,
    *,
    s3: ObjectStoreLike | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> str | None:
    """Write the snapshot's index over every rank's shards (and, for FULL, the side files) last.

    Returns:
        the snapshot URI, or ``None`` for an empty delta (nothing written, spec 5.4).
    """
    return commit_shared_index(
        s3,
        bucket=plan.bucket,
        identity=plan.identity,
        path_prefix=plan.path_prefix,
        weight_map=merge_weight_maps(r.weight_map for r in results),
        full=plan.full,
        total_size=sum(r.total_size for r in results),
        previous_identity=plan.previous_identity,
        extra_files=extra_files,
    )
