"""One rank's share of a distributed publish: :class:`RankShare`, the share plan, shard names, the commit.

At scale every trainer rank encodes and uploads the tensors it holds, and one process (rank 0,
or a driver) writes the index over every rank's shards and runs the version's cycle. The
sequence every rank goes through is written once, in :mod:`cwtrain.hotload.lifecycle.protocol`
(encode → weigh → cut → store → commit or discard); this module holds a rank's side of each step
and what crosses between the ranks:

* :class:`SharePlan`: what one version asks of every rank (picklable: it travels to Ray
  workers or over a process group).
* :class:`RankShare`: one rank's side, kept for the whole run: the served copy of the tensors
  it owns (in host memory, or on their device), its share of a version encoded chunk by chunk
  (XOR on the device when the tensors are torch tensors; only the XOR of changed tensors
  reaches the host), its shards stored with no index, and the new served copy committed or
  discarded once the hot-load ended. Its steps (:meth:`RankShare.encode_chunks` or
  :meth:`RankShare.encode_owned`, :meth:`RankShare.cut`, :meth:`RankShare.store_encoded`,
  :meth:`RankShare.commit`, :meth:`RankShare.discard`) report to the committing process in a
  :class:`ShareResult` and never raise.
* Shard names, agreed with nothing staged: :func:`layout_by_sizes` fixes them from the tensor
  sizes every rank knows before anything is encoded (NeMo-RL's gathering generators yield
  every tensor on every rank); :func:`number_by_counts` numbers each rank's files once the
  ranks' file counts are known (slime's chunks: each rank sees only its own).
* The cost rule of ``CWTRAIN_HOTLOAD_FULL_EVERY=auto``: the ranks encode their delta shares and
  report their shard bytes; when the committing process cuts the version FULL, every rank
  builds its FULL share from its served copy (:meth:`RankShare.cut`: the new weights are the
  served copy plus the changed tensors; the checksums are the delta encode's), so nothing is
  gathered or encoded twice.
* :func:`commit_shares` writes the index last, refusing until every shard it names is stored.
* :func:`chunked`: ``(name, tensor)`` pairs in chunks of bounded bytes, as trainers gather them.

A snapshot is byte-identical to one encoded by a single process from the same tensors with
the same shard layout.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Buffer, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from cwtrain.errors import SnapshotError
from cwtrain.hotload.codec.encode import DeltaEncoder, ShardSink, delta_shard_header
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
from cwtrain.hotload.format.tensors import FileRegion, TensorData, as_tensor_data
from cwtrain.hotload.store.prefix import SnapshotStore, StoredSnapshot
from cwtrain.hotload.store.snapshot_upload import SnapshotUpload
from cwtrain.infra.enums import SnapshotType
from cwtrain.infra.s3 import ObjectStoreLike

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "Chunk",
    "EncodedShare",
    "PlannedVersion",
    "RankShare",
    "SharePlan",
    "ShareResult",
    "chunked",
    "commit_shares",
    "host_copy",
    "layout_by_sizes",
    "merge_weight_maps",
    "number_by_counts",
]

log = logging.getLogger(__name__)

Chunk = Iterable[tuple[str, Any]]
"""Tensors gathered together, by name (numpy arrays, torch tensors or ``TensorData``)."""

DEFAULT_CHUNK_BYTES = 512 * 1024**2
"""The default bytes of one chunk (slime's and miles' default ``--update-weight-buffer-size``)."""


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

    @property
    def cut_at_bytes(self) -> int | None:
        """A delta of at least this many bytes is published FULL (``None``: no cost rule)."""
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
        cut_at_bytes: a delta whose shards, all ranks together, hold at least this many
            bytes is published FULL instead (``auto``); ``None``: no cost rule.
    """

    identity: str
    full: bool
    previous_identity: str | None
    bucket: str
    path_prefix: str
    upload_workers: int = 8
    shard_bytes: int = DEFAULT_SHARD_BYTES
    cut_at_bytes: int | None = None

    @classmethod
    def of(cls, plan: PlannedVersion, store: SnapshotStore, *, upload_workers: int = 8) -> SharePlan:
        """The share plan of a session's version plan, for the deployment's store."""
        return cls(
            plan.identity, plan.full, plan.previous_identity, store.bucket, store.path_prefix, upload_workers,
            cut_at_bytes=None if plan.full else plan.cut_at_bytes,
        )  # fmt: skip

    def cuts(self, delta_bytes: int) -> bool:
        """Whether a delta of ``delta_bytes`` (every rank's shards) makes this version FULL."""
        return not self.full and self.cut_at_bytes is not None and delta_bytes >= self.cut_at_bytes

    def as_full(self) -> SharePlan:
        """This version as a FULL snapshot."""
        return replace(self, full=True, previous_identity=None, cut_at_bytes=None)


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


