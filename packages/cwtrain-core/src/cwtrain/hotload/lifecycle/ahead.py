"""``PublishAhead``: one step ahead, the next step trains while the last one's version publishes.

A :class:`~cwtrain.hotload.lifecycle.session.PublishSession` publishes a version and returns
once every replica serves it: the training loop waits for the whole cycle (store, hot-load,
verify, canary). ``PublishAhead`` runs the same cycle on one background thread, so the loop
goes on training while the fleet loads the version it just handed over::

    session = PublishSession(settings, sink=log_metrics, followers=[announce], on_burned=[burn])
    with PublishAhead(session, on_publishing=[ahead_of]) as ahead:
        for step in range(1, steps + 1):
            batch = sampler.sample_groups_sync(...)     # served by the last version the fleet serves
            train(batch)
            ahead.publish_tensors(new_weights(), extra_files=...)   # returns at once (see below)
    # leaving the block waited for the last version

**One at a time, in order (single-flight).** Handing over a version first waits for the one
in flight to end: never two publishes at once, never one dropped or reordered. The version's
plan (FULL or delta, :meth:`PublishSession.begin`) is made only then, from what that one
left: after a failure the next version is FULL, and a delta's base is the last version that
was served. The tensors handed over must not change afterwards (hand over a copy, as
``GRPOTrainer.served_weights`` or a device-to-host copy makes).

**Failures.** The background cycle is the composer's, unchanged: a hot-load that fails or
splits the fleet is answered as in synchronous mode (the fleet brought back, the version
burned: ``on_burned`` hears of it at once, so a sampler refuses its samples from then on). An
error the cycle raises (``on_failure="stop"``, or a failure before a hot-load was created) is
raised by the next hand-over, or by :meth:`PublishAhead.finish`.

**What the loop waited.** Each outcome carries ``trainer_wait_seconds`` (``hotload/trainer_wait_seconds``):
the seconds the training loop was blocked by that version. Synchronously it is the whole
publish; one step ahead it is the time the next hand-over (or :meth:`finish`) waited for the
version to end, plus making the next plan. The session's sink hears of each version at that
moment, on the training loop's thread (loggers need not be thread-safe), with that figure;
followers (``note_published``) and ``on_burned`` are told from the background thread as soon
as the fleet serves or refuses a version.

**The samples' age.** ``on_publishing`` hears ``(run_id, version)`` when a version is handed
over (:meth:`CompletionSampler.note_publishing
<cwtrain.integrations.rollout.CompletionSampler.note_publishing>`): a sampler then counts a
completion's staleness from the version the trainer is at, not only from the one the fleet
serves, so with ``CWTRAIN_ROLLOUT_MAX_STALENESS=1`` (the default one step ahead) no sample
trained on is more than one version behind the trainer's weights, and none comes from a
version not yet served.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from cwtrain.closing import Closing
from cwtrain.errors import UsageError
from cwtrain.hotload.lifecycle.session import PublishSession
from cwtrain.hotload.lifecycle.version import PublishOutcome, VersionPlan

__all__ = ["AHEAD_MAX_STALENESS", "PublishAhead"]

log = logging.getLogger(__name__)

#: The sampler's staleness limit one step ahead: a sample may be one version behind the trainer's weights.
AHEAD_MAX_STALENESS = 1


class PublishAhead(Closing):
    """A session's versions published on one background thread, one at a time (see the module docstring).

    Args:
        session: the run's session; its sink is called from :meth:`collect` from now on.
        on_publishing: called with ``(run_id, version)`` when a version is handed over.
    """

    def __init__(self, session: PublishSession, *, on_publishing: Sequence[Callable[[str, int], None]] = ()) -> None:
        self.session = session
        self.on_publishing: list[Callable[[str, int], None]] = list(on_publishing)
        self._sink, session.sink = session.sink, self._heard
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="cwtrain-publish-ahead")
        self._pending: Future[PublishOutcome] | None = None
        self._told: PublishOutcome | None = None  # what the background cycle reported last
        self._lock = threading.Lock()
        self._served: Mapping[str, Any] | None = None  # the tensors of the last version served (publish_tensors)
        #: the tensors of the version publishing now (publish_tensors): what a canary compares the fleet with,
        #: since the trainer's own weights have moved on by then
        self.tensors_in_flight: Mapping[str, Any] | None = None
        self._closed = False

    # ------------------------------------------------------------------ hand-over

    @property
    def in_flight(self) -> bool:
        """A version is publishing now."""
        return self._pending is not None and not self._pending.done()

    def submit(
        self,
        publish: Callable[[VersionPlan], PublishOutcome],
        *,
        version: int | None = None,
        tensors: Mapping[str, Any] | None = None,
    ) -> PublishOutcome | None:
        """Wait for the version in flight, plan the next (``version``, default the next number), publish it in the background.

        ``publish(plan)`` runs on the background thread (a ``session.publish_*`` call);
        ``tensors`` (what it publishes, when in memory) is :attr:`tensors_in_flight` meanwhile.

        Returns:
            the outcome of the version that was in flight (``None``: none was).

        Raises:
            CWTrainError: what the version in flight raised (it is not retried; nothing new is
                handed over), or what planning the next version raised.
            UsageError: this object is closed.
        """
        if self._closed:
            raise UsageError("PublishAhead is closed: hand versions to a new one, or to the session")
        started = time.perf_counter()
        previous, error = self._wait()
        try:
            if error is None:
                plan = self.session.begin(version)
                for hook in self.on_publishing:
                    hook(self.session.run_id, plan.version)
                self.tensors_in_flight = tensors
                self._pending = self._worker.submit(publish, plan)
        finally:  # the version that ended reaches the sink whatever planning the next one did
            self._report(previous, time.perf_counter() - started)
        if error is not None:
            raise error
        return previous

    def publish_tensors(
        self,
        tensors: Mapping[str, Any],
        *,
        version: int | None = None,
        extra_files: Mapping[str, bytes] | None = None,
    ) -> PublishOutcome | None:
        """Hand over in-memory weights (not changed afterwards): a delta on the last version served, or FULL.

        The base of a delta is the tensors of the last version this object published that
        the fleet served (none before the first: FULL). Returns what :meth:`submit` returns.
        """

        def publish(plan: VersionPlan) -> PublishOutcome:
            outcome = self.session.publish_tensors(plan, tensors, base=self._served, extra_files=extra_files)
            if outcome.published and not outcome.failed:
                self._served = tensors
            return outcome

        return self.submit(publish, version=version, tensors=tensors)

    def collect(self) -> PublishOutcome | None:
        """Wait for the version in flight to end; its outcome (``None``: none was in flight). Raises what it raised."""
        started = time.perf_counter()
        outcome, error = self._wait()
        self._report(outcome, time.perf_counter() - started)
        if error is not None:
            raise error
        return outcome

    def finish(self) -> PublishOutcome | None:
        """The last version's outcome once it ended (:meth:`collect`)."""
        return self.collect()

    def close(self) -> None:
        """Wait for the version in flight (its error is logged, not raised), then stop the thread."""
        if self._closed:
            return
        try:
            self.collect()
        except Exception as exc:
            log.warning("the version publishing when the run ended failed: %s", exc)
        finally:
            self._closed = True
            self._worker.shutdown(wait=True)
            self.session.sink = self._sink

    # ------------------------------------------------------------------ plumbing

    def _heard(self, outcome: PublishOutcome) -> None:
        """The session's sink while this object runs it: kept for :meth:`_report`."""
        with self._lock:
            self._told = outcome

    def _wait(self) -> tuple[PublishOutcome | None, BaseException | None]:
        pending, self._pending = self._pending, None
        if pending is None:
            return None, None
        error = pending.exception()
        with self._lock:
            told, self._told = self._told, None
        outcome = pending.result() if error is None else told
        return outcome, error

    def _report(self, outcome: PublishOutcome | None, waited: float) -> None:
        """Give ``outcome`` the seconds the loop waited for it, then to the session's sink."""
        if outcome is None:
            return
        outcome.trainer_wait_seconds = waited
        if self._sink is not None:
            try:
                self._sink(outcome)
            except Exception:  # a logger must never fail a publish
                log.warning("the metrics sink failed on version %d", outcome.version, exc_info=True)
