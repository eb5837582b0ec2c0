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
above the bound fails the publish, as above (``hotload/canary_gap``).

**Followers** (``followers=``) are told ``(run_id, version)`` whenever the fleet serves a
version of the run: a rollout sampler in the same process learns the newest version it may
sample from (``cwtrain.integrations.rollout.note_published``); ``on_burned=`` hears of each
version whose hot-load was created and that failed, whose samples it refuses
(``cwtrain.integrations.rollout.note_burned``).

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
from pathlib import Path
from typing import Any

from cwtrain.closing import Closing
from cwtrain.errors import CWTrainError, UsageError
from cwtrain.hotload.format.identity import identity_version, version_identity
from cwtrain.hotload.lifecycle.cadence import ChainCadence, CutReason
from cwtrain.hotload.lifecycle.cycle import CyclePolicy, VersionCycle
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
from cwtrain.hotload.lifecycle.target import Target
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
            completes); ``None`` before the first publish.
        last_version: the last version published or skipped (-1 before any).
        last_attempted: the last version a publish was attempted for, failed ones included:
            a failed attempt may have stored objects under its identity, and identities are
            immutable, so the next plan takes the number after it.
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

    def begin(
        self, version: int | None = None, *, full: bool = False, cadence_position: int | None = None
    ) -> VersionPlan:
        """Plan ``version`` (default: the next one): FULL or a delta on what is served, and its budget.

        Args:
            version: the version number; must be above :attr:`last_attempted` (a failed
                version's identity is not used again: its objects may be stored).
            full: publish FULL whatever the cadence says.
            cadence_position: the count the cadence goes by (default ``version``): a caller
                whose versions skip numbers (miles' post-save hook) passes how many it published.

        Raises:
            UsageError: the version is not above the last one attempted.
        """
        number = self.last_attempted + 1 if version is None else version
        if number <= self.last_attempted:
            raise UsageError(
                f"version {number} of run {self.run_id!r} comes after version {self.last_attempted}: "
                "versions must increase (a failed version's identity is not published again)"
            )
        position = number if cadence_position is None else cadence_position
        if self.served_identity is None:
            reason = CutReason.FIRST
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
        if cut:
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
        is kept (a resumed run): the replicas are pointed back at it when they serve something
        else. With ``publish_baseline=False`` it must exist.

        Args:
            checkpoint: the base checkpoint directory.
            checksums: its tensors' Adler-32s (default: computed from the directory, timed
                as ``stage_seconds``).
            plan: the plan of version 0 (default: ``begin(0, full=True)``), for a caller
                that measured figures of its own.

        Raises:
            CWTrainError: the baseline is required but missing, or publishing failed.
        """
        from cwtrain.hotload.files.write import checkpoint_checksums

        plan = plan if plan is not None else self.begin(0, full=True)
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

    def skip(self, plan: VersionPlan) -> PublishOutcome:
        """Record ``plan``'s version as an empty delta (nothing changed): nothing is published."""
        return self.publish(plan, UnchangedSource())

    # ------------------------------------------------------------------ the ledger

    def ended(self, attempt: Attempt, error: BaseException | None) -> None:
        """The composer's report of one version: the counter, the cadence, the served identity, the sink, the followers."""
        plan, outcome = attempt.plan, attempt.outcome
        self.last_attempted = max(self.last_attempted, plan.version)
        if outcome.failed:
            self.cadence.failed()  # the replicas keep (or got back) what they served: the next version is FULL
        else:
            self.last_version = max(self.last_version, plan.version)
            if not outcome.skipped_empty:
                self.cadence.published(full=plan.full, snapshot_bytes=attempt.cadence_bytes)
        if outcome.served_identity is not None:
            self.served_identity = outcome.served_identity
        outcome.served_version = self.served_version if self.served_version is not None else -1
        outcome.chain_length = self.cadence.deltas_in_chain
        outcome.replay_bytes = self.cadence.replay_bytes
        if self.sink is not None:
            try:
                self.sink(outcome)
            except Exception:  # a logger must never fail a publish
                log.warning("the metrics sink failed on version %d", outcome.version, exc_info=True)
        if outcome.failed and outcome.published:  # created, then refused: never served to sample from
            for burned in self.on_burned:
                burned(self.run_id, plan.version)
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
