"""The distributed share protocol, written once: :func:`publish_shares` over a transport of the framework's.

One version published by every rank (snapshot-format.md section 5.1: each rank its shards, one
index) is the same sequence whatever carries it; the committing process (rank 0, or a driver)
runs it, and each rank's side is :class:`~cwtrain.hotload.lifecycle.rank.RankShare`'s step::

    encode   every rank encodes its share and keeps it; reports its shard bytes and file count
    weigh    the session weighs the delta (the cost rule of ``auto``): a delta, or FULL?
    cut      (a delta cut FULL) every rank builds its FULL share from its served copy
    store    every rank uploads its shards, numbered from every rank's file count (no index)
    commit   the session writes the index and runs the version's cycle (PublishSession.commit_shares)
    settle   every rank commits its new served copy (served) or discards it (failed), and a failure
             on the committing process is raised on every rank

A framework supplies only the transport, :class:`Ranks`: how the committing process reaches
every rank's step and gets every rank's :class:`~cwtrain.hotload.lifecycle.shares.ShareResult`
back. Two come with core:

* :class:`SpmdRanks`: the ranks of one process group, all running the protocol in step (slime's
  live tensors): rank 0 sends each step over :meth:`Collective.broadcast_object` and gathers the
  results with :meth:`Collective.all_gather_object`; the other ranks :meth:`SpmdRanks.follow`.
  :func:`publish_spmd` is both sides in one call, and :func:`publish_baseline_spmd` version 0.
* a driver's calls on its workers (NeMo-RL's Ray workers): the plug-in maps each step to one
  worker method (``cwtrain.integrations.nemo_rl``).

:class:`Collective` is the two collectives SPMD needs, which :class:`TorchCollective`
implements over ``torch.distributed`` (a group, or a function that finds the current one) and
:class:`SingleProcess` for a world of one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from typing import Any, Protocol

from cwtrain.errors import CWTrainError
from cwtrain.hotload.lifecycle.rank import Chunk, RankShare
from cwtrain.hotload.lifecycle.session import PublishSession
from cwtrain.hotload.lifecycle.shares import SharePlan, ShareResult
from cwtrain.hotload.lifecycle.version import PublishOutcome, VersionPlan
from cwtrain.infra.s3 import ObjectStoreLike

__all__ = [
    "Collective",
    "Ranks",
    "SingleProcess",
    "SpmdRanks",
    "TorchCollective",
    "publish_baseline_spmd",
    "publish_shares",
    "publish_spmd",
]

log = logging.getLogger(__name__)

SideFiles = Mapping[str, bytes] | Callable[[], Mapping[str, bytes]] | None
"""A FULL snapshot's side files (``config.json``, tokenizer), or a function that reads them."""


class Ranks(Protocol):
    """How the committing process reaches every rank's :class:`RankShare` (the framework's transport).

    Each call runs one step on every rank and returns every rank's result, in rank order.
    """

    def encode(self, plan: SharePlan) -> list[ShareResult]:
        """Every rank encodes its share of ``plan``'s version and keeps it."""
        ...

    def cut(self, plan: SharePlan) -> list[ShareResult]:
        """Every rank builds its FULL share (``plan`` is FULL) from its served copy."""
        ...

    def store(self, plan: SharePlan, counts: list[int]) -> list[ShareResult]:
        """Every rank uploads its kept share (``counts``: every rank's file count, in rank order)."""
        ...

    def settle(self, served: bool, error: str | None) -> None:
        """Every rank commits (``served``) or discards its new served copy; ``error`` ends the others' wait."""
        ...


