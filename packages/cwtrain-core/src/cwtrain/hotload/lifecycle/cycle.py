"""The cycle of one version, composed once: :class:`VersionCycle`.

Every entry point publishes a version through this one object: ``cwtrain hotload
publish``/``trigger``/``rollback`` and :class:`~cwtrain.hotload.loader.HotLoader` (a one-version
use), and every run through :class:`~cwtrain.hotload.lifecycle.session.PublishSession` (the
demo, slime's hook and live-tensor actor, miles' post-save hook, NeMo-RL's synchronizer, a
custom loop). What differs between them is configuration (:class:`CyclePolicy`: the CLI stops
on a failed hot-load, the integrations bring the fleet back), never a second code path::

    cycle = VersionCycle(target, CyclePolicy(verify=True, on_failure="reactivate"), canary=canary)
    outcome = cycle.publish(plan, TensorSource(new, base=served))      # one version, start to end

The stages of :meth:`VersionCycle.publish`, each visited once, in this order:

1. **store** (and **cut**): the source stores the snapshot (:mod:`~cwtrain.hotload.lifecycle.sources`);
   under ``auto`` a delta is weighed once its size is known, before it is uploaded, and may be
   published FULL instead;
2. **chain**: a delta is checked once, after the source's local checks and before its first
   byte is stored, for what the service would refuse after the upload: a predecessor that is
   reserved (``initial``), that never completed on the deployment, or whose snapshot is not in
   the bucket, and a chain past the cold-start limit (63 deltas)
   (:meth:`Target.check_delta <cwtrain.hotload.lifecycle.target.Target.check_delta>`, run by
   :meth:`Attempt.before_upload <cwtrain.hotload.lifecycle.version.Attempt.before_upload>`;
   it reuses the listing the chain count makes, and asks the bucket only about a predecessor
   this process did not store or see complete), so a refused delta stores nothing and its
   identity stays free;
3. **create**: the hot-load, with single-flight and readiness handled
   (:meth:`Target.create <cwtrain.hotload.lifecycle.target.Target.create>`);
4. **follow**: until it ends and every replica serves the identity
   (:func:`~cwtrain.hotload.follow.wait_for_hot_load`: this is its one caller in core besides
   ``HotLoader.wait``'s plain form); once it completed, every replica the service lists must
   serve the identity, whatever the settings (``converged``): a split fleet fails the version
   as a FAILED hot-load does;
5. **verify** (``verify``): the replicas read once more, every one READY on the identity
   (:func:`~cwtrain.hotload.follow.verify_served`);
6. **canary** (when one is given): the deployment's answers checked against the trainer's; a
   check that cannot be made (the endpoint stopped answering, its share ran out) refuses too;
7. **converge** on failure (``on_failure="reactivate"``): a hot-load that ended FAILED or
   CANCELED, left the fleet split, or that verification or the canary refused, is answered by
   re-activating the newest identity that completed whose whole chain can be replayed (every
   object stored and matching its recorded SHA-256; older ones are tried in turn), followed and
   verified like any hot-load (:meth:`VersionCycle.reactivate`); a failure not answered so
   records what the fleet serves (the identity, when its hot-load completed on every replica;
   else read back from the service, ``None`` when it is split);
8. **records**: the served-identity file (``state_dir``), the manifest (a run's versions with
   known checksums), ``publish_seconds``, then the run's own records
   (:class:`Ledger`: the session's counter, cadence, sink and followers).

**One budget.** The plan's budget covers every stage, the canary and the re-activation
included: once a hot-load is created, a share of it is held back from the follow for each
that may come (:data:`CANARY_SHARE` of what is left for a canary, :data:`CONVERGE_SHARE`
under ``reactivate``) and a share left unused passes on, so a version
ends within its timeout plus one poll (a create answered as the budget ran out is followed to
its end, and says so). A failure before a hot-load was created changed nothing on the fleet and
is raised; a failed hot-load is raised unless the fleet was brought back, in which case the
outcome is returned with ``failed``, ``reactivated`` and the ``error`` (a run goes on;
:class:`~cwtrain.hotload.loader.HotLoader` raises it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Protocol

from cwtrain.errors import (
    CWTrainError,
    HotLoadFailedError,
    HotLoadTimeoutError,
    HotLoadVerificationError,
    UsageError,
)
from cwtrain.hotload.follow import ProgressEvent, replicas_behind, verify_served, wait_for_hot_load
from cwtrain.hotload.lifecycle.served import record_served_identity
from cwtrain.hotload.lifecycle.settings import DEFAULT_TIMEOUT, FAILURE_POLICIES, HotLoadSettings
from cwtrain.hotload.lifecycle.sources import RestoreSource, VersionSource
from cwtrain.hotload.lifecycle.target import Target
from cwtrain.hotload.lifecycle.version import Attempt, PublishOutcome, ServedCheck, VersionPlan, Weigh
from cwtrain.hotload.store.prefix_manifests import snapshot_manifest
from cwtrain.infra.enums import HotLoadState, PromptCachePolicy
from cwtrain.infra.models import HotLoad
from cwtrain.polling import Budget

__all__ = ["CyclePolicy", "Ledger", "VersionCycle"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CyclePolicy:
    """How the cycle runs; the defaults are the CLI's, :meth:`of` gives a run's.

    Attributes:
        wait: follow each hot-load until it ends (``False``: return once it is created).
        verify: after completion, require every replica READY on the identity.
        on_failure: ``stop`` raises a failed hot-load; ``reactivate`` first brings every
            replica back to the newest identity that completed whose chain can be replayed.
        timeout: seconds a re-activation asked for on its own may take (``follow``; a
            version's re-activation spends what is left of the version's budget).
        prompt_cache_policy: sent with each hot-load (``None``/UNSPECIFIED omits the field).
        upload_workers: files uploaded in parallel.
        state_dir: where the served-identity file is written (empty: not written).
        skip_empty: a delta in which nothing changed is recorded as skipped (a run); ``False``
            refuses it.
    """

    wait: bool = True
    verify: bool = False
    on_failure: str = "stop"
    timeout: float = DEFAULT_TIMEOUT
    prompt_cache_policy: PromptCachePolicy | str | None = None
    upload_workers: int = 8
    state_dir: str = ""
    skip_empty: bool = False

    def __post_init__(self) -> None:
        if self.on_failure not in FAILURE_POLICIES:
            raise UsageError(f"on_failure={self.on_failure!r} must be one of {', '.join(FAILURE_POLICIES)}")

    @classmethod
    def of(cls, settings: HotLoadSettings) -> CyclePolicy:
        """A run's policy, from its settings."""
        return cls(
            wait=settings.wait,
            verify=settings.verify,
            on_failure=settings.on_failure,
            timeout=settings.timeout,
            prompt_cache_policy=settings.prompt_cache_policy,
            upload_workers=settings.upload_workers,
            state_dir=settings.state_dir,
            skip_empty=True,
        )


