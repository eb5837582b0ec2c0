"""The hot-load cycle of one snapshot: chain check, upload, create, wait, verify, rollback.

:class:`~cwtrain.hotload.loader.HotLoader` is a thin front over these functions, and
:class:`~cwtrain.hotload.lifecycle.session.PublishSession` drives them for every version of a
run; each takes a :class:`Target` (the client, the deployment, its snapshot store) and one
:class:`~cwtrain.polling.Budget` for the whole call, so nothing here calls back into the
loader::

    target = Target(client, deployment_id, store, poll_interval=5.0)
    hot_load = publish_snapshot(target, "ckpt/step-7", "run1-v000007", budget=Budget(1800))
    hot_load = create_hot_load(target, "run1-v000008", kind=SnapshotType.INCREMENTAL,
                               previous_identity="run1-v000007", budget=Budget(600))
    hot_load = wait_for_hot_load(client, hot_load.id, budget, interval=5.0)

The route of a publish, module by module (each visited once): identity rules
(:mod:`~cwtrain.hotload.format.identity`) → the snapshot (a directory:
:mod:`~cwtrain.hotload.files.validate`; tensors: :mod:`~cwtrain.hotload.codec.encode` inside
:mod:`~cwtrain.hotload.store.prefix`) → chain rules (:mod:`~cwtrain.hotload.format.chain`, over
the deployment's listing) → :mod:`~cwtrain.hotload.store.prefix` →
:mod:`~cwtrain.hotload.store.snapshot_upload` (objects, index last) → the API client (create, with
single-flight and readiness handled here) → :mod:`~cwtrain.hotload.follow` (the wait).

Single-flight: when the service says another hot-load is in progress, :func:`create_hot_load`
adopts it if it is this request's earlier attempt (same ``hotLoadId``), otherwise waits for it
to end and re-sends with the same id. Readiness: a create refused with ``failed_precondition``
while the deployment is not READY (the service may refuse hot-loads then) waits for READY and
retries, saying so; a deployment that accepts hot-loads while in ERROR (a hot-load is the way
back) gets the hot-load at once. All of it inside the one budget.

Deadlines: the budget covers the upload too (each object-store call is bounded by what is
left, :func:`cwtrain.infra.objectstore.within`); a budget spent before a hot-load is created
raises :class:`~cwtrain.errors.PublishTimeoutError` (or, after waiting for another hot-load,
:class:`~cwtrain.errors.HotLoadInProgressError`) and no create is sent after that: a caller
told that its publish failed never has a hot-load created on its behalf. A create that went
out is followed to its end: when its answer comes as the budget runs out (less than one poll
interval left), the budget is extended by its own length, with a warning, so that the wait
reports how the hot-load really ended; a wait that still runs out raises
:class:`~cwtrain.errors.HotLoadTimeoutError`, whose message says the hot-load exists and may
still go live.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from cwtrain.errors import (
    APIError,
    CWTrainError,
    FailedPreconditionError,
    HotLoadFailedError,
    HotLoadInProgressError,
    HotLoadVerificationError,
    PublishTimeoutError,
    SnapshotError,
    TransportError,
    UsageError,
)
from cwtrain.hotload.follow import ProgressEvent, UploadProgress, wait_for_hot_load, wait_until_terminal
from cwtrain.hotload.format import chain
from cwtrain.hotload.format.identity import validate_identity
from cwtrain.hotload.store.prefix import SnapshotStore, StoredSnapshot
from cwtrain.infra.client import InferenceClient
from cwtrain.infra.enums import HotLoadState, PromptCachePolicy, ResourceStatus, SnapshotType
from cwtrain.infra.models import HotLoad, HotLoadReplica, IncrementalSnapshotMetadata
from cwtrain.infra.objectstore import ObjectStoreDeadlineError
from cwtrain.polling import Budget

if TYPE_CHECKING:
    from cwtrain.hotload.files.validate import SnapshotInfo

__all__ = [
    "Target",
    "check_chain",
    "completed_hot_load",
    "create_hot_load",
    "follow",
    "hot_loads_newest_first",
    "publish_snapshot",
    "reactivate",
    "rollback",
    "upload_deadline",
    "upload_directory",
    "verify_served",
]

log = logging.getLogger(__name__)

#: Deployment statuses a hot-load may be created in (ERROR: a hot-load is the way back).
_ACCEPTS_HOT_LOADS = frozenset({ResourceStatus.READY, ResourceStatus.ERROR})
#: Statuses a deployment never leaves by waiting.
_FINAL = frozenset({ResourceStatus.FAILED, ResourceStatus.DELETING})


class Target:
    """Where a cycle runs: the API client, the deployment and its snapshot store.

    Args:
        client: the API client.
        deployment_id: the deployment (with a ``hotLoad`` block).
        store: its snapshot store (bucket, prefix, object store), or a function that
            builds it, called on first use (so misuse is refused before any I/O).
        poll_interval: seconds between polls of the API.
    """

    def __init__(
        self,
        client: InferenceClient,
        deployment_id: str,
        store: SnapshotStore | Callable[[], SnapshotStore],
        poll_interval: float = 5.0,
    ) -> None:
        self.client = client
        self.deployment_id = deployment_id
        self.poll_interval = poll_interval
        self._store = store

    @functools.cached_property
    def store(self) -> SnapshotStore:
        """The deployment's snapshot store (built on first use)."""
        store = self._store
        return store if isinstance(store, SnapshotStore) else store()