def publish_shares(
    session: PublishSession, plan: VersionPlan, ranks: Ranks, *, files: SideFiles = None
) -> PublishOutcome:
    """Publish ``plan``'s version from every rank's share: the protocol of the module docstring.

    Args:
        session: the run's session (on the committing process).
        plan: the version, from ``session.begin``.
        ranks: the transport to every rank.
        files: the side files of a FULL snapshot, or a function reading them (asked before any
            upload of a FULL, so a missing ``config.json`` fails first).

    Returns:
        the outcome, also of a failed hot-load the fleet was brought back from (every rank
        then discards its new served copy).

    Raises:
        CWTrainError: publishing failed (every rank is told, and raises too); the session
            recorded the version as failed.
    """
    served, error, committed = False, None, False
    try:
        side = _side_files(files) if plan.full else None
        store, workers = session.target.store, session.settings.upload_workers
        share_plan = SharePlan.of(plan, store, upload_workers=workers)
        results = ranks.encode(share_plan)
        if not _failed(results):
            weighed = session.weigh(plan, sum(result.payload_bytes for result in results))
            if weighed.full and not plan.full:
                side = _side_files(files)
                plan, share_plan = weighed, SharePlan.of(weighed, store, upload_workers=workers)
                results = ranks.cut(share_plan)
        if not _failed(results):
            results = ranks.store(share_plan, [result.files for result in results])
        committed = True
        outcome = session.commit_shares(plan, results, extra_files=side)
        served = not outcome.failed
        return outcome
    except BaseException as exc:
        said = str(exc)
        error = (
            said
            if said.startswith(f"publishing {plan.identity} failed")
            else f"publishing {plan.identity} failed: {said}"
        )
        if not committed:  # the session records the version as failed (the sink hears of it)
            with suppress(CWTrainError):
                session.commit_shares(plan, [ShareResult(rank=0, error=f"{type(exc).__name__}: {exc}")])
        raise
    finally:
        ranks.settle(served, error)


def _failed(results: Iterable[ShareResult]) -> bool:
    return any(result.error for result in results)


def _side_files(files: SideFiles) -> Mapping[str, bytes] | None:
    return files() if callable(files) else files


# ------------------------------------------------------------------------------ SPMD


class Collective(Protocol):
    """The collectives of a distributed publish (a plug-in implements them over its process group)."""

    rank: int
    world_size: int

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        ...

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``src``'s ``obj`` on every rank."""
        ...


class SingleProcess:
    """A world of one (tests, single-process runs)."""

    rank = 0
    world_size = 1

    def all_gather_object(self, obj: Any) -> list[Any]:
        """``[obj]``."""
        return [obj]

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj``."""
        return obj


class TorchCollective:
    """Collectives over ``torch.distributed``.

    Args:
        group: the process group, or a function that returns the current one (a framework
            that re-creates its group, as slime does when it offloads the trainer, is asked at
            every call); ``None`` (or a function answering ``None``): the default group.
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
        return self._group() if callable(self._group) else self._group

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


ObjectStoreSource = ObjectStoreLike | Callable[[], ObjectStoreLike] | None
"""A rank's object store, or a function that builds it when the rank first stores (``None``: from the environment)."""


class SpmdRanks:
    """The ranks of one process group, all running the protocol in step (see the module docstring).

    Args:
        collective: the group's collectives.
        share: this rank's share.
        chunks: this rank's tensors for this version, in chunks (drawn once, at the encode).
        s3: this rank's object store, or a function that builds it (called when it first
            stores, so a failure to build it is reported like any other).
    """

    def __init__(
        self, collective: Collective, share: RankShare, chunks: Iterable[Chunk], s3: ObjectStoreSource
    ) -> None:
        self.collective = collective
        self.share = share
        self.chunks = chunks
        self._s3 = s3

    def _objects(self) -> ObjectStoreLike | None:
        return self._s3() if callable(self._s3) else self._s3

    def _step(self, step: str, plan: SharePlan, counts: list[int] | None = None) -> ShareResult:
        """This rank's side of one step."""
        if step == "encode":
            return self.share.encode_chunks(plan, self.chunks)
        if step == "cut":
            return self.share.cut(plan)
        try:
            objects = self._objects()
        except Exception as exc:
            self.share.discard()
            return ShareResult(
                rank=self.collective.rank, error=f"rank {self.collective.rank}: {type(exc).__name__}: {exc}"
            )
        return self.share.store_encoded(plan, counts or [], objects)

    def _run(self, step: str, plan: SharePlan, counts: list[int] | None = None) -> list[ShareResult]:
        self.collective.broadcast_object((step, plan, counts))
        return self.collective.all_gather_object(self._step(step, plan, counts))

    def encode(self, plan: SharePlan) -> list[ShareResult]:
        """Every rank encodes its chunks."""
        return self._run("encode", plan)

    def cut(self, plan: SharePlan) -> list[ShareResult]:
        """Every rank builds its FULL share from its served copy."""
        return self._run("cut", plan)

    def store(self, plan: SharePlan, counts: list[int]) -> list[ShareResult]:
        """Every rank uploads its share."""
        return self._run("store", plan, counts)

    def settle(self, served: bool, error: str | None) -> None:
        """Every rank commits or discards its new served copy; the others raise ``error``."""
        self.collective.broadcast_object(("settle", served, error))
        _settle(self.share, served)

    def follow(self) -> None:
        """A rank other than the committing one: run each step rank 0 sends, until it settles the version.

        Raises:
            CWTrainError: publishing failed on the committing process (its error).
        """
        while True:
            step, *rest = self.collective.broadcast_object(None)
            if step == "settle":
                served, error = rest
                _settle(self.share, served)
                if error is not None:
                    raise CWTrainError(error)
                return
            plan, counts = rest
            self.collective.all_gather_object(self._step(step, plan, counts))


