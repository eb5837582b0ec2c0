"""Publishing from live tensors: :class:`TensorPublisher`, one snapshot per version from every rank.

slime's disk updaters export every version as files before the hook sees them. The
live-tensor path skips the disk: the ``MegatronTrainRayActor`` subclass of
:mod:`~cwtrain.integrations.slime.train_actor` (``python -m cwtrain.integrations.slime.launch``)
hands the HF-named tensors each rank gathers, chunk by chunk, to a :class:`TensorPublisher`:

* each chunk (at most ``--update-weight-buffer-size`` bytes, as slime's own updaters gather
  them) is XORed against the rank's served copy and encoded, then let go before the next
  one is gathered, so the device never holds more than one chunk of gathered tensors
  (:mod:`cwtrain.hotload.codec.device` on the device where available, else the numpy codec after
  one copy to host memory);
* shard numbers are agreed over ``torch.distributed`` (slime's gloo group), every rank
  uploads its own shards, and rank 0 commits the index and runs the hot-load;
* the first call publishes ``--hf-checkpoint`` as ``<run>-v000000`` (rank 0) and seeds
  every rank's served copy from it; a FULL snapshot cuts the chain every
  ``CWTRAIN_HOTLOAD_FULL_EVERY`` versions; empty deltas are skipped; the outcome is
  broadcast, so a failure raises on every rank.

The snapshot is byte-identical to publishing the same weights from a delta directory: the
changed tensors of every chunk are packed into shards in name order once all are encoded
(their compressed frames live in host memory until then).

Configuration is the hook's (:class:`~cwtrain.integrations.slime.config.HookConfig`); rank 0
builds it and sends it to the others, so all ranks agree on the run id. No slime flag for
the disk updaters is needed (``--update-weight-disk-dir`` only names the state directory,
or set ``CWTRAIN_HOTLOAD_STATE_DIR``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Buffer, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from cwtrain.errors import CWTrainError, SnapshotError, UsageError
from cwtrain.hotload.codec.encode import ShardSink
from cwtrain.hotload.format.identity import version_identity
from cwtrain.hotload.publish.cadence import ChainCadence
from cwtrain.infra.enums import HotLoadState

from .config import HookConfig
from .publisher import SlimePublisher, build_loader

if TYPE_CHECKING:
    from cwtrain.hotload.codec.encode import DeltaEncoder
    from cwtrain.hotload.format.index import SnapshotFile
    from cwtrain.hotload.format.tensors import TensorData
    from cwtrain.hotload.loader import HotLoader, ProgressEvent
    from cwtrain.hotload.publish.store import SnapshotStore

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "Chunk",
    "Collective",
    "SingleProcess",
    "TensorPublisher",
    "TorchCollective",
    "chunked",
]

log = logging.getLogger(__name__)

Chunk = Sequence[tuple[str, Any]]
"""HF-named tensors gathered together (one of slime's ``_iter_*_chunks`` buckets)."""

DEFAULT_CHUNK_BYTES = 512 * 1024**2
"""slime's and miles' default ``--update-weight-buffer-size``."""


class Collective(Protocol):
    """The few collectives the tensor path needs (``torch.distributed`` in slime)."""

    rank: int
    world_size: int

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        ...

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``src``'s ``obj`` on every rank."""
        ...


class SingleProcess:
    """A world of one (tests, single-GPU runs)."""

    rank = 0
    world_size = 1

    def all_gather_object(self, obj: Any) -> list[Any]:
        """``[obj]``."""
        return [obj]

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj``."""
        return obj


class TorchCollective:
    """Collectives over ``torch.distributed``: slime's gloo group when it has one, else the default group.

    The group is looked up at every call: slime re-creates its gloo group when it offloads
    the trainer, and a group kept from before would be a destroyed one.

    Args:
        group: a fixed group to use instead.
    """

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self._group = group
        self.rank = int(dist.get_rank())
        self.world_size = int(dist.get_world_size())

    @property
    def group(self) -> Any:
        """The group the collectives run on (``None``: the default group)."""
        if self._group is not None:
            return self._group
        from .barrier import gloo_group

        return gloo_group()

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``src``'s ``obj`` on every rank."""
        box = [obj]
        self._dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]


def _is_torch(tensor: Any) -> bool:
    return type(tensor).__module__.startswith("torch") and hasattr(tensor, "detach")


