"""One rank's side of a distributed publish: :class:`RankShare`, and the chunker.

A rank keeps, for the whole run, the served copy of the tensors it owns (in host memory, or
on their device) and takes part in each step of the distributed share protocol
(:mod:`cwtrain.hotload.lifecycle.protocol`): it encodes its share of a version chunk by chunk
(XOR on the device when the tensors are torch tensors; only the XOR of changed tensors
reaches the host), builds its FULL share from its served copy when the committing process
cuts the version (the cost rule of ``CWTRAIN_HOTLOAD_FULL_EVERY=auto``: the new weights are
the served copy plus the changed tensors, the checksums the delta encode's, so nothing is
gathered or encoded twice), stores its shards with no index, and commits or discards its new
served copy once the version settled. Each step reports in a
:class:`~cwtrain.hotload.lifecycle.shares.ShareResult` and never raises.

:func:`chunked` groups ``(name, tensor)`` pairs into chunks of bounded bytes, as trainers
gather them; :meth:`RankShare.seed_from_checkpoint` reads a rank's served copy from the base
checkpoint (the baseline every rank starts from).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Buffer, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cwtrain.errors import SnapshotError
from cwtrain.hotload.codec.encode import DeltaEncoder, ShardSink, delta_shard_header
from cwtrain.hotload.format.index import SnapshotFile
from cwtrain.hotload.format.tensors import FileRegion, TensorData, as_tensor_data
from cwtrain.hotload.lifecycle.shares import EncodedShare, SharePlan, ShareResult, layout_by_sizes, number_by_counts
from cwtrain.hotload.store.snapshot_upload import SnapshotUpload
from cwtrain.infra.s3 import ObjectStoreLike

__all__ = ["DEFAULT_CHUNK_BYTES", "Chunk", "RankShare", "chunked", "host_copy"]

log = logging.getLogger(__name__)

Chunk = Iterable[tuple[str, Any]]
"""Tensors gathered together, by name (numpy arrays, torch tensors or ``TensorData``)."""

DEFAULT_CHUNK_BYTES = 512 * 1024**2
"""The default bytes of one chunk (slime's and miles' default ``--update-weight-buffer-size``)."""


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