def _settle(share: RankShare, served: bool) -> None:
    if served:
        share.commit()
    else:
        share.discard()  # the new served copy was never served: the next version is FULL


def publish_spmd(
    collective: Collective,
    share: RankShare,
    chunks: Iterable[Chunk],
    *,
    session: PublishSession | None = None,
    plan: VersionPlan | None = None,
    s3: ObjectStoreSource = None,
    extra_files: SideFiles = None,
) -> PublishOutcome | None:
    """Publish one version from every rank's ``chunks``; every rank calls it, in step.

    Rank 0 holds the ``session`` and the version's ``plan`` and drives :func:`publish_shares`
    over :class:`SpmdRanks`; every other rank follows it. A failure anywhere raises on every rank.

    Args:
        collective: rank, world size and object collectives.
        share: this rank's :class:`RankShare`.
        chunks: this rank's tensors, in chunks.
        session: rank 0's session.
        plan: rank 0's plan of this version (from ``session.begin``).
        s3: the object store of ranks other than 0, or a function that builds it (rank 0
            stores through its session's target).
        extra_files: side files of a FULL snapshot (rank 0), or a function reading them.

    Returns:
        the outcome on rank 0, ``None`` elsewhere.

    Raises:
        CWTrainError: publishing failed on some rank (raised on every rank).
    """
    if collective.rank != 0:
        SpmdRanks(collective, share, chunks, s3).follow()
        return None
    if session is None or plan is None:
        message = "rank 0 of a distributed publish needs the session and the version's plan"
        SpmdRanks(collective, share, chunks, s3).settle(False, message)
        raise CWTrainError(message)
    ranks = SpmdRanks(collective, share, chunks, lambda: session.target.store.s3)
    return publish_shares(session, plan, ranks, files=extra_files)


def publish_baseline_spmd(
    collective: Collective,
    share: RankShare,
    chunks: Iterable[Chunk],
    checkpoint: str | os.PathLike[str],
    *,
    session: PublishSession | None = None,
) -> PublishOutcome | None:
    """Version 0 from every rank in step: rank 0 publishes ``checkpoint`` as the baseline, every rank starts from it.

    Rank 0's session publishes the checkpoint (``PublishSession.publish_baseline``: kept when an
    identical one completed); once every rank knows it succeeded, each rank's served copy is
    read from the checkpoint for the tensors of its ``chunks``
    (:meth:`~cwtrain.hotload.lifecycle.rank.RankShare.seed_from_checkpoint`).

    Returns:
        the baseline's outcome on rank 0, ``None`` elsewhere.

    Raises:
        CWTrainError: publishing the baseline failed (raised on every rank).
    """
    outcome: PublishOutcome | None = None
    error: str | None = None
    if collective.rank == 0:
        try:
            if session is None:
                raise CWTrainError("rank 0 of a distributed publish needs the session")
            outcome = session.publish_baseline(checkpoint)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    errors = [e for e in collective.all_gather_object(error) if e]
    if errors:
        raise CWTrainError(f"publishing the baseline failed: {errors[0]}")
    share.seed_from_checkpoint(checkpoint, chunks)
    return outcome