def _host_copy(name: str, tensor: Any) -> TensorData:
    """A host-memory :class:`~cwtrain.hotload.format.tensors.TensorData` *copy* of ``tensor``.

    A copy, never a view: the trainer updates its parameters in place, and the served copy
    must keep the bytes the replicas hold.
    """
    import numpy as np

    from cwtrain.hotload.format.tensors import FileRegion, TensorData, as_tensor_data

    if _is_torch(tensor):
        from cwtrain.hotload.codec.device import safetensors_dtype

        host = tensor.detach().contiguous().to("cpu", copy=True)
        return TensorData(
            safetensors_dtype(host.dtype), tuple(host.shape), host.reshape(-1).view(torch_uint8()).numpy()
        )
    data = as_tensor_data(name, tensor)
    raw = data.data.read() if isinstance(data.data, FileRegion) else data.data
    return TensorData(data.dtype, tuple(data.shape), np.array(np.frombuffer(raw, dtype=np.uint8), copy=True))


def torch_uint8() -> Any:
    """``torch.uint8`` (torch is imported only on the torch path)."""
    import torch

    return torch.uint8


def _nbytes(tensor: Any) -> int:
    if _is_torch(tensor):
        return int(tensor.numel() * tensor.element_size())
    return int(tensor.nbytes)


def _checkpoint_names(hf_checkpoint: str) -> set[str]:
    """The tensor names of ``--hf-checkpoint`` (headers only)."""
    from cwtrain.hotload.files.checkpoint import open_checkpoint

    with open_checkpoint(hf_checkpoint) as checkpoint:
        return set(checkpoint.tensors)


def _read_base(hf_checkpoint: str, names: Iterable[str]) -> dict[str, TensorData]:
    """This rank's tensors as served at the baseline: read from ``--hf-checkpoint`` into host memory."""
    import numpy as np

    from cwtrain.hotload.files.checkpoint import open_checkpoint
    from cwtrain.hotload.format.tensors import FileRegion, TensorData

    wanted = set(names)
    out: dict[str, TensorData] = {}
    with open_checkpoint(hf_checkpoint) as checkpoint:
        for name, tensor in checkpoint.tensors.items():
            if name in wanted:
                region = tensor.data
                if not isinstance(region, FileRegion):  # open_checkpoint maps every tensor to its file
                    raise CWTrainError(f"{hf_checkpoint}: tensor {name!r} is not backed by a file")
                try:
                    raw = region.read()
                except SnapshotError:
                    raise CWTrainError(f"{hf_checkpoint}: file ended early while reading tensor {name!r}") from None
                out[name] = TensorData(tensor.dtype, tuple(tensor.shape), np.frombuffer(raw, dtype=np.uint8))
    return out


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


class _Frames(ShardSink):
    """Collects the encoded frames of one chunk; shards are packed once every chunk is in."""

    def __init__(self, into: list[tuple[str, list[Buffer], int]]) -> None:
        super().__init__()
        self._into = into

    def add(self, name: str, pieces: list[Buffer], length: int) -> None:
        """Keep the frame (pieces of ``length`` bytes) of changed tensor ``name``."""
        self._into.append((name, pieces, length))


@dataclass
class _RankSnapshot:
    """What one rank encoded for one version, chunk by chunk."""

    full: bool
    frames: list[tuple[str, list[Buffer], int]] = field(default_factory=list)
    host: dict[str, TensorData] = field(default_factory=dict)  # FULL: the new served copy
    checksums: dict[str, str] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)
    size: int = 0

    def files(self, encoder: DeltaEncoder) -> tuple[list[SnapshotFile], dict[str, str]]:
        """This rank's shard files and weight map, packed in name order as one encode would."""
        if self.full:
            if not self.host:
                return [], {}
            snap = encoder.encode_full({n: self.host[n] for n in sorted(self.host)}, checksums=self.checksums)
            return list(snap.files), dict(snap.index_json["weight_map"])
        sink = ShardSink(encoder.shard_bytes)
        for name, pieces, length in sorted(self.frames, key=lambda frame: frame[0]):
            sink.add(name, pieces, length)
        files = sink.finish({name: int(value, 16) for name, value in self.checksums.items()}) if self.frames else []
        return files, sink.weight_map()


@dataclass
class _RankResult:
    """What one rank tells the committing rank after uploading its shards."""

    weight_map: dict[str, str]
    checksums: dict[str, str]
    total_size: int
    error: str | None = None
    payload_bytes: int = 0