# ------------------------------------------------------------------------------ listings


def hot_loads_newest_first(target: Target) -> list[HotLoad]:
    """Every hot-load of the deployment, newest first (sorted by ``createdAt``, stable for ties)."""
    items = list(target.client.list_hot_loads(target.deployment_id))
    return sorted(items, key=lambda h: h.created_at.timestamp() if h.created_at else 0.0, reverse=True)


def completed_hot_load(target: Target, identity: str | None = None) -> HotLoad | None:
    """The newest COMPLETED hot-load (of ``identity`` when given), if any."""
    return next(
        (
            h
            for h in hot_loads_newest_first(target)
            if h.state is HotLoadState.COMPLETED and (identity is None or h.identity == identity)
        ),
        None,
    )


def _active_or_none(target: Target) -> HotLoad | None:
    """The newest unfinished hot-load, ``None`` when none (or when the listing failed transiently)."""
    try:
        return next((h for h in hot_loads_newest_first(target) if not h.terminal), None)
    except (APIError, TransportError) as error:
        if not error.transient:
            raise
        log.warning("cannot list hot-loads (%s)", error)
        return None


def check_chain(target: Target, identity: str, previous_identity: str) -> None:
    """Refuse a delta on ``previous_identity`` whose chain would pass the cold-start limit.

    Raises:
        SnapshotError: the chain would hold more than 63 deltas; publish FULL.
    """
    deltas = chain.deltas_after(hot_loads_newest_first(target), previous_identity)
    chain.check_delta_allowed(identity, previous_identity, deltas)


# ------------------------------------------------------------------------------ upload


def upload_directory(
    target: Target,
    checkpoint: str | os.PathLike[str] | SnapshotInfo,
    identity: str,
    *,
    previous_identity: str | None = None,
    workers: int = 8,
    on_progress: Callable[[ProgressEvent], None] | None = None,
    budget: Budget | None = None,
) -> StoredSnapshot:
    """Inspect a snapshot directory and upload it under ``identity`` (no hot-load).

    A delta is checked against the chain limit before anything is written. The result's
    ``info`` is the inspected directory. ``budget`` bounds every object-store call.

    Raises:
        SnapshotError: an invalid directory or identity, ``previous_identity`` beside a
            ``SnapshotInfo``, or a chain too long.
        PublishTimeoutError: ``budget`` ran out during the upload.
    """
    from cwtrain.hotload.files.validate import SnapshotInfo, inspect_snapshot

    validate_identity(identity)
    if isinstance(checkpoint, SnapshotInfo):
        if previous_identity is not None:
            raise SnapshotError("pass previous_identity to inspect_snapshot, not together with its SnapshotInfo")
        info = checkpoint
    else:
        info = inspect_snapshot(os.fspath(checkpoint), previous_identity=previous_identity)
    kind, previous = chain.resolve_type(info, None, None)
    if kind is SnapshotType.INCREMENTAL and previous:
        check_chain(target, identity, previous)
    events = UploadProgress(identity, info.total_bytes, on_progress) if on_progress is not None else None
    with upload_deadline(identity, budget):
        stored = target.store.upload(info, identity, workers=workers, on_progress=events, deadline=budget)
    if events is not None:
        events.finish()
    return stored


@contextlib.contextmanager
def upload_deadline(identity: str, budget: Budget | None) -> Iterator[None]:
    """An upload whose object-store deadline passed raises :class:`~cwtrain.errors.PublishTimeoutError`."""
    try:
        yield
    except ObjectStoreDeadlineError as exc:
        if budget is None:
            raise
        raise PublishTimeoutError(identity, budget.total, "upload", str(exc)) from exc


# ------------------------------------------------------------------------------ create


