"""One deployment's hot-load calls: the steps the composer is built from (service-api.md section 8).

A :class:`Target` is where a cycle runs: the API client, the deployment, its snapshot store
and the poll interval. Its methods are the single steps of a version's cycle against the
service, each inside the :class:`~cwtrain.polling.Budget` it is given; the composer
(:class:`~cwtrain.hotload.lifecycle.cycle.VersionCycle`) strings them together, and nothing
here calls back into it::

    target = Target(client, deployment_id, poll_interval=5.0)   # the store: from its hotLoad block
    target.check_delta("run1-v000008", "run1-v000007")     # a delta the service will take
    hot_load = target.create("run1-v000008", SnapshotType.INCREMENTAL, "run1-v000007", budget=budget)

**Single-flight.** When the service says another hot-load is in progress, :meth:`Target.create`
adopts it if it is this request's earlier attempt (same ``hotLoadId``), otherwise waits for it to
end and re-sends with the same id. **Readiness.** A create refused with ``failed_precondition``
while the deployment is not READY (the service may refuse hot-loads then) waits for READY and
retries, saying so; a deployment in ERROR accepts hot-loads (a hot-load is the way back). All of
it inside the one budget.

**Deadlines.** No create is sent once the budget is spent (:class:`~cwtrain.errors.PublishTimeoutError`,
or after waiting for another hot-load :class:`~cwtrain.errors.HotLoadInProgressError`): a caller
told that its publish failed never has a hot-load created on its behalf. A create answered with
less than one poll interval left extends the budget by its own length, with a warning, so that
the wait that follows reports how the hot-load really ended.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cwtrain.errors import (
    APIError,
    ConfigError,
    FailedPreconditionError,
    HotLoadInProgressError,
    PublishTimeoutError,
    SnapshotError,
    TransportError,
)
from cwtrain.hotload.follow import wait_until_terminal
from cwtrain.hotload.format import chain
from cwtrain.hotload.format.identity import RESERVED_IDENTITIES, identity_version
from cwtrain.hotload.lifecycle.settings import HotLoadSettings
from cwtrain.hotload.store.prefix import SnapshotStore
from cwtrain.hotload.store.snapshot_verify import verify_stored_snapshot
from cwtrain.infra.client import InferenceClient
from cwtrain.infra.enums import HotLoadState, PromptCachePolicy, ResourceStatus, SnapshotType
from cwtrain.infra.models import Deployment, HotLoad, HotLoadConfig, IncrementalSnapshotMetadata
from cwtrain.infra.objectstore import ObjectStore, ObjectStoreDeadlineError, ObjectStoreError
from cwtrain.infra.s3 import ObjectStoreLike, as_object_store
from cwtrain.polling import Budget

__all__ = ["POLL_INTERVAL", "RunHistory", "Target", "deployment_store", "require_hot_load", "upload_deadline"]

#: Seconds between hot-load polls of a target built for a run (a hot-load takes seconds to minutes).
POLL_INTERVAL = 1.0

log = logging.getLogger(__name__)

#: Deployment statuses a hot-load may be created in (ERROR: a hot-load is the way back).
_ACCEPTS_HOT_LOADS = frozenset({ResourceStatus.READY, ResourceStatus.ERROR})
#: Statuses a deployment never leaves by waiting.
_FINAL = frozenset({ResourceStatus.FAILED, ResourceStatus.DELETING})


@dataclass(frozen=True)
class RunHistory:
    """What a deployment and its store hold of one run, read when a trainer (re)starts (:meth:`Target.history`).

    Attributes:
        run_id: the run.
        last_hot_loaded: the highest version of the run with a hot-load, whatever its state (-1: none).
        last_stored: the highest version of the run with anything stored under its identity,
            a failed attempt's objects included (-1: none, or the store could not be listed).
        served_identity: the identity of the deployment's newest COMPLETED hot-load, of any run
            (``None``: none completed, the deployment serves its base weights).
        store_listed: the store was listed (``False``: it could not be, and ``last_stored`` is -1).
    """

    run_id: str
    last_hot_loaded: int = -1
    last_stored: int = -1
    served_identity: str | None = None
    store_listed: bool = True

    @property
    def last_version(self) -> int:
        """The highest version of the run found (-1: the run never published here)."""
        return max(self.last_hot_loaded, self.last_stored)


class Target:
    """Where a cycle runs: the API client, the deployment and its snapshot store.

    Args:
        client: the API client.
        deployment_id: the deployment (with a ``hotLoad`` block).
        store: its snapshot store (bucket, prefix, object store), or a function that
            builds it, called on first use (so misuse is refused before any I/O); ``None``:
            read from the deployment's ``hotLoad`` block on first use, on ``s3``.
        poll_interval: seconds between polls of the API.
        s3: the object store (or a boto3 client) of a store read from the deployment;
            default :func:`cwtrain.infra.s3.object_store`.
    """

    def __init__(
        self,
        client: InferenceClient,
        deployment_id: str,
        store: SnapshotStore | Callable[[], SnapshotStore] | None = None,
        poll_interval: float = 5.0,
        *,
        s3: ObjectStoreLike | None = None,
    ) -> None:
        self.client = client
        self.deployment_id = deployment_id
        self.poll_interval = poll_interval
        self._store = store
        self._s3 = s3
        self._known: set[str] = set()  # identities known to be in the bucket (check_delta asks no more)

    def __repr__(self) -> str:
        return f"Target(deployment_id={self.deployment_id!r})"

    def polling(self, poll_interval: float) -> Target:
        """This target (the same store, built once) polled every ``poll_interval`` seconds at most."""
        other = Target(self.client, self.deployment_id, self._store, poll_interval, s3=self._s3)
        other._known = self._known  # one memory of what is stored
        if "store" in self.__dict__:  # built already: shared, not built twice
            other.store = self.store
        if "objects" in self.__dict__:
            other.objects = self.objects
        return other

    @classmethod
    def of_settings(cls, settings: HotLoadSettings) -> Target:
        """A run's target: a new API client (the token from the environment) for its deployment.

        Raises:
            ConfigError: the settings name no deployment.
        """
        if not settings.deployment_id:
            raise ConfigError("no deployment to publish to: set CWTRAIN_HOTLOAD_DEPLOYMENT_ID")
        return cls(settings.client(), settings.deployment_id, poll_interval=POLL_INTERVAL)

    @functools.cached_property
    def objects(self) -> ObjectStore:
        """The object store (``s3`` as given, wrapped; built from the environment on first use)."""
        return self._store.s3 if isinstance(self._store, SnapshotStore) else as_object_store(self._s3)

    @functools.cached_property
    def store(self) -> SnapshotStore:
        """The deployment's snapshot store (built on first use: from its ``hotLoad`` block unless given)."""
        store = self._store
        if store is None:
            deployment = self.client.get_deployment(self.deployment_id)
            require_hot_load(deployment)  # before the object store is built: its error first
            return deployment_store(deployment, self.objects)
        return store if isinstance(store, SnapshotStore) else store()

    # ------------------------------------------------------------------ listings

    def hot_loads(self) -> list[HotLoad]:
        """Every hot-load of the deployment, newest first (sorted by ``createdAt``, stable for ties)."""
        items = list(self.client.list_hot_loads(self.deployment_id))
        return sorted(items, key=lambda h: h.created_at.timestamp() if h.created_at else 0.0, reverse=True)

    def completed(self, identity: str | None = None) -> HotLoad | None:
        """The newest COMPLETED hot-load (of ``identity`` when given), if any."""
        return next(
            (
                h
                for h in self.hot_loads()
                if h.state is HotLoadState.COMPLETED and (identity is None or h.identity == identity)
            ),
            None,
        )

    def history(self, run_id: str, *, store: bool = True) -> RunHistory:
        """What the deployment and (with ``store``) its snapshot store hold of run ``run_id``.

        One listing of the hot-loads (the run's versions, and the newest COMPLETED one of any
        run: what the replicas serve), then, with ``store``, the identities of the run that
        hold objects or unfinished uploads (a failed attempt may have stored some without a
        hot-load). A store that cannot be listed is logged and left out.

        Raises:
            APIError: the hot-loads could not be listed.
        """
        hot_loads = self.hot_loads()
        versions = [identity_version(h.identity, run_id) for h in hot_loads]
        served = next((h.identity for h in hot_loads if h.state is HotLoadState.COMPLETED), None)
        last_stored, listed = -1, store
        if store:
            try:
                names = self.store.identities(f"{run_id}-v")  # every <run>-vNNNNNN (and names sharing the start)
                stored = [identity_version(name, run_id) for name in names]
            except Exception as exc:  # the hot-loads still say what was published
                log.warning("could not list the stored identities of run %r (%s); going by its hot-loads", run_id, exc)
                stored, listed = [], False
            last_stored = max((v for v in stored if v is not None), default=-1)
        return RunHistory(
            run_id,
            last_hot_loaded=max((v for v in versions if v is not None), default=-1),
            last_stored=last_stored,
            served_identity=served,
            store_listed=listed,
        )

    def active(self) -> HotLoad | None:
        """The newest unfinished hot-load, if any."""
        return next((h for h in self.hot_loads() if not h.terminal), None)

    def _active_or_none(self) -> HotLoad | None:
        """:meth:`active`, or ``None`` when the listing failed transiently."""
        try:
            return self.active()
        except (APIError, TransportError) as error:
            if not error.transient:
                raise
            log.warning("cannot list hot-loads (%s)", error)
            return None

    def chain_deltas(self, previous_identity: str) -> int | None:
        """How many deltas a new delta on ``previous_identity`` would make the chain hold (``None``: unknown)."""
        return chain.deltas_after(self.hot_loads(), previous_identity)

    def check_delta(self, identity: str, previous_identity: str, *, bucket: bool = True) -> None:
        """Refuse, before any byte of it is stored, a delta on ``previous_identity`` the service would refuse.

        The service takes a delta only on an identity a hot-load of this deployment completed
        (service-api.md section 8: ``failed_precondition``, unknown predecessor), and a replica
        starting cold replays the chain from the bucket. So, from one listing of the
        hot-loads (the one the chain count needs anyway):

        * ``initial`` (the deployment's base weights, no snapshot) or another reserved name is refused;
        * a predecessor with no hot-load on this deployment that completed or is still running
          (one publishing ahead: the service decides once it ends) is refused, naming the
          newest identity that completed;
        * a chain past the cold-start limit (63 deltas) is refused;
        * with ``bucket`` (a source about to upload), a predecessor whose index is not in the
          bucket is refused; one this target stored or saw complete itself (:meth:`known_stored`)
          is not asked about again.

        Each refusal names the predecessor (``--previous-identity``, ``previous_identity=``) as
        the input to fix; nothing was stored, so the same identity can be published once it is.

        Raises:
            SnapshotError: as above.
        """
        if previous_identity in RESERVED_IDENTITIES:
            raise SnapshotError(
                _wrong_predecessor(
                    previous_identity,
                    identity,
                    "is a reserved name: 'initial' stands for the deployment's base weights, which are not a "
                    "snapshot a delta can apply on"
                    if previous_identity == "initial"
                    else "is a reserved name, never a snapshot",
                    self._newest_completed_hint(None),
                )
            )
        hot_loads = self.hot_loads()
        mine = [h for h in hot_loads if h.identity == previous_identity]
        if not any(h.state is HotLoadState.COMPLETED or not h.terminal for h in mine):
            ended = f" (its hot-loads ended {', '.join(sorted({h.state.name for h in mine}))})" if mine else ""
            raise SnapshotError(
                _wrong_predecessor(
                    previous_identity,
                    identity,
                    f"never completed on deployment {self.deployment_id}{ended}, so the service would refuse the delta",
                    self._newest_completed_hint(hot_loads),
                )
            )
        chain.check_delta_allowed(identity, previous_identity, chain.deltas_after(hot_loads, previous_identity))
        if not bucket or previous_identity in self._known:
            return
        if not self.store.index_exists(previous_identity):
            raise SnapshotError(
                _wrong_predecessor(
                    previous_identity,
                    identity,
                    f"has no snapshot in the bucket ({self.store.uri(previous_identity)} holds no index), so a "
                    "replica starting cold could not replay the chain",
                    "publish a FULL snapshot instead",
                )
            )
        self._known.add(previous_identity)

    def known_stored(self, identity: str) -> None:
        """``identity``'s snapshot is in the bucket: this target stored it, or saw its hot-load complete.

        :meth:`check_delta` does not ask the bucket about it again (a run's next delta is on it).
        """
        self._known.add(identity)

    def _newest_completed_hint(self, hot_loads: list[HotLoad] | None) -> str:
        """What to publish instead: a delta on the newest identity that completed, or a FULL snapshot."""
        try:
            listed = self.hot_loads() if hot_loads is None else hot_loads
        except (APIError, TransportError):
            listed = []
        newest = next((h.identity for h in listed if h.state is HotLoadState.COMPLETED), None)
        if newest is None:
            return f"no hot-load completed on deployment {self.deployment_id} yet: publish a FULL snapshot first"
        return f"the deployment's newest completed identity is {newest!r}: name that one, or publish a FULL snapshot"

    def missing_objects(self, hot_load: HotLoad) -> list[str]:
        """The identities of ``hot_load``'s chain (itself, for a FULL) whose index is no longer stored."""
        identities = [ref.identity for ref in hot_load.snapshot_chain] or [hot_load.identity]
        return [identity for identity in identities if not self.store.index_exists(identity)]

    def unreplayable(self, hot_load: HotLoad, checked: dict[str, str] | None = None) -> str | None:
        """Why ``hot_load``'s chain (itself, for a FULL) cannot be hot-loaded again; ``None`` when it can.

        Every member's objects must be stored and hold the bytes their recorded SHA-256 names
        (:func:`~cwtrain.hotload.store.snapshot_verify.verify_stored_snapshot`: every object is
        read once). ``checked`` keeps each member's verdict (``""``: intact) across calls, so that
        candidates sharing a chain read it once.
        """
        checked = {} if checked is None else checked
        for identity in [ref.identity for ref in hot_load.snapshot_chain] or [hot_load.identity]:
            if identity not in checked:
                checked[identity] = self._stored_problem(identity)
            if checked[identity]:
                return f"{identity}: {checked[identity]}"
        return None

    def _stored_problem(self, identity: str) -> str:
        """What is wrong with ``identity``'s stored objects (``""``: stored, matching their hashes)."""
        try:
            found = verify_stored_snapshot(self.store, identity)
        except (SnapshotError, ObjectStoreError) as exc:
            return str(exc)
        return "" if found is not None else "its index is gone from the bucket"

    def serving(self) -> str | None:
        """The identity every replica serves now, read from the service (``None``: a split fleet, or unknown).

        Read from the replicas of the newest hot-load, each naming the identity it serves (one
        whose load failed keeps serving what it had); unknown while that hot-load is still
        running (what they serve may change), or when a replica names none.
        """
        try:
            hot_loads = self.hot_loads()
            if not hot_loads or not hot_loads[0].terminal:
                return None
            replicas = self.client.list_hot_load_replicas(hot_loads[0].id)
        except (APIError, TransportError) as error:
            log.warning("cannot read what the replicas serve (%s)", error)
            return None
        identities = {r.current_snapshot_identity for r in replicas}  # a replica whose load failed serves what it had
        if len(identities) != 1 or None in identities:
            return None
        return identities.pop()

    # ------------------------------------------------------------------ create

    def create(
        self,
        identity: str,
        kind: SnapshotType,
        previous_identity: str | None,
        *,
        budget: Budget,
        prompt_cache_policy: PromptCachePolicy | str | None = None,
        hot_load_id: str | None = None,
        wait_for_active: bool = True,
    ) -> HotLoad:
        """Create the hot-load of a stored snapshot, with single-flight and readiness handling.

        Does not wait for completion; see the module docstring for what is waited out.

        Raises:
            HotLoadInProgressError: another hot-load was still running when the budget ran out
                (or at once without ``wait_for_active``).
            FailedPreconditionError: refused for another reason (or the deployment never became
                READY within the budget).
            PublishTimeoutError: the budget was spent before the first create could be sent.
        """
        incremental = None
        if kind is SnapshotType.INCREMENTAL:
            assert previous_identity, "a delta names its predecessor"
            incremental = IncrementalSnapshotMetadata(previous_identity)
        policy = PromptCachePolicy.parse(prompt_cache_policy)
        hot_load_id = hot_load_id or str(uuid.uuid4())
        waited_for_ready = False
        refused: Exception | None = None  # the last refusal, raised when the budget ends a wait for a retry
        while True:
            if budget.spent:  # never create after the deadline: the caller is told it failed
                if refused is not None:
                    raise refused
                raise PublishTimeoutError(identity, budget.total, "create")
            try:
                created = self.client.create_hot_load(
                    self.deployment_id,
                    identity,
                    snapshot_type=kind,
                    incremental=incremental,
                    prompt_cache_policy=policy,
                    hot_load_id=hot_load_id,
                )
                return self._follow_late_create(created, budget)
            except FailedPreconditionError as error:
                active = self._active_or_none()
                if active is not None and active.id == hot_load_id:
                    log.info("hot-load %s is this request's earlier attempt; adopting it", hot_load_id)
                    return self._follow_late_create(active, budget)
                if active is None and not isinstance(error, HotLoadInProgressError):
                    waited_for_ready = self._wait_until_accepting(error, budget, retry_once=waited_for_ready)
                    refused = error
                    continue
                busy = HotLoadInProgressError(
                    "failed_precondition",
                    f"another hot-load ({active.id if active else 'unknown'}) of deployment "
                    f"{self.deployment_id} is already in progress"
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
                    wait_until_terminal(self.client, active.id, budget, interval=self.poll_interval)
                else:
                    budget.sleep(self.poll_interval)

    def _follow_late_create(self, hot_load: HotLoad, budget: Budget) -> HotLoad:
        """A create answered as the budget ran out: extend the budget so the hot-load is followed to its end.

        The create went out, so the hot-load may go live; reporting a timeout at once would tell
        the caller it failed while the fleet serves it.
        """
        if budget.remaining < self.poll_interval and not hot_load.terminal:
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

    def _wait_until_accepting(self, error: FailedPreconditionError, budget: Budget, *, retry_once: bool) -> bool:
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
            status = self.client.get_deployment(self.deployment_id).status
        except (APIError, TransportError) as read_error:
            if not read_error.transient or budget.spent:
                raise error from None
            log.warning("cannot read deployment %s (%s); retrying the hot-load", self.deployment_id, read_error)
            budget.sleep(self.poll_interval)
            return retry_once
        if status in _ACCEPTS_HOT_LOADS and retry_once and not budget.spent:
            return False
        if status in _ACCEPTS_HOT_LOADS or status in _FINAL or budget.spent:
            raise error
        log.info(
            "deployment %s is %s and refused the hot-load (%s); waiting for it to be READY (%.0fs left)",
            self.deployment_id,
            status.wire,
            error,
            budget.remaining,
        )
        budget.sleep(self.poll_interval)
        return True


def require_hot_load(deployment: Deployment) -> HotLoadConfig:
    """The deployment's ``hotLoad`` block.

    Raises:
        ConfigError: it has none (hot-load is only settable at creation).
    """
    if deployment.hot_load is None or not deployment.hot_load.bucket:
        raise ConfigError(
            f"deployment {deployment.id} ({deployment.name}) has no hotLoad block, so it cannot hot-load; "
            "hotLoad is only settable at creation: create a deployment with hotLoad {bucket, pathPrefix}"
        )
    return deployment.hot_load


def deployment_store(deployment: Deployment, s3: ObjectStoreLike | None = None) -> SnapshotStore:
    """Where ``deployment``'s snapshots live: its ``hotLoad`` bucket and prefix, on ``s3``.

    Raises:
        ConfigError: it has no ``hotLoad`` block.
    """
    hot_load = require_hot_load(deployment)
    return SnapshotStore(as_object_store(s3), hot_load.bucket, hot_load.path_prefix)


@contextlib.contextmanager
def upload_deadline(identity: str, budget: Budget | None) -> Iterator[None]:
    """An upload whose object-store deadline passed raises :class:`~cwtrain.errors.PublishTimeoutError`."""
    try:
        yield
    except ObjectStoreDeadlineError as exc:
        if budget is None:
            raise
        raise PublishTimeoutError(identity, budget.total, "upload", str(exc)) from exc


def _wrong_predecessor(previous_identity: str, identity: str, why: str, instead: str) -> str:
    """A refusal of a delta's predecessor: the input to fix, why, what to do; nothing was stored."""
    return (
        f"previous identity {previous_identity!r} (--previous-identity, previous_identity=) {why}: {instead}; "
        f"nothing was stored under {identity!r}, so it can be published once the predecessor is right"
    )
