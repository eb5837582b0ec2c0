"""Publishing from live tensors: a ``MegatronTrainRayActor`` whose ``update_weights()`` hot-loads.

slime's disk updaters export every version as files before the hook sees them. This path
skips the disk: ``python -m cwtrain.integrations.slime.launch train.py ARGS`` injects
:func:`make_actor_cls`'s subclass through ``create_training_models(..., actor_cls=...)``,
and its ``update_weights()`` hands the HF-named tensors each rank holds (the same gathered
tensors slime's updaters produce) to a :class:`TensorPublisher`:

* every rank XORs its tensors against its own served copy, skips unchanged ones and
  encodes its shards (:mod:`cwtrain.hotload.torch` on the device where available, else the
  numpy codec after one copy to host memory);
* shard numbers are agreed over ``torch.distributed`` (slime's gloo group), every rank
  uploads its own shards, and rank 0 commits the index and runs the hot-load;
* the first call publishes ``--hf-checkpoint`` as ``<run>-v000000`` (rank 0) and seeds
  every rank's served copy from it; a FULL snapshot cuts the chain every
  ``CWTRAIN_HOTLOAD_FULL_EVERY`` versions; empty deltas are skipped; the outcome is
  broadcast, so a failure raises on every rank.

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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from cwtrain.errors import CWTrainError, SnapshotError, UsageError
from cwtrain.hotload.chain import ChainCadence
from cwtrain.hotload.identity import version_identity
from cwtrain.infra.enums import HotLoadState
from cwtrain.integrations.frameworks import SLIME, require

from .config import HookConfig
from .publisher import SlimePublisher, build_loader
from .runtime import SlimeRuntime

if TYPE_CHECKING:
    from cwtrain.hotload.codec import EncodedSnapshot
    from cwtrain.hotload.format import SnapshotFile
    from cwtrain.hotload.loader import HotLoader, ProgressEvent
    from cwtrain.hotload.store import SnapshotStore
    from cwtrain.hotload.tensors import TensorData

__all__ = ["Collective", "SingleProcess", "TensorPublisher", "TorchCollective", "make_actor_cls"]

log = logging.getLogger(__name__)


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
    """Collectives over ``torch.distributed`` (slime's gloo group when it has one)."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        if group is None:
            try:
                from slime.utils.distributed_utils import get_gloo_group  # type: ignore[import-not-found]

                group = get_gloo_group()
            except Exception:  # not slime, or no gloo group: the default group
                group = None
        self.group = group
        self.rank = int(dist.get_rank())
        self.world_size = int(dist.get_world_size())

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
    """A host-memory :class:`~cwtrain.hotload.tensors.TensorData` *copy* of ``tensor``.

    A copy, never a view: the trainer updates its parameters in place, and the served copy
    must keep the bytes the replicas hold.
    """
    import numpy as np

    from cwtrain.hotload.tensors import FileRegion, TensorData, as_tensor_data

    if _is_torch(tensor):
        from cwtrain.hotload.torch import safetensors_dtype

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


def _read_base(hf_checkpoint: str, names: Iterable[str]) -> dict[str, TensorData]:
    """This rank's tensors as served at the baseline: read from ``--hf-checkpoint`` into host memory."""
    import numpy as np

    from cwtrain.hotload.delta import open_checkpoint
    from cwtrain.hotload.tensors import FileRegion, TensorData

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
        self, args: argparse.Namespace | None, named_tensors: Iterable[tuple[str, Any]]
    ) -> dict[str, float] | None:
        """Publish this version from ``named_tensors`` (the HF-named tensors this rank holds).

        Every rank must call it, in step. Returns ``hotload/*`` metrics on rank 0.

        Raises:
            CWTrainError: publishing failed on some rank (raised on every rank).
        """
        started = time.perf_counter()
        tensors = dict(named_tensors)  # live tensors: on the device for the torch path
        export_seconds = time.perf_counter() - started
        if self.served is None:
            if args is None:
                raise UsageError("the first publish is the baseline: pass slime's args (--hf-checkpoint)")
            return self._baseline(args, tensors)
        self.version += 1
        identity = version_identity(self.config.run_id, self.version)
        full = self.cadence.is_full(self.version)
        metrics = self._publish(identity, tensors, full=full)
        if metrics is not None:
            metrics["hotload/export_seconds"] = export_seconds
        return metrics

    # ------------------------------------------------------------------ baseline

    def _baseline(self, args: argparse.Namespace, tensors: Mapping[str, Any]) -> dict[str, float] | None:
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
        base = _read_base(str(args.hf_checkpoint), tensors)
        for name, tensor in tensors.items():
            if name not in base:  # as slime does: absent from the HF checkpoint, seed from the model
                log.warning("%s is not in --hf-checkpoint; its served copy starts from the trainer's tensor", name)
                base[name] = _host_copy(name, tensor)
        self.served = base
        self.served_identity = version_identity(self.config.run_id, 0)
        self.cadence.published(full=True)
        return metrics

    def _raise_everywhere(self, error: str | None) -> None:
        errors = [e for e in self.collective.all_gather_object(error) if e]
        if errors and error is None:
            raise CWTrainError(f"publishing failed on another rank: {errors[0]}")

    # ------------------------------------------------------------------ versions

    def _encode(
        self, tensors: Mapping[str, Any], host: Mapping[str, TensorData], *, full: bool
    ) -> EncodedSnapshot | None:
        """This rank's snapshot: FULL from host copies, else the delta against the served copy.

        Torch tensors are XORed where they live (:class:`~cwtrain.hotload.torch.TorchDeltaEncoder`,
        byte-identical to the numpy codec); anything else goes through the numpy codec.
        """
        from cwtrain.hotload.codec import DeltaEncoder

        if full:  # name order: the same bytes whatever order the model yields its tensors in
            if not host:
                return None
            with DeltaEncoder() as encoder:
                return encoder.encode_full({n: host[n] for n in sorted(host)})
        assert self.served is not None
        base = {name: self.served[name] for name in tensors}
        if tensors and all(_is_torch(t) for t in tensors.values()):
            from cwtrain.hotload.torch import TorchDeltaEncoder

            with TorchDeltaEncoder() as torch_encoder:
                return torch_encoder.encode(tensors, base)
        with DeltaEncoder() as encoder:
            return encoder.encode({n: _host_copy(n, t) for n, t in tensors.items()}, base)

    def _publish(self, identity: str, tensors: Mapping[str, Any], *, full: bool) -> dict[str, float] | None:
        from cwtrain.hotload.format import SnapshotFile, full_shard_name, shard_name

        metrics: dict[str, float] = {"hotload/chain_cut": float(full), "hotload/incremental": 0.0}
        started = time.perf_counter()
        snap: EncodedSnapshot | None = None
        problem: str | None = None
        try:
            host = {name: _host_copy(name, tensor) for name, tensor in tensors.items()} if full else {}
            snap = self._encode(tensors, host, full=full)
            # the next delta's base (a failure forces a FULL next, which needs no base)
            if full:
                self.served = host
            elif snap is not None:
                assert self.served is not None
                for name in snap.changed:  # only changed tensors cross to host memory again
                    self.served[name] = _host_copy(name, tensors[name])
        except Exception as exc:  # every rank must reach the collectives below, then all raise
            problem = f"rank {self.rank}: {type(exc).__name__}: {exc}"
        files = list(snap.files) if snap is not None else []
        gathered = self.collective.all_gather_object((len(files), problem))
        problems = [p for _, p in gathered if p]
        if problems:
            self.cadence.failed()
            raise CWTrainError(f"encoding {identity} failed: {problems[0]}")
        counts = [count for count, _ in gathered]
        total, offset = sum(counts), sum(counts[: self.rank])
        metrics["hotload/stage_seconds"] = time.perf_counter() - started
        changed = len(snap.changed) if snap is not None else 0
        metrics["hotload/tensors_changed"] = float(sum(self.collective.all_gather_object(changed)))
        if total == 0 and not full:
            log.info("%s is an empty delta: nothing to publish; replicas keep %s", identity, self.served_identity)
            metrics["hotload/skipped_empty"] = 1.0
            return metrics if self.rank == 0 else None
        if full and self.collective.world_size == 1:
            renamed = {f.name: f.name for f in files}  # the codec's own FULL layout
        elif full:  # HF-style 1-based names, numbered across the ranks
            renamed = {f.name: full_shard_name(offset + i, total) for i, f in enumerate(files)}
        else:
            renamed = {f.name: shard_name(offset + i, total) for i, f in enumerate(files)}
        files = [SnapshotFile(renamed[f.name], tuple(f.buffers)) for f in files]
        encoded_map: dict[str, str] = snap.index_json["weight_map"] if snap is not None else {}
        weight_map = {name: renamed[shard] for name, shard in encoded_map.items()}
        checksums = dict(snap.checksums) if snap is not None else {}
        size = sum(_nbytes(t) for t in tensors.values())

        error: str | None = None
        started = time.perf_counter()
        try:
            if self._store is None:
                self._store = self._shared_store()
            self._upload_shards(self._store, identity, files)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        results: list[_RankResult] = self.collective.all_gather_object(
            _RankResult(weight_map, checksums, size, error, sum(f.size for f in files))
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
        return metrics if self.rank == 0 else None

    def _shared_store(self) -> SnapshotStore:
        """The deployment's snapshot store: resolved on rank 0, its bucket and prefix shared with every rank."""
        from cwtrain.hotload.store import SnapshotStore

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
        from cwtrain.hotload.distributed import commit_shared_index, merge_weight_maps
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


# ---------------------------------------------------------------------- the actor


def make_actor_cls(base: type[Any] | None = None) -> type[Any]:
    """The ``MegatronTrainRayActor`` subclass whose ``update_weights()`` publishes live tensors.

    Args:
        base: the class to extend (default: slime's ``MegatronTrainRayActor``).

    Raises:
        ImportError: slime is not installed.
    """
    if base is None:
        base = require(SLIME, "slime.backends.megatron_utils.actor").MegatronTrainRayActor

    class CoreWeaveTrainRayActor(base):  # type: ignore[misc, valid-type]
        """slime's train actor publishing each weight version by hot-load from its tensors."""

        _cwtrain: TensorPublisher | None = None

        def cwtrain_publisher(self) -> TensorPublisher:
            """This rank's publisher (config built on rank 0 and broadcast)."""
            if self._cwtrain is None:
                collective: Collective = TorchCollective() if _distributed() else SingleProcess()
                config: HookConfig | str | None = None
                if collective.rank == 0:
                    try:
                        config = SlimeRuntime.current().hook_config(self.args)
                    except Exception as exc:  # the other ranks wait in the broadcast: tell them
                        config = f"{type(exc).__name__}: {exc}"
                config = collective.broadcast_object(config)
                if not isinstance(config, HookConfig):
                    raise CWTrainError(f"cwtrain publishing is misconfigured: {config}")
                start = int(getattr(self.args, "update_weight_start_version", 0) or 0)
                self._cwtrain = TensorPublisher(config, collective, start_version=start)
            return self._cwtrain

        def cwtrain_named_tensors(self) -> Iterator[tuple[str, Any]]:
            """The HF-named tensors this rank holds, gathered the way slime's updaters do."""
            updater = self.weight_updater
            if not hasattr(updater, "_is_pp_src_rank"):
                updater._is_pp_src_rank = _is_pp_source()
            for chunks in (updater._iter_non_expert_chunks(), updater._iter_expert_chunks()):
                for chunk in chunks:
                    yield from chunk

        def update_weights(self) -> None:
            args = self.args
            if getattr(args, "debug_train_only", False) or getattr(args, "debug_rollout_only", False):
                return
            metrics = self.cwtrain_publisher().publish(args, self.cwtrain_named_tensors())
            sink = getattr(getattr(self, "weight_updater", None), "update_weight_metrics", None)
            if metrics and isinstance(sink, dict):
                sink.update(metrics)

    CoreWeaveTrainRayActor.__qualname__ = CoreWeaveTrainRayActor.__name__
    return CoreWeaveTrainRayActor


def _distributed() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _is_pp_source() -> bool:
    """DP rank 0 and TP rank 0 of its pipeline stage (the ranks holding gathered HF tensors)."""
    try:
        from megatron.core import mpu  # type: ignore[import-not-found]
    except ImportError:
        return True
    return bool(
        mpu.get_data_parallel_rank(with_context_parallel=True) == 0 and mpu.get_tensor_model_parallel_rank() == 0
    )