# ------------------------------------------------------------------------------ one rank


class _Frames(ShardSink):
    """Keeps the frames of changed tensors across chunks; shards are packed once all are in."""

    def __init__(self, into: list[tuple[str, list[Buffer], int]]) -> None:
        super().__init__()
        self._into = into

    def add(self, name: str, pieces: list[Buffer], length: int) -> None:
        self._into.append((name, pieces, length))


class _LayoutSink(ShardSink):
    """Packs changed tensors into the shards a layout fixed."""

    def __init__(self, layout: Mapping[str, str]) -> None:
        super().__init__()
        self.layout = layout
        self.members: dict[str, list[tuple[str, list[Buffer], int]]] = {}

    def add(self, name: str, pieces: list[Buffer], length: int) -> None:
        self.members.setdefault(self.layout[name], []).append((name, pieces, length))

    def finish(self, checksums: Mapping[str, int]) -> list[SnapshotFile]:
        files = []
        for shard in sorted(self.members):
            members = self.members[shard]
            buffers: list[Buffer] = [delta_shard_header(members, checksums)]
            for _, pieces, _ in members:
                buffers.extend(pieces)
            files.append(SnapshotFile(shard, tuple(buffers)))
        return files

    def weight_map(self) -> dict[str, str]:
        return {name: shard for shard, members in sorted(self.members.items()) for name, _, _ in members}


def _is_torch(tensor: Any) -> bool:
    return type(tensor).__module__.startswith("torch") and hasattr(tensor, "detach")


def _nbytes(tensor: Any) -> int:
    if _is_torch(tensor):
        return int(tensor.numel() * tensor.element_size())
    if isinstance(tensor, TensorData):
        return tensor.nbytes
    return int(tensor.nbytes)


def host_copy(name: str, tensor: Any) -> TensorData:
    """A host-memory :class:`TensorData` *copy* of ``tensor`` (never a view).

    The trainer updates its parameters in place, and a served copy must keep the bytes the
    replicas hold.
    """
    import numpy as np

    if _is_torch(tensor):
        from cwtrain.hotload.codec.device import tensor_data

        return tensor_data(tensor.detach().to("cpu", copy=True))
    data = as_tensor_data(name, tensor)
    raw = data.data.read() if isinstance(data.data, FileRegion) else data.data
    return TensorData(data.dtype, tuple(data.shape), np.array(np.frombuffer(raw, dtype=np.uint8), copy=True))


@dataclass
class _Kept:
    """A rank's share between the protocol's steps: encoded, with the sizes of a fixed layout (``None``: numbered)."""

    share: EncodedShare
    sizes: list[tuple[str, int]] | None
    full: bool


@dataclass
class _Encoding:
    """What :meth:`RankShare.encode` gathers over the chunks of one version."""

    frames: list[tuple[str, list[Buffer], int]] = field(default_factory=list)
    checksums: dict[str, str] = field(default_factory=dict)
    pending: dict[str, Any] = field(default_factory=dict)
    full_host: dict[str, TensorData] = field(default_factory=dict)
    total: int = 0
    changed_bytes: int = 0


