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
  ``CWTRAIN_HOTLOAD_FULL_EVERY`` says (``auto``: rank 0 weighs the ranks' shard bytes against
  the last FULL, and on a cut each rank writes its FULL share from its served copy); empty
  deltas are skipped; the outcome is settled on every rank, so a failure raises on every rank.

All of that is core's distributed share protocol (:func:`~cwtrain.hotload.publish_spmd`,
:func:`~cwtrain.hotload.publish_baseline_spmd`: every rank's :class:`~cwtrain.hotload.RankShare`
in step over :class:`~cwtrain.hotload.TorchCollective`, the base checkpoint read and chunked by
core) and rank 0's :class:`~cwtrain.hotload.PublishSession` (one time budget for the whole
version, ``CWTRAIN_HOTLOAD_VERIFY`` honoured, the same ``hotload/*`` metrics as the disk hook);
this module holds slime's side: its gloo group as the group, its version counter and flags,
and ``--hf-checkpoint`` as the baseline.

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
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from cwtrain.errors import UsageError
from cwtrain.hotload import (
    DEFAULT_CHUNK_BYTES,
    Collective,
    RankShare,
    SingleProcess,
    TorchCollective,
    chunked,
    publish_baseline_spmd,
    publish_spmd,
    side_files,
)
from cwtrain.infra import ObjectStore

from .config import HookConfig
from .publisher import SlimePublisher

if TYPE_CHECKING:
    from cwtrain.hotload import HotLoader

__all__ = ["Chunk", "TensorPublisher", "slime_collective"]

log = logging.getLogger(__name__)

Chunk = Sequence[tuple[str, Any]]
"""HF-named tensors gathered together (one of slime's ``_iter_*_chunks`` buckets)."""


def slime_collective() -> TorchCollective:
    """Core's collectives over slime's gloo group (looked up at every call: slime re-creates it when it offloads)."""
    from .barrier import gloo_group

    return TorchCollective(gloo_group)


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
        self._s3: ObjectStore | None = None
        self.version = start_version
        self.seeded = False
        #: ``--hf-checkpoint``'s side files (``config.json``, tokenizer) that rank 0's FULL cuts carry
        self.full_files: dict[str, bytes] = {}

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.collective.rank

    @property
    def publisher(self) -> SlimePublisher:
        """Rank 0's :class:`SlimePublisher` (its session: the served identity, the cadence, the target)."""
        if self._publisher is None:
            from .runtime import SlimeRuntime

            self._publisher = SlimePublisher(self.config, loader=self._loader)
            SlimeRuntime.current().note_session(self._publisher.session)  # the sample canary refuses through it
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
        session = self.publisher.session if self.rank == 0 else None
        if not self.seeded:
            if args is None:
                raise UsageError("the first publish is the baseline: pass slime's args (--hf-checkpoint)")
            hf_checkpoint = str(args.hf_checkpoint)
            outcome = publish_baseline_spmd(self.collective, self.share, chunks, hf_checkpoint, session=session)
            if self.rank == 0:
                self.full_files = side_files(hf_checkpoint)
            self.seeded = True
            return outcome.metrics() if outcome is not None else None
        self.version += 1
        outcome = publish_spmd(
            self.collective,
            self.share,
            chunks,
            session=session,
            plan=session.begin(self.version) if session is not None else None,
            s3=self._object_store,
            extra_files=self.full_files if self.rank == 0 else None,
        )
        return outcome.metrics() if outcome is not None else None

    def _object_store(self) -> ObjectStore:
        """The object store of a rank other than 0 (rank 0 stores through its session's target)."""
        if self._s3 is None:
            from cwtrain.infra import object_store

            self._s3 = object_store()
        return self._s3