def create_hot_load(
    target: Target,
    identity: str,
    info: SnapshotInfo | None = None,
    *,
    previous_identity: str | None = None,
    snapshot_type: SnapshotType | None = None,
    prompt_cache_policy: PromptCachePolicy | str | None = None,
    hot_load_id: str | None = None,
    wait_for_active: bool = True,
    verify: bool = False,
    budget: Budget,
) -> HotLoad:
    """Create the hot-load of an uploaded snapshot, with single-flight and readiness handling.

    The type comes from ``info``, else ``snapshot_type``, else INCREMENTAL iff
    ``previous_identity``. Does not wait for completion. With ``verify``, the stored objects
    of ``identity`` are first read back and checked against the SHA-256 each was uploaded
    with, and a FULL snapshot's tensors against their Adler-32s (skipped when no index is
    stored).

    Raises:
        SnapshotError: misuse (``previous_identity`` with ``info`` or with FULL,
            INCREMENTAL without it, an invalid identity, a chain too long).
        SnapshotChecksumError: with ``verify``, a stored object is not what was uploaded.
        HotLoadInProgressError: another hot-load was still running when the budget ran out.
        FailedPreconditionError: refused for another reason (or the deployment never became
            READY within the budget).
        PublishTimeoutError: the budget was spent before the first create could be sent.

    No create is sent once the budget is spent; a create answered with less than one poll
    interval left extends ``budget`` by its length (see the module docstring).
    """
    validate_identity(identity)
    kind, previous = chain.resolve_type(info, previous_identity, snapshot_type)
    incremental = None
    if kind is SnapshotType.INCREMENTAL:
        assert previous is not None
        validate_identity(previous, what="previous identity", allow_reserved=previous == "initial")
        check_chain(target, identity, previous)
        incremental = IncrementalSnapshotMetadata(previous)
    policy = PromptCachePolicy.parse(prompt_cache_policy)
    if verify:
        from cwtrain.hotload.store.snapshot_verify import verify_stored_snapshot

        checked = verify_stored_snapshot(target.store, identity)
        if checked is not None:
            log.info("verified %s: %d objects, %d tensors", checked.uri, checked.objects, checked.tensors)
    hot_load_id = hot_load_id or str(uuid.uuid4())
    waited_for_ready = False
    refused: Exception | None = None  # the last refusal, raised when the budget ends a wait for a retry
    while True:
        if budget.spent:  # never create after the deadline: the caller is told it failed
            if refused is not None:
                raise refused
            raise PublishTimeoutError(identity, budget.total, "create")
        try:
            created = target.client.create_hot_load(
                target.deployment_id,
                identity,
                snapshot_type=kind,
                incremental=incremental,
                prompt_cache_policy=policy,
                hot_load_id=hot_load_id,
            )
            return _follow_late_create(target, created, budget)
        except FailedPreconditionError as error:
            active = _active_or_none(target)
            if active is not None and active.id == hot_load_id:
                log.info("hot-load %s is this request's earlier attempt; adopting it", hot_load_id)
                return _follow_late_create(target, active, budget)
            if active is None and not isinstance(error, HotLoadInProgressError):
                waited_for_ready = _wait_until_accepting(target, error, budget, retry_once=waited_for_ready)
                refused = error
                continue
            busy = HotLoadInProgressError(
                "failed_precondition",
                f"another hot-load ({active.id if active else 'unknown'}) of deployment "
                f"{target.deployment_id} is already in progress"
                + (f" after waiting {budget.elapsed:.0f}s" if wait_for_active else "")
                + "; wait for it or retry later; no hot-load was created",
                http_status=error.http_status,
            )
            if not wait_for_active or budget.spent:
                raise busy from None
            refused = busy
            if active is not None:
                log.info(
                    "hot-load %s (%r) is in progress; waiting for it before creating %s",
                    active.id,
                    active.identity,
                    hot_load_id,
                )
                wait_until_terminal(target.client, active.id, budget, interval=target.poll_interval)
            else:
                budget.sleep(target.poll_interval)


def _follow_late_create(target: Target, hot_load: HotLoad, budget: Budget) -> HotLoad:
    """A create answered as the budget ran out: extend the budget so the hot-load is followed to its end.

    The create went out, so the hot-load may go live; reporting a timeout at once would tell
    the caller it failed while the fleet serves it.
    """
    if budget.remaining < target.poll_interval and not hot_load.terminal:
        log.warning(
            "hot-load %s of %r was created as the budget of %gs ran out; it may go live, so it is followed "
            "to its end (up to %gs more)",
            hot_load.id,
            hot_load.identity,
            budget.total,
            budget.total,
        )
        budget.extend(budget.total)
    return hot_load