class RankShare:
    """One rank's side of a distributed publish; keeps the served copy of the tensors it owns.

    Args:
        rank: this rank.
        world_size: number of ranks.
        on_device: keep the served copy of torch tensors on their device (the XOR never
            leaves it); ``False`` keeps host copies (device memory is the trainer's).

    Attributes:
        served: the tensors the replicas serve (this rank's share): host ``TensorData``, or
            torch tensors on their device.

    The protocol's steps, each reporting in a :class:`ShareResult` (an error in it, never raised)::

        share.encode_chunks(plan, chunks)       # or share.encode_owned(plan, params): encode and keep
        share.cut(full_plan)                    # the committing process cut the version FULL
        share.store_encoded(plan, counts, s3)   # upload the shards (no index)
        share.commit()                          # or share.discard(), once the hot-load ended
    """

    def __init__(self, rank: int = 0, world_size: int = 1, *, on_device: bool = False) -> None:
        self.rank = rank
        self.world_size = world_size
        self.on_device = on_device
        self.served: dict[str, Any] = {}
        self._pending: dict[str, Any] | None = None
        self._encoded: _Kept | None = None

    def seed(self, served: Mapping[str, Any]) -> None:
        """Start from ``served`` (the weights the replicas hold, byte-exact), e.g. the base checkpoint's.

        Host values are kept as they are (not copied: the caller hands them over); torch
        tensors as :meth:`encode` keeps them.
        """
        self.served = {
            name: self._keep(name, value) if _is_torch(value) else as_tensor_data(name, value)
            for name, value in served.items()
        }
        self._pending = None
        self._encoded = None

    def seed_from_checkpoint(self, checkpoint: str | os.PathLike[str], chunks: Iterable[Chunk]) -> None:
        """Start from ``checkpoint`` (the baseline the replicas serve), for the tensors of ``chunks``.

        Every chunk is drawn (a trainer's gather is a collective every rank takes part in) and
        let go; the checkpoint's bytes of its tensors are read into host memory instead. A
        tensor the checkpoint lacks starts from the trainer's own (with a warning), as a
        framework that adds one does.

        Raises:
            SnapshotError: the checkpoint is not a valid checkpoint, or a file ended early.
        """
        import numpy as np

        from cwtrain.hotload.files.checkpoint import open_checkpoint

        base: dict[str, TensorData] = {}
        with open_checkpoint(os.fspath(checkpoint)) as opened:
            for chunk in chunks:
                for name, tensor in chunk:
                    stored = opened.tensors.get(name)
                    if stored is None:
                        log.warning(
                            "%s is not in %s; its served copy starts from the trainer's tensor", name, checkpoint
                        )
                        base[name] = host_copy(name, tensor)
                    else:  # a fresh read of the file: the bytes belong to the served copy alone
                        region = stored.data
                        raw = region.read() if isinstance(region, FileRegion) else bytes(region)
                        base[name] = TensorData(stored.dtype, tuple(stored.shape), np.frombuffer(raw, dtype=np.uint8))
                del chunk
        self.seed(base)

    def _keep(self, name: str, tensor: Any) -> Any:
        if self.on_device and _is_torch(tensor):
            return tensor.detach().clone()
        return host_copy(name, tensor)

    # ------------------------------------------------------------------ the protocol's steps

    def encode_chunks(self, plan: SharePlan, chunks: Iterable[Chunk]) -> ShareResult:
        """Step 1, for a rank that holds its own tensors: encode ``chunks`` and keep the share.

        Shard names are numbered at :meth:`store_encoded` from every rank's file count. The
        result carries ``payload_bytes`` (the committing process sums them to weigh the delta),
        ``files``, ``tensors_changed``, ``bytes_changed`` and ``stage_seconds``, or the error.
        """
        return self._kept(plan, lambda: (self.encode(plan, chunks), None))

    def encode_owned(self, plan: SharePlan, params: Iterable[tuple[str, Any]]) -> ShareResult:
        """Step 1, for ranks that all see the same sequence of tensors: encode this rank's and keep the share.

        Tensor ``i`` belongs to rank ``i % world_size``; shard names come from
        :func:`layout_by_sizes`, so no count needs to travel. Reports as :meth:`encode_chunks`.
        """

        def encode() -> tuple[EncodedShare, list[tuple[str, int]]]:
            sizes: list[tuple[str, int]] = []
            owned: dict[str, Any] = {}
            for i, (name, tensor) in enumerate(params):
                sizes.append((name, _nbytes(tensor)))
                if i % self.world_size == self.rank:
                    owned[name] = tensor.detach().contiguous() if _is_torch(tensor) else tensor
            layout = layout_by_sizes(sizes, self.rank, self.world_size, full=plan.full, shard_bytes=plan.shard_bytes)
            return self.encode(plan, [list(owned.items())], layout=layout), sizes

        return self._kept(plan, encode)

    def cut(self, plan: SharePlan) -> ShareResult:
        """Step 1b: the committing process cut the version FULL; build this rank's FULL share from its served copy.

        Nothing is gathered or XORed again (:meth:`full_from_served`); the FULL layout comes
        from the same tensor sizes when they are known. Reports as :meth:`encode_chunks`.
        """

        def rebuild() -> tuple[EncodedShare, list[tuple[str, int]] | None]:
            kept = self._encoded
            if kept is None or kept.full:
                raise SnapshotError(f"{plan.identity}: no delta share of this rank to cut (encode it first)")
            layout = None
            if kept.sizes is not None:
                layout = layout_by_sizes(
                    kept.sizes, self.rank, self.world_size, full=True, shard_bytes=plan.shard_bytes
                )
            return self.full_from_served(plan, kept.share, layout=layout), kept.sizes

        return self._kept(plan, rebuild)

    def store_encoded(self, plan: SharePlan, counts: Sequence[int], s3: ObjectStoreLike | None) -> ShareResult:
        """Step 2: upload the share kept by step 1 (or 1b) under ``plan``'s identity, with no index.

        Args:
            plan: the version (FULL only when step 1 encoded it FULL, or step 1b cut it).
            counts: every rank's file count, in rank order (numbers the shards of a share
                encoded from chunks; ignored for a fixed layout).
            s3: the object store (or a boto3 client; default: from the environment).
        """
        kept, self._encoded = self._encoded, None
        try:
            if kept is None:
                raise SnapshotError(f"nothing encoded for {plan.identity}: encode the share first")
            if kept.full != plan.full:
                raise SnapshotError(
                    f"{plan.identity} was encoded {'FULL' if kept.full else 'as a delta'} on rank {self.rank}; "
                    f"it cannot be stored as {'FULL' if plan.full else 'a delta'}"
                )
            encoded = kept.share
            if kept.sizes is None:
                number_by_counts(encoded, counts, self.rank, full=plan.full)
            return self._store(plan, encoded, s3)
        except Exception as exc:
            self.discard()
            return ShareResult(rank=self.rank, error=f"rank {self.rank}: {type(exc).__name__}: {exc}")

    def commit(self) -> None:
        """The hot-load completed: what was published is what the replicas serve."""
        if self._pending is not None:
            self.served.update(self._pending)
            self._pending = None
        self._encoded = None

    def discard(self) -> None:
        """The publish failed: keep the previous served copy (the next version is FULL)."""
        self._pending = None
        self._encoded = None

    def _kept(
        self, plan: SharePlan, make: Callable[[], tuple[EncodedShare, list[tuple[str, int]] | None]]
    ) -> ShareResult:
        """Run an encoding step and keep its share; what to report (an error in it, the share dropped)."""
        try:
            encoded, sizes = make()
        except Exception as exc:
            self.discard()
            return ShareResult(rank=self.rank, error=f"rank {self.rank}: {type(exc).__name__}: {exc}")
        self._encoded = _Kept(encoded, sizes, plan.full)
        return ShareResult(
            rank=self.rank,
            tensors_changed=len(encoded.weight_map),
            bytes_changed=encoded.bytes_changed,
            payload_bytes=sum(f.size for f in encoded.files),
            stage_seconds=encoded.stage_seconds,
            files=len(encoded.files),
        )

    # ------------------------------------------------------------------ encoding

    def encode(
        self, plan: SharePlan, chunks: Iterable[Chunk], *, layout: Mapping[str, str] | None = None
    ) -> EncodedShare:
        """Encode this rank's share of ``plan``'s version from ``chunks`` of the tensors it owns.

        Each chunk is encoded and let go before the next one is drawn, so only one chunk of
        gathered tensors is alive at a time. A delta XORs each tensor against the served copy;
        the new served copy (the changed tensors of a delta, every tensor of a FULL) waits for
        :meth:`commit`.

        Args:
            plan: the version.
            chunks: the tensors, in chunks.
            layout: tensor → shard name fixed in advance (:func:`layout_by_sizes`); default:
                the encoder's own names, to be numbered with :func:`number_by_counts`.

        Raises:
            SnapshotError: a delta with no served copy of a tensor, or tensors that changed
                dtype or shape (publish FULL instead).
        """
        started = time.perf_counter()
        state = _Encoding()
        with DeltaEncoder(shard_bytes=plan.shard_bytes) as encoder:
            device = _device_encoder(encoder)
            try:
                for chunk in chunks:
                    self._encode_chunk(plan, chunk, encoder, device, state)
                    del chunk  # let the gathered tensors go before the next chunk is gathered
            finally:
                if device is not None:
                    device.close()
            if plan.full:
                files, weight_map = self._full_files(encoder, state.full_host, state.checksums, layout)
                state.changed_bytes = state.total
            else:
                files, weight_map = self._delta_files(encoder, state.frames, state.checksums, layout)
        self._pending = state.pending
        return EncodedShare(
            files, weight_map, state.checksums, state.total, state.changed_bytes, time.perf_counter() - started
        )

    def full_from_served(
        self, plan: SharePlan, encoded: EncodedShare, *, layout: Mapping[str, str] | None = None
    ) -> EncodedShare:
        """This rank's FULL share of a version whose delta share :meth:`encode` made (the cost rule cut it).

        The new weights are the served copy with the changed tensors waiting for
        :meth:`commit`; the checksums are the ones the delta's encode computed. Nothing is
        gathered or XORed again: only the FULL's shards are laid out (host copies of
        tensors kept on the device).

        Args:
            plan: the version, FULL.
            encoded: this rank's delta share of it.
            layout: tensor → shard name fixed in advance (FULL names); default: the
                encoder's own, to be numbered with :func:`number_by_counts`.
        """
        started = time.perf_counter()
        pending = self._pending or {}
        host: dict[str, TensorData] = {}
        for name in encoded.checksums:
            value = pending[name] if name in pending else self.served[name]
            host[name] = host_copy(name, value) if _is_torch(value) else as_tensor_data(name, value)
        with DeltaEncoder(shard_bytes=plan.shard_bytes) as encoder:
            files, weight_map = self._full_files(encoder, host, encoded.checksums, layout)
        seconds = encoded.stage_seconds + time.perf_counter() - started
        return EncodedShare(files, weight_map, dict(encoded.checksums), encoded.total_size, encoded.total_size, seconds)

    def _encode_chunk(
        self, plan: SharePlan, chunk: Chunk, encoder: DeltaEncoder, device: Any, state: _Encoding
    ) -> None:
        """One chunk into ``state``; its tensors are referenced only until this returns."""
        tensors = dict(chunk)
        state.total += sum(_nbytes(t) for t in tensors.values())
        if plan.full:
            host = {name: host_copy(name, tensor) for name, tensor in tensors.items()}
            state.checksums.update(encoder.checksums(host))
            state.full_host.update(host)
            for name, tensor in tensors.items():
                state.pending[name] = self._keep(name, tensor) if self.on_device else host[name]
            return
        encoded = self._encode_delta(tensors, encoder, device, state.frames)
        state.checksums.update(encoded.checksums)
        for name in encoded.changed:
            state.pending[name] = self._keep(name, tensors[name])
            state.changed_bytes += _nbytes(tensors[name])

    def _encode_delta(
        self,
        tensors: Mapping[str, Any],
        encoder: DeltaEncoder,
        device: Any,
        frames: list[tuple[str, list[Buffer], int]],
    ) -> Any:
        missing = sorted(set(tensors) - set(self.served))
        if missing:
            raise SnapshotError(
                f"rank {self.rank}: no served copy of {missing[:3]} to diff against; publish FULL first"
            )
        base = {name: self.served[name] for name in tensors}
        if tensors and device is not None and all(_is_torch(t) for t in tensors.values()):
            return device.encode(tensors, base, sink=_Frames(frames))
        host = {name: host_copy(name, tensor) for name, tensor in tensors.items()}
        served = {name: host_copy(name, value) if _is_torch(value) else value for name, value in base.items()}
        return encoder.encode(host, served, sink=_Frames(frames))

    @staticmethod
    def _full_files(
        encoder: DeltaEncoder,
        host: Mapping[str, TensorData],
        checksums: Mapping[str, str],
        layout: Mapping[str, str] | None,
    ) -> tuple[list[SnapshotFile], dict[str, str]]:
        if not host:
            return [], {}
        ordered = {name: host[name] for name in sorted(host)}
        if layout is not None:
            snap = encoder.encode_full(ordered, layout=dict(layout), checksums=dict(checksums))
        else:
            snap = encoder.encode_full(ordered, checksums=dict(checksums))
        return list(snap.files), dict(snap.index_json["weight_map"])

    @staticmethod
    def _delta_files(
        encoder: DeltaEncoder,
        frames: list[tuple[str, list[Buffer], int]],
        checksums: Mapping[str, str],
        layout: Mapping[str, str] | None,
    ) -> tuple[list[SnapshotFile], dict[str, str]]:
        if not frames:
            return [], {}
        sink: ShardSink = _LayoutSink(layout) if layout is not None else ShardSink(encoder.shard_bytes)
        for name, pieces, length in sorted(frames, key=lambda frame: frame[0]):
            sink.add(name, pieces, length)
        files = sink.finish({name: int(value, 16) for name, value in checksums.items()})
        return files, sink.weight_map()

    def _store(self, plan: SharePlan, encoded: EncodedShare, s3: ObjectStoreLike | None) -> ShareResult:
        """Upload this rank's files under ``plan``'s identity (no index); returns what to report."""
        started = time.perf_counter()
        uploaded = []
        if encoded.files:
            with SnapshotUpload(
                s3, bucket=plan.bucket, identity=plan.identity, path_prefix=plan.path_prefix,
                workers=plan.upload_workers,
            ) as upload:  # fmt: skip
                for file in encoded.files:
                    upload.add(file)
                uploaded = upload.finish_share()
        return ShareResult(
            rank=self.rank,
            weight_map=dict(encoded.weight_map),
            checksums=dict(encoded.checksums),
            total_size=encoded.total_size,
            tensors_changed=len(encoded.weight_map),
            bytes_changed=encoded.bytes_changed,
            payload_bytes=sum(f.size for f in encoded.files),
            wire_bytes=sum(item.size for item in uploaded if item.outcome == "uploaded"),
            stage_seconds=encoded.stage_seconds,
            upload_seconds=time.perf_counter() - started,
            files=len(encoded.files),
        )


def _device_encoder(encoder: DeltaEncoder) -> Any:
    """A :class:`~cwtrain.hotload.codec.device.TorchDeltaEncoder` on ``encoder``'s pool, or ``None`` without torch."""
    if "torch" not in sys.modules:  # nothing in this process holds torch tensors
        return None
    from cwtrain.hotload.codec.device import TorchDeltaEncoder

    return TorchDeltaEncoder(encoder)


def chunked(
    named_tensors: Iterable[tuple[str, Any]], limit: int = DEFAULT_CHUNK_BYTES
) -> Iterator[list[tuple[str, Any]]]:
    """Group ``(name, tensor)`` pairs into chunks of at most ``limit`` bytes (a bigger tensor alone)."""
    chunk: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = _nbytes(tensor)
        if chunk and size + nbytes > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, tensor))
        size += nbytes
    if chunk:
        yield chunk


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
