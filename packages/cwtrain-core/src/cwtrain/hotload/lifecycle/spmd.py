"""One version published by every rank in step (SPMD): :func:`publish_spmd`.

The flow a plug-in's ranks run over its own process group (a :class:`~cwtrain.hotload.lifecycle.shares.Collective`):
rank 0 holds the :class:`~cwtrain.hotload.lifecycle.session.PublishSession` and the version's
plan and shares the plan; every rank encodes its chunks
(:class:`~cwtrain.hotload.lifecycle.shares.RankShare`); the file counts are all-gathered to
number the shards; every rank stores its share; rank 0 commits the index and runs the hot-load
cycle; the outcome is broadcast, so every rank commits or discards its new served copy and a
failure anywhere raises on every rank. No rank leaves the collectives early: an error on one
rank travels through them.

The cost rule of ``CWTRAIN_HOTLOAD_FULL_EVERY=auto`` adds no collective: the plan every rank
receives carries ``cut_at_bytes``, the file-count all-gather also carries each rank's shard
bytes, and every rank compares their sum with it, so all reach rank 0's verdict
(:meth:`~cwtrain.hotload.lifecycle.session.PublishSession.weigh`) without a broadcast. On a cut
each rank builds its FULL share from its served copy
(:meth:`~cwtrain.hotload.lifecycle.shares.RankShare.full_from_served`) and one more
all-gather numbers the FULL shards: the only extra collective, and only for a cut. The delta
is weighed by its shards' bytes (the index, written by rank 0 at the commit, is left out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cwtrain.errors import CWTrainError
from cwtrain.hotload.lifecycle.session import PublishSession
from cwtrain.hotload.lifecycle.shares import (
    Chunk,
    Collective,
    EncodedShare,
    RankShare,
    SharePlan,
    ShareResult,
    number_by_counts,
)
from cwtrain.hotload.lifecycle.version import PublishOutcome, VersionPlan

__all__ = ["publish_spmd"]


def publish_spmd(
    collective: Collective,
    share: RankShare,
    chunks: Iterable[Chunk],
    *,
    session: PublishSession | None = None,
    plan: VersionPlan | None = None,
    s3: Any = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> PublishOutcome | None:
    """Publish one version from every rank's ``chunks``; every rank calls it, in step.

    Rank 0 holds the ``session`` and the version's ``plan``; it shares the plan, every rank
    encodes its chunks, the file counts are all-gathered to number the shards, every rank
    stores its share, rank 0 commits the index and runs the hot-load cycle, and the outcome
    is broadcast: every rank commits or discards its new served copy, and a failure anywhere
    raises on every rank.

    Args:
        collective: rank, world size and object collectives.
        share: this rank's :class:`RankShare`.
        chunks: this rank's tensors, in chunks.
        session: rank 0's session.
        plan: rank 0's plan of this version (from ``session.begin``).
        s3: the object store of ranks other than 0, or a function that builds it (called when
            this rank stores its share, so a failure to build it is reported like any other).
        extra_files: side files of a FULL snapshot (rank 0).

    Returns:
        the outcome on rank 0, ``None`` elsewhere.

    Raises:
        CWTrainError: publishing failed on some rank (raised on every rank).
    """
    rank = collective.rank
    target: SharePlan | str | None = None
    if rank == 0:
        if session is None or plan is None:
            raise CWTrainError("rank 0 of a distributed publish needs the session and the version's plan")
        try:
            target = SharePlan.of(plan, session.target.store, upload_workers=session.settings.upload_workers)
        except Exception as exc:
            target = f"{type(exc).__name__}: {exc}"
    target = collective.broadcast_object(target)
    if not isinstance(target, SharePlan):
        share.discard()
        if rank == 0:
            assert session is not None and plan is not None
            session.commit_shares(plan, [ShareResult(rank=0, error=str(target))])
        raise CWTrainError(f"cannot resolve the snapshot bucket: {target}")
    problem: str | None = None
    encoded: EncodedShare | None = None
    try:
        encoded = share.encode(target, chunks)
    except Exception as exc:  # every rank must reach the collectives below, then all raise
        problem = f"rank {rank}: {type(exc).__name__}: {exc}"
    payload = sum(f.size for f in encoded.files) if encoded else 0
    counts = collective.all_gather_object((len(encoded.files) if encoded else 0, payload, problem))
    problems = [p for _, _, p in counts if p]
    delta_bytes = sum(size for _, size, _ in counts)
    if not problems and target.cuts(delta_bytes):  # every rank sees the same sum: no broadcast needed
        target = target.as_full()
        try:
            if rank == 0:
                assert session is not None and plan is not None
                plan = session.weigh(plan, delta_bytes)
                if not plan.full:
                    raise CWTrainError(
                        f"the session kept {plan.identity} a delta of {delta_bytes} bytes; the ranks cut"
                    )
            assert encoded is not None
            encoded = share.full_from_served(target, encoded)
        except Exception as exc:
            problem = f"rank {rank}: {type(exc).__name__}: {exc}"
        counts = collective.all_gather_object((len(encoded.files) if encoded and not problem else 0, 0, problem))
        problems = [p for _, _, p in counts if p]
    result: ShareResult
    if problems:
        result = ShareResult(rank=rank, error=problems[0])
    else:
        assert encoded is not None
        number_by_counts(encoded, [count for count, _, _ in counts], rank, full=target.full)
        try:
            if rank == 0 and session is not None:
                objects = session.target.store.s3
            else:
                objects = s3() if callable(s3) else s3
            result = share.store(target, encoded, objects)
        except Exception as exc:
            result = ShareResult(rank=rank, error=f"rank {rank}: {type(exc).__name__}: {exc}")
    results = collective.all_gather_object(result)
    outcome: PublishOutcome | None = None
    status: tuple[str, str] = ("served", "")
    if rank == 0:
        assert session is not None and plan is not None
        try:
            outcome = session.commit_shares(plan, results, extra_files=extra_files if target.full else None)
            if outcome.failed:  # the hot-load failed and the fleet was brought back: the run goes on
                status = ("reverted", "")
        except Exception as exc:
            status = ("failed", f"{type(exc).__name__}: {exc}")
    kind, message = collective.broadcast_object(status)
    if kind == "served":
        share.commit()
        return outcome
    share.discard()  # the new served copy was never served: the next version is FULL
    if kind == "failed":
        raise CWTrainError(f"publishing {target.identity} failed: {message}")
    return outcome