def _wait_until_accepting(target: Target, error: FailedPreconditionError, budget: Budget, *, retry_once: bool) -> bool:
    """After a refusal that is not single-flight: wait while the deployment is not READY, else re-raise.

    A deployment that is not ready (creating, updating) may become so: wait, logging why,
    and let the caller retry within the budget; returns ``True`` then. One that is READY (or
    in ERROR, which accepts hot-loads) refused for another reason (an unknown predecessor, a
    missing file), which is final, unless it was not ready at the previous refusal
    (``retry_once``): then it has just become ready and gets one more try (``False``).

    Raises:
        FailedPreconditionError: ``error``, when it is final or the budget is spent.
    """
    try:
        status = target.client.get_deployment(target.deployment_id).status
    except (APIError, TransportError) as read_error:
        if not read_error.transient or budget.spent:
            raise error from None
        log.warning("cannot read deployment %s (%s); retrying the hot-load", target.deployment_id, read_error)
        budget.sleep(target.poll_interval)
        return retry_once
    if status in _ACCEPTS_HOT_LOADS and retry_once and not budget.spent:
        return False
    if status in _ACCEPTS_HOT_LOADS or status in _FINAL or budget.spent:
        raise error
    log.info(
        "deployment %s is %s and refused the hot-load (%s); waiting for it to be READY (%.0fs left)",
        target.deployment_id,
        status.wire,
        error,
        budget.remaining,
    )
    budget.sleep(target.poll_interval)
    return True


# ------------------------------------------------------------------------------ verify


def verify_served(target: Target, hot_load_id: str, identity: str) -> list[HotLoadReplica]:
    """Every replica READY on ``identity``, else :class:`HotLoadVerificationError`."""
    replicas = target.client.list_hot_load_replicas(hot_load_id)
    problems = [
        f"{r.name}: {r.state.name} on {r.current_snapshot_identity or '?'!r}"
        + (f" ({r.error_reason})" if r.error_reason else "")
        for r in replicas
        if not r.caught_up(identity)
    ]
    if not replicas:
        problems = ["no replicas listed"]
    if problems:
        hot_load = target.client.get_hot_load(hot_load_id)
        raise HotLoadVerificationError(hot_load, replicas, problems)
    return replicas


# ------------------------------------------------------------------------------ publish


def publish_snapshot(
    target: Target,
    checkpoint: str | os.PathLike[str] | SnapshotInfo | Mapping[str, Any],
    identity: str,
    *,
    previous_identity: str | None = None,
    prompt_cache_policy: PromptCachePolicy | str | None = None,
    wait: bool = True,
    budget: Budget,
    workers: int = 8,
    on_progress: Callable[[ProgressEvent], None] | None = None,
    base: Mapping[str, Any] | None = None,
    hot_load_id: str | None = None,
    extra_files: Mapping[str, bytes] | None = None,
    on_failure: str = "stop",
) -> HotLoad:
    """Upload a snapshot (a directory, its ``SnapshotInfo``, or in-memory tensors), create its hot-load, wait.

    See :meth:`cwtrain.hotload.loader.HotLoader.publish` for the arguments. With
    ``on_failure="reactivate"`` a hot-load that ends FAILED or CANCELED is followed by
    :func:`reactivate` before its error is raised.
    """
    validate_identity(identity)
    if previous_identity:  # before anything is listed, encoded or uploaded
        validate_identity(previous_identity, what="previous identity", allow_reserved=previous_identity == "initial")
    info: SnapshotInfo | None = None
    kind: SnapshotType | None = None
    if isinstance(checkpoint, Mapping):
        if previous_identity:
            check_chain(target, identity, previous_identity)
        with upload_deadline(identity, budget):
            kind = target.store.upload_tensors(
                checkpoint,
                identity,
                previous_identity=previous_identity,
                base=base,
                workers=workers,
                extra_files=extra_files,
                deadline=budget,
            ).snapshot_type
    else:
        info = upload_directory(
            target,
            checkpoint,
            identity,
            previous_identity=previous_identity,
            workers=workers,
            on_progress=on_progress,
            budget=budget,
        ).info
        previous_identity = None
    hot_load = create_hot_load(
        target,
        identity,
        info,
        previous_identity=previous_identity,
        snapshot_type=kind,
        prompt_cache_policy=prompt_cache_policy,
        hot_load_id=hot_load_id,
        budget=budget,
    )
    if not wait:
        return hot_load
    return follow(target, hot_load.id, budget, on_failure=on_failure, on_progress=on_progress)


