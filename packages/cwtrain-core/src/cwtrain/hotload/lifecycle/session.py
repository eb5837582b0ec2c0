"""``PublishSession``: a run's versions, one after the other, through the one composer.

One session lives on the publishing process of a run (rank 0, the driver, the demo, a custom
loop) and keeps what a run remembers between versions: the version counter, the chain
cadence (:class:`~cwtrain.hotload.lifecycle.cadence.ChainCadence`: when a version is FULL,
and why), the identity the fleet serves, and who hears of each version (the plug-in's
logger, the rollout sampler). Each version's cycle (store, create, follow, verify, canary,
converge, records) is the composer's,
:class:`~cwtrain.hotload.lifecycle.cycle.VersionCycle`, which every entry point drives; the
session configures it from the run's settings (``CyclePolicy.of``) and is its ledger. The
plug-ins hold only their framework's words: hook signatures, collectives, config keys,
loggers::

    session = PublishSession(HotLoadSettings.from_env(default_run_id="run1"))
    outcome = session.publish_baseline("ckpt/base")              # <run>-v000000, FULL
    plan = session.begin()                                       # the next version: FULL or delta?
    outcome = session.publish_tensors(plan, new, base=served)    # or publish_directory / publish_diff
    outcome.metrics()                                            # {"hotload/version": 1.0, ...}
    outcome = session.publish(plan, source)                      # any source of cwtrain.hotload.lifecycle.sources

Distributed publishers make a plan on the committing process, let every rank store its
share (:mod:`cwtrain.hotload.lifecycle.protocol`), and finish with
:meth:`PublishSession.commit_shares`.

**When a hot-load fails.** A hot-load that ends FAILED or CANCELED, that completes while a
replica the service lists does not serve it (checked whatever ``verify`` says), or whose
served weights the optional canary refuses or cannot check, may leave the fleet serving a mix.
With ``on_failure="reactivate"`` (the integrations' default) the composer re-activates the
newest identity that completed and whose chain can be replayed, and waits until every replica
serves it; the session returns an outcome with ``failed=1`` and ``reactivated=1``: the run goes
on, and its next version is FULL. With ``stop`` the error is raised (after the outcome reached
the sink), as is any failure before a hot-load was created (the fleet did not change then);
either way :attr:`PublishSession.served_identity` names what the fleet serves afterwards.

**The canary** (``canary=``): after each hot-load the deployment scores a fixed probe and
the integration's trainer scores it too (:class:`cwtrain.integrations.rollout.Canary`); a gap
above the bound fails the publish, as above (``hotload/canary_gap``). A check made after the
publish, from the log-probs the trainer computes anyway
(:func:`cwtrain.integrations.rollout.canary.judge_samples`), is answered the same way by
:meth:`PublishSession.refuse`.

**Followers** (``followers=``) are told ``(run_id, version)`` whenever the fleet serves a
version of the run: a rollout sampler in the same process learns the newest version it may
sample from (``cwtrain.integrations.rollout.note_published``); ``on_burned=`` hears of each
version whose hot-load was created and that failed, whose samples it refuses
(``cwtrain.integrations.rollout.note_burned``).

**Restarts.** A trainer restarted with the same run id continues the run: on first use the
session reads what the fleet holds of it once (:meth:`PublishSession.resume`: the deployment's
hot-loads and the store's identities of the run, since a failed attempt may have stored
objects under an identity that never got a hot-load), and its next version is the one after
the last any process of the run attempted. A number asked for that is not above it (a
framework counting from its own restart) is published as the next version instead, with a
warning. The restarted trainer's weights are not known to equal what the fleet serves, so its
first version is FULL (``first``, logged as a restart); its baseline never rolls the fleet back
from a later version of the run unless ``CWTRAIN_HOTLOAD_ROLLBACK_ON_RESUME`` asks
(:meth:`PublishSession.publish_baseline`).

**FULL or delta.** :meth:`PublishSession.begin` decides what needs no measurement (nothing
served yet, after a failure, the count, the 63-delta limit). With
``CWTRAIN_HOTLOAD_FULL_EVERY=auto`` a delta plan is then weighed once its size is known and
before any byte of it is uploaded (:meth:`PublishSession.weigh`, which the composer asks):
at least 90 % of the last FULL's bytes, or a chain that would make a cold replica replay more
than two FULLs' bytes, publishes the version FULL instead. No source encodes twice to decide
(:mod:`~cwtrain.hotload.lifecycle.sources`). The decision and its reason are logged and reach
the metrics as ``hotload/cut_reason`` (:class:`~cwtrain.hotload.lifecycle.cadence.CutReason`'s
code) and ``hotload/replay_bytes``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cwtrain.closing import Closing
from cwtrain.errors import CWTrainError, UsageError
from cwtrain.hotload.format.identity import identity_version, version_identity
from cwtrain.hotload.lifecycle.cadence import ChainCadence, CutReason
from cwtrain.hotload.lifecycle.cycle import CyclePolicy, VersionCycle
from cwtrain.hotload.lifecycle.served import record_served_identity
from cwtrain.hotload.lifecycle.settings import HotLoadSettings
from cwtrain.hotload.lifecycle.shares import ShareResult
from cwtrain.hotload.lifecycle.sources import (
    DiffSource,
    DirectorySource,
    RestoreSource,
    ShareSource,
    TensorSource,
    UnchangedSource,
    VersionSource,
)
from cwtrain.hotload.lifecycle.target import RunHistory, Target
from cwtrain.hotload.lifecycle.version import Attempt, PublishOutcome, ServedCheck, VersionPlan
from cwtrain.hotload.store.prefix import StoredSnapshot
from cwtrain.polling import Budget

__all__ = ["PublishSession"]

log = logging.getLogger(__name__)


class PublishSession(Closing):
    """A run's publishing to one deployment, one version at a time (see the module docstring).

    Args:
        settings: the run's hot-load settings.
        target: where to publish (default: built from ``settings`` on first use, with an
            API client of its own that :meth:`close` closes).
        sink: called with every :class:`PublishOutcome` (the plug-in's logger), failures included.
        canary: checked after every hot-load (when waiting); a failed check fails the publish.
        followers: called with ``(run_id, version)`` whenever the fleet serves a version of
            this run (a rollout sampler's ``note_published``).
        on_burned: called with ``(run_id, version)`` when a version is burned: its hot-load
            was created and the version failed (the fleet brought back, or the error raised),
            so it is never announced as served (a rollout sampler's ``note_burned``).

    Attributes:
        settings: the settings.
        cadence: when a version is FULL.
        served_identity: the identity the replicas serve (or will once the last hot-load
            completes): the newest completed hot-load's once the fleet was read
            (:meth:`resume`); ``None`` when nothing was hot-loaded yet.
        last_version: the last version this session published or skipped (-1 before any).
        last_attempted: the last version a publish was attempted for, failed ones included,
            by this session or (found by :meth:`resume`) an earlier process of the run: a
            failed attempt may have stored objects under its identity, and identities are
            immutable, so the next plan takes the number after it.
        history: what the fleet held of the run when it was first read (``None`` before).
    """

    def __init__(
        self,
        settings: HotLoadSettings,
        *,
        target: Target | None = None,
        sink: Callable[[PublishOutcome], None] | None = None,
        canary: ServedCheck | None = None,
        followers: Sequence[Callable[[str, int], None]] = (),
        on_burned: Sequence[Callable[[str, int], None]] = (),
    ) -> None:
        self.settings = settings
        self._target = target
        self._own_target = target is None
        self.sink = sink
        self.canary = canary
        self.followers: list[Callable[[str, int], None]] = list(followers)
        self.on_burned: list[Callable[[str, int], None]] = list(on_burned)
        self.cadence = ChainCadence(settings.full_every, settings.full_share, settings.replay_budget)
        self.served_identity: str | None = None
        self.last_version = -1
        self.last_attempted = -1
        self.history: RunHistory | None = None
        self._attempts = 0  # versions this session attempted (or kept): the baseline comes before any
        self._renumbered = False  # a version asked for was moved after the run's last attempt (warned once)

    # ------------------------------------------------------------------ plumbing

    @property
    def target(self) -> Target:
        """Where the run publishes (built from the settings on first use)."""
        if self._target is None:
            self._target = Target.of_settings(self.settings)
        return self._target

    def close(self) -> None:
        """Close the API client when the session built it (a target passed in is the caller's)."""
        target, self._target = self._target, None
        if target is not None and self._own_target:
            target.client.close()

    @property
    def run_id(self) -> str:
        """The run id."""
        return self.settings.run_id

    def identity(self, version: int) -> str:
        """``<run>-v{version:06d}``."""
        return version_identity(self.settings.run_id, version)

    @property
    def served_version(self) -> int | None:
        """The version of :attr:`served_identity` (``None`` when it is not one of this run's)."""
        return identity_version(self.served_identity, self.settings.run_id)

    def _cycle(self) -> VersionCycle:
        return VersionCycle(self.target, CyclePolicy.of(self.settings), canary=self.canary, ledger=self)

    # ------------------------------------------------------------------ plans

    def resume(self) -> RunHistory:
        """What the fleet holds of this run, read once (on first use): where a restarted trainer goes on.

        The deployment's hot-loads and the store's identities of the run
        (:meth:`Target.history <cwtrain.hotload.lifecycle.target.Target.history>`) raise
        :attr:`last_attempted` to the highest version found, so the next version follows the
        last one any process of the run attempted; :attr:`served_identity` becomes what the
        newest completed hot-load serves. :meth:`begin` and :meth:`plan_baseline` call it.

        Raises:
            APIError: the hot-loads could not be listed.
        """
        if self.history is None:
            history = self.target.history(self.run_id)
            self.history = history
            self.last_attempted = max(self.last_attempted, history.last_version)
            if self.served_identity is None:
                self.served_identity = history.served_identity
            if history.last_version >= 0:
                log.info(
                    "run %r resumed: its last version attempted is %d (hot-loads up to %d, stored objects up to %d%s); "
                    "the deployment serves %s; this process publishes from version %d on",
                    self.run_id,
                    history.last_version,
                    history.last_hot_loaded,
                    history.last_stored,
                    "" if history.store_listed else ", the store could not be listed",
                    self.served_identity or "its base weights",
                    self.last_attempted + 1,
                )
        return self.history

    def next_version(self) -> int:
        """The version :meth:`begin` plans when none is asked for (the fleet is read on first use)."""
        self.resume()
        return self.last_attempted + 1

    @property
    def resumed(self) -> bool:
        """Whether the fleet held versions of this run from before this session (a restarted trainer)."""
        return self.history is not None and self.history.last_version >= 0

    def begin(
        self, version: int | None = None, *, full: bool = False, cadence_position: int | None = None
    ) -> VersionPlan:
        """Plan ``version`` (default: the next one): FULL or a delta on what is served, and its budget.

        The first call reads what the fleet holds of the run (:meth:`resume`).

        Args:
            version: the version number; must be above :attr:`last_attempted` (a failed
                version's identity is not used again: its objects may be stored). In a
                resumed run a number that is not (a framework that counts from its own
                restart) is published as the next version instead, with a warning.
            full: publish FULL whatever the cadence says.
            cadence_position: the count the cadence goes by (default ``version``): a caller
                whose versions skip numbers (miles' post-save hook) passes how many it published.

        Raises:
            UsageError: the version is not above the last one attempted, in a run that did not resume.
        """
        self.resume()
        number = self.last_attempted + 1 if version is None else version
        if number <= self.last_attempted:
            if not self.resumed:
                raise UsageError(
                    f"version {number} of run {self.run_id!r} comes after version {self.last_attempted}: "
                    "versions must increase (a failed version's identity is not published again)"
                )
            moved = self.last_attempted + 1
            (log.info if self._renumbered else log.warning)(
                "version %d of run %r is not above the run's last attempt (%d, by this process or one before its "
                "restart; identities are never reused): publishing it as version %d",
                number,
                self.run_id,
                self.last_attempted,
                moved,
            )
            self._renumbered = True
            number = moved
        return self._plan(number, full=full, position=number if cadence_position is None else cadence_position)

    def plan_baseline(self) -> VersionPlan:
        """The plan of the baseline ``<run>-v000000`` (FULL), the first version of every process of a run.

        Also in a resumed run, where version 0 exists: :meth:`publish_baseline` keeps it (or
        stores its same bytes again), so it is not moved to a new number as :meth:`begin` would.

        Raises:
            UsageError: this session attempted a version already (the baseline comes first).
        """
        self.resume()
        if self._attempts:
            raise UsageError(
                f"the baseline {self.identity(0)} comes first: this session already attempted version "
                f"{self.last_attempted} of run {self.run_id!r}"
            )
        return self._plan(0, full=True, position=0)

    def _plan(self, number: int, *, full: bool, position: int) -> VersionPlan:
        """The plan of version ``number``: why it is FULL, or the delta on what is served."""
        if self.served_identity is None or (self.cadence.force_full and not self.cadence.after_failure):
            reason = CutReason.FIRST  # nothing of this process is served yet (a new trainer, or a restarted one)
        elif full:
            reason = CutReason.REQUESTED
        else:
            reason = self.cadence.reason(position)
        cut = reason is not CutReason.NONE
        plan = VersionPlan(
            version=number,
            identity=self.identity(number),
            full=cut,
            previous_identity=None if cut else self.served_identity,
            budget=Budget(self.settings.timeout),
            cut_reason=reason,
            cut_at_bytes=None if cut else self.cadence.delta_limit(),
            run_id=self.run_id,
        )
        if cut and reason is CutReason.FIRST and self.resumed and self.served_identity is not None:
            log.info("%s: FULL (first of a restarted trainer: the fleet serves %s, which this process's weights are "
                     "not known to equal)", plan.identity, self.served_identity)  # fmt: skip
        elif cut:
            log.info("%s: FULL (%s)", plan.identity, reason.label)
        elif plan.cut_at_bytes is None:
            log.info("%s: a delta on %s (chain of %d deltas)", plan.identity, plan.previous_identity,
                     self.cadence.deltas_in_chain)  # fmt: skip
        else:
            log.debug("%s: a delta on %s unless it reaches %d bytes", plan.identity, plan.previous_identity,
                      plan.cut_at_bytes)  # fmt: skip
        return plan

    def weigh(self, plan: VersionPlan, delta_bytes: int) -> VersionPlan:
        """The cost rule of ``auto``: ``plan``, or its FULL cut when its delta of ``delta_bytes`` costs too much.

        Asked once the delta's size is known (as it would be stored: shards and index) and
        before any byte of it is uploaded. A FULL plan, or one no cost rule applies to
        (a fixed count, or no FULL of known size yet), comes back unchanged. The decision
        and its reason are logged.

        Raises:
            UsageError: ``delta_bytes`` is negative.
        """
        if delta_bytes < 0:
            raise UsageError(f"delta_bytes={delta_bytes} of {plan.identity} must be >= 0")
        if plan.full or plan.cut_at_bytes is None:
            return plan
        described = self.cadence.describe(delta_bytes)
        reason = self.cadence.cost_reason(delta_bytes) if delta_bytes >= plan.cut_at_bytes else CutReason.NONE
        if reason is CutReason.NONE:
            log.info("%s: a delta on %s (%s)", plan.identity, plan.previous_identity, described)
            return plan
        log.info("%s: FULL instead of a delta (%s: %s)", plan.identity, reason.label, described)
        return plan.cut(reason)

    # ------------------------------------------------------------------ sources

    def publish(
        self,
        plan: VersionPlan,
        source: VersionSource,
        *,
        checksums: Mapping[str, str] | None = None,
        manifest: bool = True,
    ) -> PublishOutcome:
        """Publish ``plan``'s version from ``source`` (:mod:`cwtrain.hotload.lifecycle.sources`) through the composer.

        Args:
            plan: from :meth:`begin`.
            source: what the version is published from.
            checksums: the Adler-32 of every tensor of the full weights at this version
                (for the manifest; default: what the encoder computed, none for a directory).
            manifest: write the version's manifest.

        Returns:
            the outcome, also of a failed hot-load the fleet was brought back from.

        Raises:
            CWTrainError: a failure the fleet was not brought back from (``on_failure=stop``,
                or before a hot-load was created).
        """
        return self._cycle().publish(plan, source, checksums=checksums, weigh=self.weigh, manifest=manifest)

    def publish_directory(
        self,
        plan: VersionPlan,
        directory: str | os.PathLike[str],
        *,
        checksums: Mapping[str, str] | None = None,
        full: VersionSource | None = None,
    ) -> PublishOutcome:
        """Publish a snapshot directory as ``plan``'s version: a FULL checkpoint, or a delta on the served identity.

        Args:
            plan: from :meth:`begin`; a delta directory needs a delta plan.
            directory: the snapshot directory (inspected once, inside the cycle).
            checksums: the Adler-32 of every tensor of the full weights at this version
                (for the manifest; none is written without them).
            full: what a delta is published from when the cost rule cuts it FULL (weighed by
                the directory's files as uploaded); without it a delta is never cut by cost.
        """
        return self.publish(plan, DirectorySource(directory, full=full), checksums=checksums)

    def publish_tensors(
        self,
        plan: VersionPlan,
        tensors: Mapping[str, Any],
        *,
        base: Mapping[str, Any] | None = None,
        extra_files: Mapping[str, bytes] | None = None,
        checksums: Mapping[str, str] | None = None,
    ) -> PublishOutcome:
        """Publish in-memory tensors: FULL, or an XOR delta against ``base`` (what the replicas serve).

        An empty delta publishes nothing (the version is recorded as skipped). Under ``auto``
        a delta is encoded in memory and weighed before any byte is uploaded; when it costs
        too much the version is published FULL from ``tensors`` instead (so pass
        ``extra_files`` with a delta plan too: they go with a FULL snapshot only).

        Args:
            plan: from :meth:`begin`.
            tensors: the new weights (numpy arrays, torch tensors or ``TensorData``).
            base: the served weights, byte-exact (deltas only).
            extra_files: other files of a FULL snapshot (``config.json``, ...).
            checksums: the Adler-32 of every tensor at this version when already known (the
                manifest); default: the ones the encoder computed.
        """
        return self.publish(plan, TensorSource(tensors, base=base, full_files=extra_files), checksums=checksums)

    def publish_diff(
        self, plan: VersionPlan, checkpoint: str | os.PathLike[str], base: str | os.PathLike[str]
    ) -> PublishOutcome:
        """Publish checkpoint ``checkpoint``: FULL from its directory, or as the delta from checkpoint ``base``.

        ``base`` holds the weights the replicas serve (byte-exact). An empty delta publishes
        nothing. Under ``auto`` the delta is encoded in memory and weighed; when it costs too
        much, ``checkpoint``'s directory is published FULL instead.
        """
        return self.publish(plan, DiffSource(checkpoint, base))

    def commit_shares(
        self,
        plan: VersionPlan,
        shares: Sequence[ShareResult],
        *,
        extra_files: Mapping[str, bytes] | None = None,
    ) -> PublishOutcome:
        """Finish a distributed publish: every rank stored its share; write the index and hot-load.

        An empty delta (no rank wrote a shard) publishes nothing. The manifest gets the
        checksums every rank reported. Under ``auto`` ``plan`` is the one :meth:`weigh`
        returned for the sum of the ranks' shard bytes (the ranks stored FULL shares for a cut).

        Raises:
            CWTrainError: a rank reported an error (nothing is committed).
        """
        checksums = {name: value for share in shares for name, value in share.checksums.items()}
        return self.publish(plan, ShareSource(shares, files=extra_files), checksums=checksums)

    def publish_baseline(
        self,
        checkpoint: str | os.PathLike[str],
        *,
        checksums: Mapping[str, str] | None = None,
        plan: VersionPlan | None = None,
    ) -> PublishOutcome:
        """Publish a base checkpoint as ``<run>-v000000`` (FULL), unless an identical one completed.

        A COMPLETED hot-load of that identity whose manifest holds the same tensor checksums
        is kept (a resumed run): the replicas are pointed back at it when they serve another
        run's identity or the deployment's base. When they serve a later version of this run
        (a restarted trainer), nothing is hot-loaded: the fleet keeps it and the next version
        is FULL; ``rollback_on_resume`` (``CWTRAIN_HOTLOAD_ROLLBACK_ON_RESUME``) points them back
        at the baseline instead, and the chain goes on from it. With ``publish_baseline=False``
        the baseline must exist (unless the fleet keeps the later version).

        Args:
            checkpoint: the base checkpoint directory.
            checksums: its tensors' Adler-32s (default: computed from the directory, timed
                as ``stage_seconds``).
            plan: the plan of version 0 (default: :meth:`plan_baseline`), for a caller that
                measured figures of its own.

        Raises:
            UsageError: ``plan`` is not version 0.
            CWTrainError: the baseline is required but missing, or publishing failed.
        """
        from cwtrain.hotload.files.write import checkpoint_checksums

        self.resume()
        plan = plan if plan is not None else self.plan_baseline()
        if plan.version != 0:
            raise UsageError(f"{plan.identity} is not the baseline {self.identity(0)}: plan it with plan_baseline()")
        served = self.served_version
        if served is not None and served > 0 and not self.settings.rollback_on_resume:
            return self._keep_served(plan)
        if checksums is not None:
            sums = dict(checksums)
        else:
            started = time.perf_counter()
            sums = dict(checkpoint_checksums(Path(checkpoint)))
            plan.measure(stage_seconds=time.perf_counter() - started)
        existing = self.target.completed(plan.identity)
        if self.settings.publish_baseline and (existing is None or not self._manifest_matches(plan.identity, sums)):
            return self.publish_directory(plan, checkpoint, checksums=sums)
        if existing is None:
            raise CWTrainError(
                f"CWTRAIN_HOTLOAD_PUBLISH_BASELINE is off but {plan.identity} was never hot-loaded on deployment "
                f"{self.settings.deployment_id}: publish it first or turn CWTRAIN_HOTLOAD_PUBLISH_BASELINE on"
            )
        log.info("baseline %s already completed with the same weights; not published again", plan.identity)
        kept = RestoreSource(plan.identity, prior=existing, unless_served=True, measure=True)
        return self._cycle().publish(plan, _KeptBaseline(kept), weigh=self.weigh, manifest=False)

    def _keep_served(self, plan: VersionPlan) -> PublishOutcome:
        """The baseline of a restarted trainer while the fleet serves a later version of the run: nothing is hot-loaded.

        The outcome (``baseline_skipped``, nothing published) reaches the sink and the
        followers like any version's; the cadence is left as it is, so the next version is
        FULL (the trainer's weights are not known to equal the served ones).
        """
        log.info(
            "baseline %s: not hot-loaded again: the deployment serves %s, a later version of run %r (a restarted "
            "trainer); the next version is FULL (CWTRAIN_HOTLOAD_ROLLBACK_ON_RESUME=1 points the fleet back at the "
            "baseline instead)",
            plan.identity,
            self.served_identity,
            self.run_id,
        )
        outcome = Attempt(plan).outcome  # with the figures the publisher measured
        outcome.identity = None
        outcome.chain_cut = outcome.incremental = False
        outcome.cut_reason = int(CutReason.NONE)
        outcome.baseline_skipped = True
        if self.settings.state_dir and self.served_identity is not None:  # as after any version
            record_served_identity(self.settings.state_dir, self.served_identity)
        self._attempts += 1
        self.last_version = max(self.last_version, plan.version)
        self._tell(outcome, None)
        return outcome

    def refuse(self, identity: str, problem: str, *, gap: float | None = None) -> PublishOutcome:
        """The fleet serves ``identity`` and a check made after its publish refused it (a late verdict).

        A framework's canary judges a version from the log-probs its next training step
        computes (:func:`cwtrain.integrations.rollout.canary.judge_samples`), after the
        version's cycle ended; the composer answers the refusal as it answers a failed
        hot-load (:meth:`VersionCycle.refuse <cwtrain.hotload.lifecycle.cycle.VersionCycle.refuse>`):
        with ``on_failure="reactivate"`` every replica is brought back to the newest other
        identity whose chain can be replayed, and the outcome (``failed``, ``reactivated``,
        ``canary_gap``) reaches the sink; ``on_burned`` hears of the version, whose samples the
        caller leaves out of its batch; the next version is FULL. With ``stop`` the error is
        raised after the sink heard of it.

        Args:
            identity: the identity the check refused: the one the fleet serves.
            problem: what the check found (one line).
            gap: the canary gap that refused it.

        Raises:
            UsageError: ``identity`` is not what this session knows the fleet serves.
        """
        if identity != self.served_identity:
            raise UsageError(
                f"{identity!r} is not what the fleet serves ({self.served_identity!r}): only the served identity can "
                "be refused"
            )
        plan = VersionPlan.of_identity(identity, None, Budget(self.settings.timeout))
        if identity_version(identity, self.run_id) is not None:
            plan = replace(plan, run_id=self.run_id)
        log.warning("%s refused after its publish (%s); answering it as a failed hot-load", identity, problem)
        return self._cycle().refuse(plan, problem, gap=gap)

    def skip(self, plan: VersionPlan) -> PublishOutcome:
        """Record ``plan``'s version as an empty delta (nothing changed): nothing is published."""
        return self.publish(plan, UnchangedSource())

    # ------------------------------------------------------------------ the ledger

    def ended(self, attempt: Attempt, error: BaseException | None) -> None:
        """The composer's report of one version: the counter, the cadence, the served identity, the sink, the followers."""
        plan, outcome = attempt.plan, attempt.outcome
        self._attempts += 1
        self.last_attempted = max(self.last_attempted, plan.version)
        if outcome.failed:
            self.cadence.failed()  # the replicas keep (or got back) what they served: the next version is FULL
        else:
            self.last_version = max(self.last_version, plan.version)
            if not outcome.skipped_empty:
                self.cadence.published(full=plan.full, snapshot_bytes=attempt.cadence_bytes)
        if outcome.served_identity is not None or (outcome.failed and outcome.published and not outcome.reactivated):
            self.served_identity = outcome.served_identity  # None: the fleet is split (or cannot be told)
        self._tell(outcome, error)

    def _tell(self, outcome: PublishOutcome, error: BaseException | None) -> None:
        """Complete ``outcome`` with what is served now and hand it to the sink, then the followers."""
        outcome.served_version = self.served_version if self.served_version is not None else -1
        outcome.trainer_wait_seconds = outcome.publish_seconds  # the caller waited for all of it (PublishAhead: less)
        outcome.chain_length = self.cadence.deltas_in_chain
        outcome.replay_bytes = self.cadence.replay_bytes
        if self.sink is not None:
            try:
                self.sink(outcome)
            except Exception:  # a logger must never fail a publish
                log.warning("the metrics sink failed on version %d", outcome.version, exc_info=True)
        if outcome.failed and outcome.published:  # created, then refused: never served to sample from
            for burned in self.on_burned:
                burned(self.run_id, outcome.version)
        if error is None and outcome.served_version >= 0:
            for follower in self.followers:
                follower(self.run_id, outcome.served_version)

    def _manifest_matches(self, identity: str, checksums: Mapping[str, str]) -> bool:
        try:
            manifest = self.target.store.read_manifest(identity)
        except Exception as exc:
            log.warning("could not read the manifest of %s (%s); publishing it again", identity, exc)
            return False
        return manifest is not None and dict(manifest.get("tensors") or {}) == dict(checksums)


class _KeptBaseline:
    """The baseline kept from an earlier run: recorded as this run's version 0, re-pointed to when not served."""

    def __init__(self, restore: RestoreSource) -> None:
        self.restore = restore

    def store(self, attempt: Attempt, target: Target, workers: int) -> StoredSnapshot | None:
        attempt.outcome.baseline_skipped = True
        return self.restore.store(attempt, target, workers)
