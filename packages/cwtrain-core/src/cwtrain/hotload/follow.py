"""Following a publish: progress events, and the waits for hot-loads to end.

:class:`~cwtrain.hotload.loader.HotLoader` is the usual way in (``loader.publish``,
``loader.upload``, ``loader.wait`` take ``on_progress``); this module holds what they share::

    from cwtrain.hotload import ProgressEvent

    def show(event: ProgressEvent) -> None:
        print(event.stage, event.summary())
        # upload    uploading 1.5 GiB of 3.0 GiB after 12s
        # hot_load  in_progress after 40s (ready=1, updating=3)

    loader.publish("ckpt/step-7", identity="run1-v000007", on_progress=show)

Every ``on_progress`` callback receives :class:`ProgressEvent` objects, one type for the
whole publish. ``stage == "upload"`` while the snapshot's bytes go up: ``bytes_done`` of
``bytes_total`` so far, ``hot_load`` a placeholder that carries only the identity; the last
upload event has ``bytes_done == bytes_total``. ``stage == "hot_load"`` for each poll of
the hot-load: ``hot_load`` and all its ``replicas`` as read, ``ready`` of ``total``
replicas serving its identity. ``elapsed`` counts seconds since the stage began.
:class:`cwtrain.progress.ByteProgress` renders the upload events on a terminal.

The pieces:

* :class:`UploadProgress` turns the uploader's byte counts, which arrive from its worker
  threads, into upload events: at most one every ``interval`` seconds (0.25), plus the last.
* :func:`wait_for_hot_load` polls a hot-load until it ends and every replica serves its
  identity, inside a :class:`~cwtrain.polling.Budget` (the composer's follow stage, and
  ``HotLoader.wait``); :func:`wait_until_terminal` waits for another hot-load to end
  (single-flight). Transient API errors and transport errors are logged and the polling
  goes on. :func:`verify_served` is the strict check after it: every replica READY on the
  identity.
* :class:`HotLoadStatus` is a hot-load with all its replicas (``HotLoader.status``).
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from cwtrain.errors import (
    APIError,
    HotLoadFailedError,
    HotLoadTimeoutError,
    HotLoadVerificationError,
    TransportError,
)
from cwtrain.infra.client import InferenceClient
from cwtrain.infra.enums import HotLoadState, ReplicaState
from cwtrain.infra.models import HotLoad, HotLoadReplica
from cwtrain.polling import Budget, poll
from cwtrain.progress import format_bytes

__all__ = [
    "CATCH_UP_SECONDS",
    "LOG_EVERY_SECONDS",
    "HotLoadStatus",
    "ProgressEvent",
    "Stage",
    "UploadProgress",
    "replicas_behind",
    "verify_served",
    "wait_for_hot_load",
    "wait_until_terminal",
]

log = logging.getLogger(__name__)

#: Seconds between two log lines of an unchanged hot-load while waiting.
LOG_EVERY_SECONDS = 60.0
#: Seconds replicas may lag behind a COMPLETED aggregate state (at least ten polls).
CATCH_UP_SECONDS = 30.0

#: What a :class:`ProgressEvent` reports on.
type Stage = Literal["upload", "hot_load"]


@dataclass(frozen=True)
class ProgressEvent:
    """One step of a publish: bytes stored so far, or one poll of its hot-load.

    Attributes:
        hot_load: the hot-load as last read; during the upload a placeholder
            (``HotLoad(id="", identity=<identity>)``).
        replicas: its replicas (all pages); empty during the upload.
        elapsed: seconds since the stage began.
        ready: replicas READY on the hot-load's identity.
        total: replicas listed.
        stage: ``"upload"`` or ``"hot_load"``.
        bytes_done: bytes stored so far (upload stage).
        bytes_total: bytes of the snapshot (upload stage).
    """

    hot_load: HotLoad
    replicas: tuple[HotLoadReplica, ...] = ()
    elapsed: float = 0.0
    ready: int = 0
    total: int = 0
    stage: Stage = "hot_load"
    bytes_done: int = 0
    bytes_total: int = 0

    @classmethod
    def of(cls, hot_load: HotLoad, replicas: builtins.list[HotLoadReplica], elapsed: float) -> ProgressEvent:
        """A hot-load event, counting the replicas caught up on the identity."""
        ready = sum(1 for r in replicas if r.caught_up(hot_load.identity))
        return cls(hot_load, tuple(replicas), elapsed, ready, len(replicas))

    @classmethod
    def uploading(cls, identity: str, bytes_done: int, bytes_total: int, elapsed: float) -> ProgressEvent:
        """An upload event for ``identity``."""
        return cls(
            HotLoad(id="", identity=identity),
            elapsed=elapsed,
            stage="upload",
            bytes_done=bytes_done,
            bytes_total=bytes_total,
        )

    def summary(self) -> str:
        """``uploading 1.5 GiB of 3.0 GiB after 12s`` or ``in_progress after 12s (ready=1, updating=3)``."""
        if self.stage == "upload":
            done, total = format_bytes(self.bytes_done), format_bytes(self.bytes_total)
            return f"uploading {done} of {total} after {self.elapsed:.0f}s"
        counts: dict[str, int] = {"ready": self.ready}
        for replica in self.replicas:
            if replica.caught_up(self.hot_load.identity):
                continue
            name = replica.state.name.lower() if replica.state is not ReplicaState.READY else "ready_on_other"
            counts[name] = counts.get(name, 0) + 1
        parts = ", ".join(f"{k}={v}" for k, v in counts.items())
        return f"{self.hot_load.state.name.lower()} after {self.elapsed:.0f}s ({parts})"


class HotLoadStatus(NamedTuple):
    """A hot-load and all its replicas (``hotload status``)."""

    hot_load: HotLoad
    replicas: builtins.list[HotLoadReplica]

    def to_json(self) -> dict[str, Any]:
        """``{"hot_load": <hot-load view>, "replicas": [<replica view>, ...]}``."""
        return {"hot_load": self.hot_load.to_json(), "replicas": [r.to_json() for r in self.replicas]}


class UploadProgress:
    """The uploader's byte counts as upload :class:`ProgressEvent` s, without flooding.

    Pass the instance as the uploader's byte callback (it is thread-safe), then call
    :meth:`finish` once every object is stored. Events go to ``on_progress`` in order,
    at most one every ``interval`` seconds while bytes arrive; :meth:`finish` sends the
    last one, with ``bytes_done == bytes_total``.

    Args:
        identity: the snapshot identity (carried by the placeholder hot-load).
        total: bytes of the snapshot.
        on_progress: where the events go.
        interval: the least seconds between two events before the last.
    """

    def __init__(
        self,
        identity: str,
        total: int,
        on_progress: Callable[[ProgressEvent], None],
        *,
        interval: float = 0.25,
    ) -> None:
        self.identity = identity
        self.total = max(0, total)
        self.done = 0
        self.interval = interval
        self._on_progress = on_progress
        self._start = time.monotonic()
        self._last = float("-inf")
        self._lock = threading.Lock()

    def __call__(self, nbytes: int) -> None:
        """Count ``nbytes`` stored (from any thread); sends an event when one is due."""
        with self._lock:
            self.done += nbytes
            now = time.monotonic()
            if self.done >= self.total or now - self._last < self.interval:
                return  # the last event is finish()'s
            self._last = now
            self._on_progress(ProgressEvent.uploading(self.identity, self.done, self.total, now - self._start))

    def finish(self) -> None:
        """Send the last event: every byte stored."""
        with self._lock:
            self.total = self.done = max(self.total, self.done)
            elapsed = time.monotonic() - self._start
            self._on_progress(ProgressEvent.uploading(self.identity, self.done, self.total, elapsed))


def wait_for_hot_load(
    client: InferenceClient,
    hot_load_id: str,
    budget: Budget,
    *,
    interval: float,
    raise_on_failure: bool = True,
    on_progress: Callable[[ProgressEvent], None] | None = None,
) -> HotLoad:
    """Poll a hot-load and its replicas until it ends and every replica serves its identity.

    State changes are logged, and an unchanged state every :data:`LOG_EVERY_SECONDS`.
    The aggregate state decides: replicas still lagging :data:`CATCH_UP_SECONDS` (or ten
    polls) after COMPLETED, or when the budget is spent, are logged as a warning and the
    hot-load is returned.

    Args:
        client: the API client.
        hot_load_id: the hot-load to follow.
        budget: the time budget of the wait.
        interval: the longest pause between polls (shorter while the service answers
            fast: :func:`cwtrain.polling.adaptive_pause`).
        raise_on_failure: raise when it ends FAILED or CANCELED (else return it).
        on_progress: called with a hot-load :class:`ProgressEvent` on every poll.

    Raises:
        HotLoadFailedError: FAILED or CANCELED (unless ``raise_on_failure=False``).
        HotLoadTimeoutError: the budget ran out before the hot-load ended.
    """
    hot_load = HotLoad(id=hot_load_id)
    replicas: builtins.list[HotLoadReplica] = []
    last_summary, last_log = "", 0.0
    completed_at: float | None = None
    for _ in poll(budget, interval, adaptive=True):
        try:
            hot_load = client.get_hot_load(hot_load_id)
            replicas = client.list_hot_load_replicas(hot_load_id)
        except (APIError, TransportError) as error:
            if not error.transient:
                raise
            log.warning("hot-load %s: transient error while waiting (%s); still waiting", hot_load_id, error)
            continue
        event = ProgressEvent.of(hot_load, replicas, budget.elapsed)
        summary = event.summary()
        state_part = summary.split(" after ")[0] + summary[summary.find("(") :]
        if state_part != last_summary or budget.elapsed - last_log >= LOG_EVERY_SECONDS:
            log.info("hot-load %s of %r: %s", hot_load.id, hot_load.identity, summary)
            last_summary, last_log = state_part, budget.elapsed
        if on_progress is not None:
            on_progress(event)
        if hot_load.state in (HotLoadState.FAILED, HotLoadState.CANCELED):
            if raise_on_failure:
                raise HotLoadFailedError(hot_load, replicas)
            return hot_load
        if hot_load.state is HotLoadState.COMPLETED:
            if event.ready == event.total:
                return hot_load
            completed_at = budget.elapsed if completed_at is None else completed_at
            if budget.spent or budget.elapsed - completed_at >= max(CATCH_UP_SECONDS, 10 * interval):
                log.warning(
                    "hot-load %s COMPLETED but %d/%d replicas serve %r",
                    hot_load.id,
                    event.ready,
                    event.total,
                    hot_load.identity,
                )
                return hot_load
    raise HotLoadTimeoutError(hot_load, replicas, budget.total)


def wait_until_terminal(client: InferenceClient, hot_load_id: str, budget: Budget, *, interval: float) -> None:
    """Wait until a hot-load ends, however it ends, or the budget is spent (no error then).

    Used for another request's hot-load, whose failure is not the caller's.
    """
    for _ in poll(budget, interval, adaptive=True):
        try:
            if client.get_hot_load(hot_load_id).terminal:
                return
        except (APIError, TransportError) as error:
            if not error.transient:
                raise
            log.warning("transient error while waiting for hot-load %s: %s", hot_load_id, error)


def replicas_behind(replicas: Sequence[HotLoadReplica], identity: str) -> builtins.list[str]:
    """What is wrong with each replica not READY on ``identity`` (``["no replicas listed"]`` for none): empty when all are."""
    if not replicas:
        return ["no replicas listed"]
    return [
        f"{r.name}: {r.state.name} on {r.current_snapshot_identity or '?'!r}"
        + (f" ({r.error_reason})" if r.error_reason else "")
        for r in replicas
        if not r.caught_up(identity)
    ]


def verify_served(client: InferenceClient, hot_load_id: str, identity: str) -> builtins.list[HotLoadReplica]:
    """Every replica of hot-load ``hot_load_id`` READY on ``identity`` (the replicas), else an error naming each one behind.

    Raises:
        HotLoadVerificationError: a replica is not READY on ``identity``, or none is listed.
    """
    replicas = client.list_hot_load_replicas(hot_load_id)
    problems = replicas_behind(replicas, identity)
    if problems:
        raise HotLoadVerificationError(client.get_hot_load(hot_load_id), replicas, problems)
    return replicas