def follow(
    target: Target,
    hot_load_id: str,
    budget: Budget,
    *,
    on_failure: str = "stop",
    on_progress: Callable[[ProgressEvent], None] | None = None,
) -> HotLoad:
    """Wait for hot-load ``hot_load_id`` to end; with ``on_failure="reactivate"``, bring the fleet back if it failed.

    Raises:
        HotLoadFailedError: it ended FAILED or CANCELED (after the re-activation, which the
            message names, when asked for).
        HotLoadTimeoutError: the budget ran out first.
    """
    try:
        return wait_for_hot_load(
            target.client, hot_load_id, budget, interval=target.poll_interval, on_progress=on_progress
        )
    except HotLoadFailedError as error:
        if on_failure != "reactivate":
            raise
        back = reactivate(target, error.hot_load.identity, budget=Budget(budget.total))
        raise HotLoadFailedError(
            error.hot_load, error.replicas, f"{error}; every replica serves {back.identity!r} again (re-activated)"
        ) from error
    except KeyboardInterrupt:  # Ctrl-C, or the CLI's SIGTERM: the hot-load runs on without us
        log.warning(
            "stopped waiting for hot-load %s: it keeps running and may still go live (follow it with "
            "`cwtrain hotload wait %s`)",
            hot_load_id,
            hot_load_id,
        )
        raise


def rollback(
    target: Target,
    identity: str,
    *,
    prompt_cache_policy: PromptCachePolicy | str | None = None,
    hot_load_id: str | None = None,
    wait: bool = True,
    budget: Budget,
) -> HotLoad:
    """Re-activate ``identity``: a new hot-load copying its newest COMPLETED one.

    See :meth:`cwtrain.hotload.loader.HotLoader.rollback`.
    """
    validate_identity(identity)
    prior = completed_hot_load(target, identity)
    if prior is None:
        raise UsageError(
            f"no COMPLETED hot-load of {identity!r} on deployment {target.deployment_id}; "
            "only identities that were served can be rolled back to (see `cwtrain hotload list`)"
        )
    missing = _missing_objects(target, prior)
    store = target.store
    if missing:
        raise SnapshotError(
            f"cannot roll back to {identity!r}: the snapshot objects of {', '.join(map(repr, missing))} are gone "
            f"from s3://{store.bucket}/{store.path_prefix}; publish the weights again under a new identity"
        )
    policy = prompt_cache_policy if prompt_cache_policy is not None else prior.prompt_cache_policy
    hot_load = create_hot_load(
        target,
        identity,
        snapshot_type=prior.type,
        previous_identity=prior.previous_identity,
        prompt_cache_policy=policy,
        hot_load_id=hot_load_id,
        budget=budget,
    )
    if not wait:
        return hot_load
    return wait_for_hot_load(target.client, hot_load.id, budget, interval=target.poll_interval)


def _missing_objects(target: Target, hot_load: HotLoad) -> list[str]:
    """The identities of ``hot_load``'s chain (itself, for a FULL) whose index is no longer stored."""
    identities = [ref.identity for ref in hot_load.snapshot_chain] or [hot_load.identity]
    return [identity for identity in identities if not target.store.index_exists(identity)]


def reactivate(target: Target, failed_identity: str, *, budget: Budget) -> HotLoad:
    """Bring every replica back to one identity after a failed hot-load of ``failed_identity``.

    The newest identity other than ``failed_identity`` that completed on this deployment and
    whose objects (and its chain's) are still in the bucket is hot-loaded again
    (:func:`rollback`), waited for, and checked: every replica READY on it.

    Returns:
        the completed re-activation.

    Raises:
        CWTrainError: no completed identity to go back to (the error of each candidate tried
            is named), or the re-activation itself failed.
    """
    tried: list[str] = []
    seen: set[str] = set()
    for hot_load in hot_loads_newest_first(target):
        identity = hot_load.identity
        if hot_load.state is not HotLoadState.COMPLETED or identity == failed_identity or identity in seen:
            continue
        seen.add(identity)
        missing = _missing_objects(target, hot_load)
        if missing:
            tried.append(f"{identity} (objects gone: {', '.join(missing)})")
            continue
        log.warning(
            "hot-load of %r failed: re-activating %r, the newest intact identity that completed, on every replica",
            failed_identity,
            identity,
        )
        done = rollback(target, identity, budget=budget)
        verify_served(target, done.id, identity)
        return done
    raise CWTrainError(
        f"the hot-load of {failed_identity!r} failed and no completed identity of deployment {target.deployment_id} "
        "can be re-activated"
        + (f" (tried: {'; '.join(tried)})" if tried else " (none completed before)")
        + "; publish a FULL snapshot"
    )