class TensorPublisher:
    """Publishes the tensors of every rank as one snapshot per version.

    Args:
        config: the hook's settings (identical on every rank).
        collective: rank, world size and object collectives.
        loader: rank 0's :class:`~cwtrain.hotload.loader.HotLoader` (built from ``config`` when ``None``).
        start_version: the version before the first publish (slime's ``update_weight_start_version``).
    """

    def __init__(
        self,
        config: HookConfig,
        collective: Collective | None = None,
        *,
        loader: HotLoader | None = None,
        start_version: int = 0,
    ) -> None:
        self.config = config
        self.collective: Collective = collective if collective is not None else SingleProcess()
        self._loader = loader
        self._publisher: SlimePublisher | None = None
        self.version = start_version
        self.served: dict[str, TensorData] | None = None
        self.served_identity: str | None = None
        self.cadence = ChainCadence(config.full_every)
        self._store: SnapshotStore | None = None

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.collective.rank

    @property
    def loader(self) -> HotLoader:
        """Rank 0's hot-loader (built from the config on first use)."""
        if self._loader is None:
            self._loader = build_loader(self.config)
        return self._loader

    @property
    def publisher(self) -> SlimePublisher:
        """Rank 0's :class:`SlimePublisher` on the same loader: the baseline, manifests, the served identity."""
        if self._publisher is None:
            self._publisher = SlimePublisher(self.config, loader=self.loader)
        return self._publisher

    def publish(
        self,
        args: argparse.Namespace | None,
        named_tensors: Iterable[tuple[str, Any]],
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> dict[str, float] | None:
        """Publish this version from ``named_tensors``, taken ``chunk_bytes`` at a time (see :meth:`publish_chunks`)."""
        return self.publish_chunks(args, chunked(named_tensors, chunk_bytes))

    def publish_chunks(self, args: argparse.Namespace | None, chunks: Iterable[Chunk]) -> dict[str, float] | None:
        """Publish this version from ``chunks`` of the HF-named tensors this rank holds.

        Each chunk is encoded and then let go before the next one is drawn, so only one
        chunk of gathered tensors is alive at a time (slime bounds a chunk by
        ``--update-weight-buffer-size``). Every rank must call it, in step. Returns
        ``hotload/*`` metrics on rank 0.

        Raises:
            CWTrainError: publishing failed on some rank (raised on every rank).
        """
        if self.served is None:
            if args is None:
                raise UsageError("the first publish is the baseline: pass slime's args (--hf-checkpoint)")
            return self._baseline(args, chunks)
        self.version += 1
        identity = version_identity(self.config.run_id, self.version)
        return self._publish(identity, chunks, full=self.cadence.is_full(self.version))

    # ------------------------------------------------------------------ baseline

    def _baseline(self, args: argparse.Namespace, chunks: Iterable[Chunk]) -> dict[str, float] | None:
        metrics: dict[str, float] | None = None
        error: str | None = None
        if self.rank == 0:
            try:
                metrics = self.publisher.publish_baseline(args)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                self._raise_everywhere(error)
                raise
        self._raise_everywhere(error)
        hf_checkpoint = str(args.hf_checkpoint)
        in_checkpoint = _checkpoint_names(hf_checkpoint)
        names: list[str] = []
        missing: dict[str, TensorData] = {}
        for chunk in chunks:  # every rank gathers (the gather's collectives need all of them)
            for name, tensor in chunk:
                names.append(name)
                if name not in in_checkpoint:  # as slime does: seed it from the model
                    log.warning("%s is not in --hf-checkpoint; its served copy starts from the trainer's tensor", name)
                    missing[name] = _host_copy(name, tensor)
            del chunk
        base = _read_base(hf_checkpoint, names)
        base.update(missing)
        self.served = base
        self.served_identity = version_identity(self.config.run_id, 0)
        self.cadence.published(full=True)
        return metrics

    def _raise_everywhere(self, error: str | None) -> None:
        errors = [e for e in self.collective.all_gather_object(error) if e]
        if errors and error is None:
            raise CWTrainError(f"publishing failed on another rank: {errors[0]}")

    # ------------------------------------------------------------------ versions

    def _encode_chunk(self, snap: _RankSnapshot, chunk: Chunk, encoder: DeltaEncoder, torch_encoder: Any) -> None:
        """Encode one chunk into ``snap``; the served copy takes the chunk's changed tensors.

        Torch tensors are XORed where they live (:class:`~cwtrain.hotload.codec.device.TorchDeltaEncoder`,
        byte-identical to the numpy codec); anything else goes through the numpy codec. A
        FULL keeps host copies (they become the served copy).
        """
        tensors = dict(chunk)
        snap.size += sum(_nbytes(t) for t in tensors.values())
        if snap.full:
            for name, tensor in tensors.items():
                snap.host[name] = _host_copy(name, tensor)
            snap.checksums.update(encoder.checksums({n: snap.host[n] for n in tensors}))
            return
        assert self.served is not None
        base = {name: self.served[name] for name in tensors}
        if tensors and torch_encoder is not None and all(_is_torch(t) for t in tensors.values()):
            encoded = torch_encoder.encode(tensors, base, sink=_Frames(snap.frames))
        else:
            host = {n: _host_copy(n, t) for n, t in tensors.items()}
            encoded = encoder.encode(host, base, sink=_Frames(snap.frames))
        snap.checksums.update(encoded.checksums)
        snap.changed.extend(encoded.changed)
        for name in encoded.changed:  # only changed tensors cross to host memory again
            self.served[name] = _host_copy(name, tensors[name])

    def _encode(
        self, chunks: Iterable[Chunk], *, full: bool
    ) -> tuple[_RankSnapshot, list[SnapshotFile], dict[str, str]]:
        """This rank's snapshot, chunk by chunk: its files and weight map (unnumbered names)."""
        from cwtrain.hotload.codec.encode import DeltaEncoder

        snap = _RankSnapshot(full)
        with DeltaEncoder() as encoder:
            torch_encoder = _torch_encoder(encoder)
            try:
                for chunk in chunks:
                    self._encode_chunk(snap, chunk, encoder, torch_encoder)
                    del chunk  # let the gathered tensors go before the next chunk is gathered
            finally:
                if torch_encoder is not None:
                    torch_encoder.close()
            files, weight_map = snap.files(encoder)
        if full:
            self.served = snap.host
            snap.changed = sorted(snap.host)
        return snap, files, weight_map

    def _publish(self, identity: str, chunks: Iterable[Chunk], *, full: bool) -> dict[str, float] | None:
        from cwtrain.hotload.format.index import SnapshotFile, full_shard_name, shard_name

        metrics: dict[str, float] = {"hotload/chain_cut": float(full), "hotload/incremental": 0.0}
        started = time.perf_counter()
        snap: _RankSnapshot | None = None
        files: list[SnapshotFile] = []
        encoded_map: dict[str, str] = {}
        problem: str | None = None
        try:
            snap, files, encoded_map = self._encode(chunks, full=full)
        except Exception as exc:  # every rank must reach the collectives below, then all raise
            problem = f"rank {self.rank}: {type(exc).__name__}: {exc}"
        gathered = self.collective.all_gather_object((len(files), problem))
        problems = [p for _, p in gathered if p]
        if problems:
            self.cadence.failed()
            raise CWTrainError(f"encoding {identity} failed: {problems[0]}")
        assert snap is not None
        counts = [count for count, _ in gathered]
        total, offset = sum(counts), sum(counts[: self.rank])
        metrics["hotload/stage_seconds"] = time.perf_counter() - started
        metrics["hotload/tensors_changed"] = float(sum(self.collective.all_gather_object(len(snap.changed))))
        if total == 0 and not full:
            log.info("%s is an empty delta: nothing to publish; replicas keep %s", identity, self.served_identity)
            metrics["hotload/skipped_empty"] = 1.0
            return self._state_metrics(metrics) if self.rank == 0 else None
        if full and self.collective.world_size == 1:
            renamed = {f.name: f.name for f in files}  # the codec's own FULL layout
        elif full:  # HF-style 1-based names, numbered across the ranks
            renamed = {f.name: full_shard_name(offset + i, total) for i, f in enumerate(files)}
        else:
            renamed = {f.name: shard_name(offset + i, total) for i, f in enumerate(files)}
        files = [SnapshotFile(renamed[f.name], tuple(f.buffers)) for f in files]
        weight_map = {name: renamed[shard] for name, shard in encoded_map.items()}

        error: str | None = None
        started = time.perf_counter()
        try:
            if self._store is None:
                self._store = self._shared_store()
            self._upload_shards(self._store, identity, files)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        results: list[_RankResult] = self.collective.all_gather_object(
            _RankResult(weight_map, dict(snap.checksums), snap.size, error, sum(f.size for f in files))
        )
        failed = [r.error for r in results if r.error]
        outcome: str | None = failed[0] if failed else None
        if self.rank == 0 and outcome is None:
            try:
                self._commit(identity, results, full=full, metrics=metrics, upload_started=started)
            except Exception as exc:
                outcome = f"{type(exc).__name__}: {exc}"
        outcome = self.collective.broadcast_object(outcome)
        if outcome is not None:
            self.cadence.failed()
            raise CWTrainError(f"publishing {identity} failed: {outcome}")
        self.cadence.published(full=full)
        self.served_identity = identity
        if self.rank != 0:
            return None
        metrics["hotload/publish_seconds"] = time.perf_counter() - started
        return self._state_metrics(metrics)

    def _state_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Add the version, the served version and the chain length (the keys ``tracking`` logs)."""
        served = self.served_identity
        metrics["hotload/version"] = float(self.version)
        metrics["hotload/served_version"] = float(int(served.rsplit("-v", 1)[1])) if served else -1.0
        metrics["hotload/chain_length"] = float(self.cadence.deltas_in_chain)
        return metrics

    def _shared_store(self) -> SnapshotStore:
        """The deployment's snapshot store: resolved on rank 0, its bucket and prefix shared with every rank."""
        from cwtrain.hotload.publish.store import SnapshotStore

        target: tuple[str, str] | str | None = None
        store: SnapshotStore | None = None
        if self.rank == 0:
            try:
                store = self.loader.store
                target = (store.bucket, store.path_prefix)
            except Exception as exc:
                target = f"{type(exc).__name__}: {exc}"
        target = self.collective.broadcast_object(target)
        if isinstance(target, str) or target is None:
            raise CWTrainError(f"cannot resolve the snapshot bucket: {target}")
        if store is not None:
            return store
        from cwtrain.infra.s3 import object_store

        return SnapshotStore(object_store(), target[0], target[1])

    def _upload_shards(self, store: SnapshotStore, identity: str, files: list[SnapshotFile]) -> None:
        if not files:
            return
        with store.open_upload(identity, workers=self.config.upload_workers) as upload:
            for file in files:
                upload.add(file)
            upload.finish_share()  # no index: rank 0 commits it over every rank's shards

    def _commit(
        self, identity: str, results: list[_RankResult], *, full: bool, metrics: dict[str, float], upload_started: float
    ) -> None:
        """Rank 0: write the index over every rank's shards, then hot-load."""
        from cwtrain.hotload.publish.distributed import commit_shared_index, merge_weight_maps
        from cwtrain.infra.enums import SnapshotType

        weight_map = merge_weight_maps(r.weight_map for r in results)
        previous = None if full else self.served_identity
        assert full or previous is not None
        loader = self.loader
        store = self._store
        assert store is not None  # resolved before the shards were uploaded
        commit_shared_index(
            store.s3,
            bucket=store.bucket,
            identity=identity,
            path_prefix=store.path_prefix,
            weight_map=weight_map,
            full=full,
            total_size=sum(r.total_size for r in results),
            previous_identity=previous,
        )
        metrics["hotload/upload_seconds"] = time.perf_counter() - upload_started
        metrics["hotload/snapshot_bytes"] = float(sum(r.payload_bytes for r in results))
        started = time.perf_counter()
        config = self.config
        loader.wait_for_deployment_ready(timeout=config.timeout)
        kind = SnapshotType.FULL if full else SnapshotType.INCREMENTAL
        hot_load = loader.trigger(
            identity,
            snapshot_type=kind,
            previous_identity=previous,
            prompt_cache_policy=config.prompt_cache_policy,
            timeout=config.timeout,
        )
        if config.wait:
            events: list[ProgressEvent] = []
            hot_load = loader.wait(hot_load.id, timeout=config.timeout, on_progress=events.append)
            if events:
                metrics["hotload/replicas_ready"] = float(events[-1].ready)
                metrics["hotload/replicas_total"] = float(events[-1].total)
        metrics["hotload/hot_load_seconds"] = time.perf_counter() - started
        metrics["hotload/incremental"] = float(not full)
        metrics["hotload/completed"] = 1.0 if hot_load.state is HotLoadState.COMPLETED else 0.0
        # every rank reports the Adler-32 of all its tensors, changed or not: the full weights
        checksums = {n: c for r in results for n, c in r.checksums.items()}
        self.publisher.write_manifest(identity, self.version, checksums)
        self.publisher.record_served(identity, self.version)


def _torch_encoder(encoder: DeltaEncoder) -> Any:
    """A :class:`~cwtrain.hotload.codec.device.TorchDeltaEncoder` on ``encoder``'s pool, or ``None`` without torch."""
    if "torch" not in sys.modules:  # nothing gathered torch tensors in this process
        return None
    from cwtrain.hotload.codec.device import TorchDeltaEncoder

    return TorchDeltaEncoder(encoder)