class Ledger(Protocol):
    """What a run keeps of its versions (:class:`~cwtrain.hotload.lifecycle.session.PublishSession`)."""

    def ended(self, attempt: Attempt, error: BaseException | None) -> None:
        """``attempt`` ended (``error``: what is raised next; ``None`` when it is not)."""
        ...


@dataclass
class VersionCycle:
    """The cycle of one version on one deployment (see the module docstring).

    Attributes:
        target: the client, the deployment and its store.
        policy: how the cycle runs.
        canary: checked after every hot-load of a version that was waited for.
        ledger: told how each version ended, before its error is raised.
    """

    target: Target
    policy: CyclePolicy = field(default_factory=CyclePolicy)
    _: KW_ONLY
    canary: ServedCheck | None = None
    ledger: Ledger | None = None

    # ------------------------------------------------------------------ a version

    def publish(
        self,
        plan: VersionPlan,
        source: VersionSource,
        *,
        checksums: Mapping[str, str] | None = None,
        weigh: Weigh | None = None,
        manifest: bool = True,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        hot_load_id: str | None = None,
        wait_for_active: bool = True,
    ) -> PublishOutcome:
        """Publish ``plan``'s version from ``source``: every stage of the module docstring.

        Args:
            plan: the version.
            source: what it is published from.
            checksums: the Adler-32 of every tensor of the full weights at this version (the
                manifest; default: what the encoder computed).
            weigh: the cost rule for a delta plan under ``auto`` (``PublishSession.weigh``).
            manifest: write the manifest (a run's version with known checksums).
            on_progress: upload events, then one per poll of the hot-load.
            hot_load_id: the hot-load's permanent id (default a new UUID4).
            wait_for_active: wait for another hot-load in progress (``False``: refuse at once).

        Returns:
            the outcome (also when the hot-load failed and the fleet was brought back:
            ``failed``, ``reactivated``, ``error``).

        Raises:
            CWTrainError: any failure before a hot-load was created, and a failed hot-load
                the fleet was not brought back from (after the ledger heard of it).
        """
        attempt = Attempt(
            plan,
            checksums=checksums,
            weigh=weigh,
            manifest=manifest,
            skip_empty=self.policy.skip_empty,
            on_progress=on_progress,
        )
        shares = _Shares(attempt.plan.budget)
        error: BaseException | None = None
        try:
            self._cycle(attempt, source, hot_load_id, wait_for_active, shares)
        except BaseException as exc:  # recorded (the sink hears of interrupts too), then raised
            if shares.release() and isinstance(exc, HotLoadTimeoutError):  # name the whole budget
                exc = HotLoadTimeoutError(exc.hot_load, exc.replicas, attempt.plan.budget.total)
            error = self._converge(attempt, exc)
        self._record(attempt, error)
        if error is not None:
            raise error
        return attempt.outcome

    def _cycle(
        self, attempt: Attempt, source: VersionSource, hot_load_id: str | None, wait_for_active: bool, shares: _Shares
    ) -> None:
        """Stages 1 to 6: store (cut, chain), create, follow, verify, canary."""
        attempt.chain_check = self.target.check_delta  # the source runs it before its first byte is stored
        stored = source.store(attempt, self.target, self.policy.upload_workers)
        if stored is None:  # the fleet serves this version already
            return
        if stored.empty:
            attempt.skip_empty_delta()
            return
        if not stored.earlier:  # uploaded now: the next delta on it need not ask the bucket
            self.target.known_stored(attempt.plan.identity)
        attempt.before_upload(uploads=False)  # a source that uploaded nothing (a restore) is checked all the same
        plan = attempt.plan  # as stored: a cut made it FULL, a restore took its original's type
        started = time.perf_counter()
        hot_load = self.target.create(
            plan.identity,
            plan.snapshot_type,
            plan.previous_identity,
            budget=plan.budget,
            prompt_cache_policy=self.policy.prompt_cache_policy
            if attempt.prompt_cache_policy is None
            else attempt.prompt_cache_policy,
            hot_load_id=hot_load_id,
            wait_for_active=wait_for_active,
        )
        attempt.outcome.published = not attempt.restoring
        attempt.outcome.hot_load = hot_load
        shares.hold(canary=self.canary is not None, converge=self.policy.on_failure == "reactivate")
        if not self.policy.wait:
            log.info("%s: not waiting for hot-load %s (wait is off): that every replica serves it is not checked",
                     plan.identity, hot_load.id)  # fmt: skip
        else:
            hot_load = self._follow(
                hot_load,
                plan.budget,
                verify=self.policy.verify,
                on_progress=attempt.on_progress,
                outcome=attempt.outcome,
            )
        outcome = attempt.outcome
        outcome.hot_load = hot_load
        outcome.completed = hot_load.state is HotLoadState.COMPLETED
        if outcome.completed:  # the service found its index: it is in the bucket
            self.target.known_stored(hot_load.identity)
        outcome.hot_load_seconds = time.perf_counter() - started
        if self.canary is not None and outcome.completed:
            shares.release_canary()
            self._check_canary(hot_load, plan.budget, outcome)

    def _check_canary(self, hot_load: HotLoad, budget: Budget, outcome: PublishOutcome) -> None:
        """Stage 6: the canary, inside what is left of the budget; a check that cannot be made refuses too."""
        assert self.canary is not None
        try:
            result = self.canary.check(identity=hot_load.identity, timeout=budget.remaining)
        except UsageError:  # the canary is misused (its scorer): not the fleet's fault
            raise
        except (CWTrainError, OSError) as exc:  # the endpoint stopped answering, or the share ran out
            raise HotLoadVerificationError(
                hot_load, [], [f"canary: could not check the served weights ({exc})"]
            ) from exc
        outcome.canary_checked, outcome.canary_gap = True, float(result.gap)
        if not result.passed:
            raise HotLoadVerificationError(hot_load, [], [f"canary: {result.summary()}"])

    def _follow(
        self,
        hot_load: HotLoad,
        budget: Budget,
        *,
        verify: bool,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        outcome: PublishOutcome | None = None,
        split_fails: bool = True,
    ) -> HotLoad:
        """Stages 4 and 5: wait until ``hot_load`` ends and every replica serves it; verify every replica.

        Once it completed, every replica the service lists must serve its identity, whatever
        the settings (``split_fails``; off only for :meth:`follow`, ``HotLoader.wait``, where
        the aggregate state decides); ``verify`` reads the replicas once more.
        """
        last: list[ProgressEvent] = []

        def seen(event: ProgressEvent) -> None:
            last[:] = [event]
            if on_progress is not None:
                on_progress(event)

        try:
            hot_load = wait_for_hot_load(
                self.target.client, hot_load.id, budget, interval=self.target.poll_interval, on_progress=seen
            )
        except KeyboardInterrupt:  # Ctrl-C, or the CLI's SIGTERM: the hot-load runs on without us
            log.warning(
                "stopped waiting for hot-load %s: it keeps running and may still go live (follow it with "
                "`cwtrain hotload wait %s`)",
                hot_load.id,
                hot_load.id,
            )
            raise
        if outcome is not None and last:
            outcome.replicas_ready, outcome.replicas_total = last[0].ready, last[0].total
        if split_fails and hot_load.state is HotLoadState.COMPLETED:
            replicas = list(last[0].replicas) if last else []
            behind = replicas_behind(replicas, hot_load.identity)
            if outcome is not None:
                outcome.converged = 0 if behind else 1
            if behind:
                raise HotLoadVerificationError(hot_load, replicas, ["the fleet is split", *behind])
        if verify:
            replicas = verify_served(self.target.client, hot_load.id, hot_load.identity)
            if outcome is not None:
                outcome.replicas_verified = len(replicas)
        return hot_load

    # ------------------------------------------------------------------ failures

    def _converge(self, attempt: Attempt, error: BaseException) -> BaseException | None:
        """Stage 7: after a failure, the policy's answer; returns what to raise (``None``: the fleet was brought back)."""
        outcome = attempt.outcome
        outcome.failed = True
        failed_hot_load = isinstance(error, HotLoadFailedError | HotLoadVerificationError) and outcome.published
        if self.policy.on_failure != "reactivate" or not failed_hot_load:
            self._read_back(attempt, error)
            return error
        identity = attempt.plan.identity
        log.warning("publishing %s failed (%s); re-activating what the fleet served", identity, error)
        try:
            back = self.reactivate(identity, budget=attempt.plan.budget)
        except Exception as exc:
            failure = CWTrainError(f"publishing {identity} failed ({error}), and so did bringing the fleet back: {exc}")
            failure.__cause__ = exc
            self._read_back(attempt, failure)
            return failure
        outcome.reactivated = True
        outcome.served_identity = back.identity
        outcome.error = _converged(error, back.identity)
        return None

    def _read_back(self, attempt: Attempt, error: BaseException) -> None:
        """After a failure the fleet was not brought back from: record what it serves.

        Nothing was created: it serves what it served (``None`` recorded: unchanged). A hot-load
        that completed on every replica before a later stage failed: its identity. Otherwise
        (it ended otherwise, or the fleet is split) the service is asked; ``None`` when it
        cannot tell (an interrupt does not ask).
        """
        outcome = attempt.outcome
        if not outcome.published:
            return
        if outcome.converged == 1:
            outcome.served_identity = attempt.plan.identity
        elif not isinstance(error, KeyboardInterrupt | SystemExit):
            outcome.served_identity = self.target.serving()

    def refuse(self, plan: VersionPlan, problem: str, *, gap: float | None = None) -> PublishOutcome:
        """A late verdict: ``plan``'s version, whose cycle completed, is refused by a check made after it.

        A framework's own canary (:func:`cwtrain.integrations.rollout.canary.judge_samples`)
        judges a version from the log-probs of the next training step, after the version's
        cycle ended. The refusal is answered as a failed hot-load is, from stage 7 on: the
        policy's ``on_failure`` (re-activate the newest other identity whose chain can be
        replayed, or raise), then the records (the ledger hears of a failed version; its
        samples are burned, the next version is FULL). ``plan.budget`` bounds the
        re-activation.

        Args:
            plan: the version refused (:meth:`VersionPlan.of_identity`, with its run id).
            problem: what the check found.
            gap: the canary gap that refused it (``hotload/canary_gap``).

        Returns:
            the outcome (``failed``, ``reactivated``, ``served_identity``).

        Raises:
            UsageError: ``plan``'s identity never completed on this deployment.
            HotLoadVerificationError: with ``on_failure="stop"`` (after the ledger heard of it).
            CWTrainError: the re-activation failed.
        """
        hot_load = self.target.completed(plan.identity)
        if hot_load is None:
            raise UsageError(
                f"{plan.identity} never completed on deployment {self.target.deployment_id}: there is nothing to refuse"
            )
        attempt = Attempt(plan, manifest=False)
        outcome = attempt.outcome
        outcome.published = outcome.completed = True
        outcome.hot_load = hot_load
        if gap is not None:
            outcome.canary_checked, outcome.canary_gap = True, float(gap)
        error = self._converge(attempt, HotLoadVerificationError(hot_load, [], [problem]))
        self._record(attempt, error)
        if error is not None:
            raise error
        return outcome

    def reactivate(self, failed_identity: str, *, budget: Budget | None = None) -> HotLoad:
        """Bring every replica back to one identity after a failed hot-load of ``failed_identity``.

        The newest identity other than ``failed_identity`` that completed on this deployment
        and whose whole chain can be replayed (every member's objects stored and matching their
        recorded SHA-256: :meth:`Target.unreplayable`) is hot-loaded again, followed and
        verified: every replica READY on it. A candidate whose chain cannot be replayed is
        passed over for the next older one (back to the chain's FULL, and beyond).

        Args:
            failed_identity: the identity whose hot-load failed.
            budget: what the re-activation may spend (default ``CyclePolicy.timeout``; a
                version's cycle passes what is left of its own).

        Raises:
            CWTrainError: no completed identity to go back to (each candidate tried is
                named, with what is missing or corrupt), or the re-activation itself failed.
        """
        budget = budget if budget is not None else Budget(self.policy.timeout)
        tried: list[str] = []
        seen: set[str] = set()
        checked: dict[str, str] = {}
        for hot_load in self.target.hot_loads():
            identity = hot_load.identity
            if hot_load.state is not HotLoadState.COMPLETED or identity == failed_identity or identity in seen:
                continue
            seen.add(identity)
            problem = self.target.unreplayable(hot_load, checked)
            if problem:
                tried.append(f"{identity} (cannot be replayed: {problem})")
                continue
            log.warning(
                "hot-load of %r failed: re-activating %r, the newest intact identity that completed, on every replica",
                failed_identity,
                identity,
            )
            return self.restore(identity, prior=hot_load, budget=budget, wait=True, verify=True)
        raise CWTrainError(
            f"the hot-load of {failed_identity!r} failed and no completed identity of deployment "
            f"{self.target.deployment_id} can be re-activated"
            + (f" (tried: {'; '.join(tried)})" if tried else " (none completed before)")
            + "; publish a FULL snapshot"
        )

    def restore(
        self,
        identity: str,
        *,
        budget: Budget,
        prior: HotLoad | None = None,
        prompt_cache_policy: PromptCachePolicy | str | None = None,
        hot_load_id: str | None = None,
        wait: bool | None = None,
        verify: bool | None = None,
    ) -> HotLoad:
        """Hot-load ``identity`` again (a copy of its newest COMPLETED hot-load) and follow it.

        Not a version of a run (no records): a rollback asked for by hand, or a re-activation.
        ``wait`` and ``verify`` default to the policy's.

        Raises:
            UsageError: ``identity`` never completed on this deployment.
            SnapshotError: its objects (or its chain's) are gone from the bucket.
        """
        attempt = Attempt(VersionPlan.of_identity(identity, None, budget))
        stored = RestoreSource(identity, prior=prior, prompt_cache_policy=prompt_cache_policy).store(
            attempt, self.target, self.policy.upload_workers
        )
        assert stored is not None
        plan = attempt.plan
        hot_load = self.target.create(
            identity,
            plan.snapshot_type,
            plan.previous_identity,
            budget=budget,
            prompt_cache_policy=attempt.prompt_cache_policy,
            hot_load_id=hot_load_id,
        )
        if not (self.policy.wait if wait is None else wait):
            return hot_load
        return self._follow(hot_load, budget, verify=self.policy.verify if verify is None else verify)

    def follow(
        self,
        hot_load_id: str,
        budget: Budget,
        *,
        on_progress: Callable[[ProgressEvent], None] | None = None,
    ) -> HotLoad:
        """Follow hot-load ``hot_load_id`` (created before) to its end, converging as the policy says.

        Raises:
            HotLoadFailedError: it ended FAILED or CANCELED (after the re-activation, which
                the message names, with ``on_failure="reactivate"``).
            HotLoadVerificationError: with ``verify``, a replica does not serve it.
            HotLoadTimeoutError: the budget ran out first.
        """
        try:
            return self._follow(
                HotLoad(id=hot_load_id), budget, verify=self.policy.verify, on_progress=on_progress, split_fails=False
            )
        except (HotLoadFailedError, HotLoadVerificationError) as error:
            if self.policy.on_failure != "reactivate":
                raise
            back = self.reactivate(error.hot_load.identity)
            raise _converged(error, back.identity) from error

    # ------------------------------------------------------------------ records

    def _record(self, attempt: Attempt, error: BaseException | None) -> None:
        """Stage 8: the served-identity file, the manifest, the timing, then the run's ledger."""
        plan, outcome = attempt.plan, attempt.outcome
        if not outcome.failed and not outcome.skipped_empty:
            outcome.served_identity = plan.identity  # served, or will be once a hot-load not waited for completes
            if attempt.manifest and plan.run_id is not None and attempt.checksums is not None:
                self._write_manifest(plan, attempt.checksums)
        elif outcome.skipped_empty:
            outcome.served_identity = plan.previous_identity
        if outcome.served_identity is not None and not outcome.skipped_empty and self.policy.state_dir:
            record_served_identity(self.policy.state_dir, outcome.served_identity)
        outcome.publish_seconds = time.perf_counter() - attempt.started
        if self.ledger is not None:
            self.ledger.ended(attempt, error)

    def _write_manifest(self, plan: VersionPlan, checksums: Mapping[str, str]) -> None:
        """Write the manifest of ``plan``'s identity (snapshot-format.md section 8.1); a failure only warns."""
        assert plan.run_id is not None
        manifest = snapshot_manifest(
            plan.identity, self.target.deployment_id, plan.run_id, checksums, f"{plan.version:06d}"
        )
        try:
            self.target.store.write_manifest(plan.identity, manifest)
        except Exception as exc:  # manifests only help resumes: warn, never fail the step
            log.warning("could not write the manifest of %s: %s", plan.identity, exc)


