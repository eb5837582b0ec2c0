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
  every rank's served copy from it; a FULL snapshot cuts the chain when
  ``CWTRAIN_HOTLOAD_FULL_EVERY`` says (``auto``: the ranks' shard bytes, summed through the
  all-gather that numbers the shards, are weighed against the last FULL, and on a cut each
  rank writes its FULL share from its served copy); empty deltas are skipped; the outcome is
  broadcast, so a failure raises on every rank.

All of that is core's distributed publisher (:class:`~cwtrain.hotload.RankShare`,
:func:`~cwtrain.hotload.publish_spmd`) and rank 0's :class:`~cwtrain.hotload.PublishSession`
(one time budget for the whole version, ``CWTRAIN_HOTLOAD_VERIFY`` honoured, the same
``hotload/*`` metrics as the disk hook); this module holds slime's side: its gloo group as
the collective, its chunks, and the base checkpoint every rank's served copy starts from.

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
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from cwtrain.errors import CWTrainError, SnapshotError, UsageError
from cwtrain.hotload import (
    Collective,
    FileRegion,
    RankShare,
    SingleProcess,
    TensorData,
    host_copy,
    open_checkpoint,
    publish_spmd,
)

from .config import HookConfig
from .publisher import SlimePublisher

if TYPE_CHECKING:
    from cwtrain.hotload import HotLoader

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


def _nbytes(tensor: Any) -> int:
    if hasattr(tensor, "element_size"):
        return int(tensor.numel() * tensor.element_size())
    return int(tensor.nbytes)


def _read_base(hf_checkpoint: str, names: Iterable[str]) -> tuple[set[str], dict[str, TensorData]]:
    """The tensor names of ``--hf-checkpoint``, and this rank's tensors as served at the baseline (host memory)."""
    import numpy as np

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
        return set(checkpoint.tensors), out


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


class TensorPublisher:
    """Publishes the tensors of every rank as one snapshot per version.

    Args:
        config: the hook's settings (identical on every rank).
        collective: rank, world size and object collectives.
        loader: rank 0's :class:`~cwtrain.hotload.HotLoader` (built from ``config`` when ``None``).
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
        self.share = RankShare(self.collective.rank, self.collective.world_size)
        self._loader = loader
        self._publisher: SlimePublisher | None = None
        self._s3: Any = None
        self.version = start_version
        self.seeded = False

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.collective.rank

    @property
    def publisher(self) -> SlimePublisher:
        """Rank 0's :class:`SlimePublisher` (its session: the served identity, the cadence, the loader)."""
        if self._publisher is None:
            self._publisher = SlimePublisher(self.config, loader=self._loader)
        return self._publisher

    @property
    def served_identity(self) -> str | None:
        """Rank 0's served identity (``None`` on other ranks and before the baseline)."""
        return self._publisher.served_identity if self._publisher is not None else None

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
        if not self.seeded:
            if args is None:
                raise UsageError("the first publish is the baseline: pass slime's args (--hf-checkpoint)")
            return self._baseline(args, chunks)
        self.version += 1
        session = self.publisher.session if self.rank == 0 else None
        plan = session.begin(self.version) if session is not None else None
        outcome = publish_spmd(self.collective, self.share, chunks, session=session, plan=plan, s3=self._object_store)
        return outcome.metrics() if outcome is not None else None

    def _object_store(self) -> Any:
        if self.rank == 0:
            return None  # rank 0 stores through its session's loader
        if self._s3 is None:
            from cwtrain.infra import object_store

            self._s3 = object_store()
        return self._s3

    # ------------------------------------------------------------------ baseline

    def _baseline(self, args: argparse.Namespace, chunks: Iterable[Chunk]) -> dict[str, float] | None:
        """Rank 0 publishes ``--hf-checkpoint`` as ``<run>-v000000``; every rank's served copy starts from it."""
        metrics: dict[str, float] | None = None
        error: str | None = None
        if self.rank == 0:
            try:
                session = self.publisher.session
                metrics = session.publish_baseline(str(args.hf_checkpoint)).metrics()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        errors = [e for e in self.collective.all_gather_object(error) if e]
        if errors:
            raise CWTrainError(f"publishing the baseline failed: {errors[0]}")
        hf_checkpoint = str(args.hf_checkpoint)
        names: list[str] = []
        missing: dict[str, Any] = {}
        in_checkpoint, _ = _read_base(hf_checkpoint, ())
        for chunk in chunks:  # every rank gathers (the gather's collectives need all of them)
            for name, tensor in chunk:
                names.append(name)
                if name not in in_checkpoint:  # as slime does: seed it from the model
                    log.warning("%s is not in --hf-checkpoint; its served copy starts from the trainer's tensor", name)
                    missing[name] = tensor
            del chunk
        _, base = _read_base(hf_checkpoint, names)
        base.update((name, host_copy(name, tensor)) for name, tensor in missing.items())
        self.share.seed(base)
        self.seeded = True
        return metrics