#: The share of a version's budget held back for the canary (when one is given and the cycle waits).
CANARY_SHARE = 0.1
#: The share held back for bringing the fleet back after a failure (``on_failure="reactivate"``).
CONVERGE_SHARE = 0.25


@dataclass
class _Shares:
    """The budget's shares held back, once a hot-load is created, from the stages before them.

    Until the create the stages have the whole budget (no create is sent once it is spent);
    from then on the follow (and verify) leave the canary's share and the re-activation's. A
    share left unused passes on.
    """

    budget: Budget
    canary: float = 0.0
    converge: float = 0.0

    def hold(self, *, canary: bool, converge: bool) -> None:
        """Hold back the canary's and the re-activation's shares (those that may come)."""
        left = self.budget.remaining
        self.canary = CANARY_SHARE * left if canary else 0.0
        self.converge = CONVERGE_SHARE * left if converge else 0.0
        self.budget.total -= self.canary + self.converge

    def release_canary(self) -> None:
        """The canary's turn: its share joins what the stages before it left."""
        self.budget.extend(self.canary)
        self.canary = 0.0

    def release(self) -> bool:
        """A failure: every share held back is available to the answer to it; whether one was held."""
        held = self.canary + self.converge
        self.budget.extend(held)
        self.canary = self.converge = 0.0
        return held > 0


def _converged(error: BaseException, identity: str) -> BaseException:
    """``error`` with the re-activation that answered it in its message."""
    back = f"every replica serves {identity!r} again (re-activated)"
    if isinstance(error, HotLoadFailedError):
        return HotLoadFailedError(error.hot_load, error.replicas, f"{error}; {back}")
    if isinstance(error, HotLoadVerificationError):
        return HotLoadVerificationError(error.hot_load, error.replicas, [*error.problems, back])
    return error
