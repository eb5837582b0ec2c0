"""``PublishSession``: the cycle of one version, the same for every integration.

One session lives on the publishing process of a run (rank 0, the driver, the demo) and owns
what publishing a version means: the version counter and the served identity, the chain
cadence (:class:`~cwtrain.hotload.lifecycle.cadence.ChainCadence`), one time budget for the
whole cycle (``settings.timeout``: encode, upload, readiness, single-flight, completion,
verification), READY → trigger → wait → verify, the served-identity file, the manifest, and
one metrics schema (:class:`PublishOutcome`, turned into ``hotload/*`` metrics in one
place). The plug-ins hold only their framework's words: hook signatures, collectives,
config keys, loggers::

    session = PublishSession(HotLoadSettings.from_env(default_run_id="run1"))
    outcome = session.publish_baseline("ckpt/base")              # <run>-v000000, FULL
    plan = session.begin()                                       # the next version: FULL or delta?
    outcome = session.publish_tensors(plan, new, base=served)    # or publish_directory / publish_diff
    outcome.metrics()                                            # {"hotload/version": 1.0, ...}

Distributed publishers make a plan on the committing process, let every rank store its
share (:mod:`cwtrain.hotload.lifecycle.shares`), and finish with
:meth:`PublishSession.commit_shares`.

**When a hot-load fails.** A hot-load that ends FAILED or CANCELED, that completes while
``verify`` finds replicas not caught up, or whose served weights the optional canary refuses,
may leave the fleet serving a mix. With ``on_failure="reactivate"`` (the integrations'
default) the session re-activates the newest intact identity that completed, waits until
every replica serves it (:func:`cwtrain.hotload.lifecycle.cycle.reactivate`), logs why, and
returns an outcome with ``failed=1`` and ``reactivated=1``: the run goes on, and its next
version is FULL. With ``stop`` the error is raised (after the outcome reached the sink), as
is any failure before a hot-load was created (the fleet did not change then).

**The canary** (``canary=``): after each hot-load the deployment scores a fixed probe and
the integration's trainer scores it too (:class:`cwtrain.integrations.rollout.Canary`); a gap
above the bound fails the publish, as above (``hotload/canary_gap``).

**Followers** (``followers=``) are told ``(run_id, version)`` whenever the fleet serves a
version of the run: a rollout sampler in the same process learns the newest version it may
sample from (``cwtrain.integrations.rollout.note_published``).

**FULL or delta.** :meth:`PublishSession.begin` decides what needs no measurement (nothing
served yet, after a failure, the count, the 63-delta limit). With
``CWTRAIN_HOTLOAD_FULL_EVERY=auto`` a delta plan is then weighed once its size is known and
before any byte of it is uploaded (:meth:`PublishSession.weigh`): at least 90 % of the last
FULL's bytes, or a chain that would make a cold replica replay more than two FULLs' bytes,
publishes the version FULL instead. No source encodes twice to decide: ``publish_tensors``
and ``publish_diff`` encode the delta in memory and upload it or build the FULL (from the
tensors, or the new checkpoint's directory); a delta directory is weighed by its files'
sizes (:meth:`PublishSession.weigh_directory`; slime's FULL then comes from its mirror); a
distributed publish weighs the sum of the ranks' shard bytes (:func:`~cwtrain.hotload.lifecycle.spmd.publish_spmd`).
The decision and its reason are logged and reach the metrics as ``hotload/cut_reason``
(:class:`~cwtrain.hotload.lifecycle.cadence.CutReason`'s code) and ``hotload/replay_bytes``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cwtrain.closing import Closing
from cwtrain.errors import CWTrainError, HotLoadFailedError, HotLoadVerificationError, SnapshotError, UsageError
from cwtrain.hotload.follow import ProgressEvent, wait_for_hot_load
from cwtrain.hotload.format.identity import identity_version, version_identity
from cwtrain.hotload.lifecycle import cycle
from cwtrain.hotload.lifecycle.cadence import ChainCadence, CutReason
from cwtrain.hotload.store.prefix_manifests import snapshot_manifest
from cwtrain.hotload.lifecycle.settings import HotLoadSettings
from cwtrain.infra.enums import HotLoadState, SnapshotType
from cwtrain.infra.models import HotLoad
from cwtrain.polling import Budget

if TYPE_CHECKING:
    from cwtrain.hotload.codec.encode import EncodedSnapshot
    from cwtrain.hotload.files.validate import SnapshotInfo
    from cwtrain.hotload.loader import HotLoader
    from cwtrain.hotload.lifecycle.shares import ShareResult
    from cwtrain.hotload.store.prefix import StoredSnapshot

__all__ = [
    "METRIC_PREFIX",
    "POLL_INTERVAL",
    "CheckResult",
    "PublishOutcome",
    "PublishSession",
    "ServedCheck",
    "VersionPlan",
    "build_loader",
]

log = logging.getLogger(__name__)

METRIC_PREFIX = "hotload/"
#: Seconds between hot-load polls of a session's loader (a hot-load takes seconds to minutes).
POLL_INTERVAL = 1.0


def build_loader(settings: HotLoadSettings) -> HotLoader:
    """A :class:`~cwtrain.hotload.loader.HotLoader` for ``settings`` (the token from the environment)."""
    from cwtrain.hotload.loader import HotLoader
    from cwtrain.infra.client import InferenceClient

    if not settings.deployment_id:
        raise CWTrainError("no deployment to publish to: set CWTRAIN_HOTLOAD_DEPLOYMENT_ID")
    client = InferenceClient(
        base_url=settings.api_base_url,
        headers=dict(settings.api_headers) or None,
        verify=not settings.api_insecure,
    )
    return HotLoader(client, settings.deployment_id, timeout=settings.timeout, poll_interval=POLL_INTERVAL)


class CheckResult(Protocol):
    """What a served-weights check answers (:class:`cwtrain.integrations.rollout.CanaryResult` is one)."""

    @property
    def passed(self) -> bool:
        """The deployment serves the trainer's weights, within the bound."""
        ...

    @property
    def gap(self) -> float:
        """The largest gap found (nats)."""
        ...

    def summary(self) -> str:
        """One line on what was found."""
        ...


class ServedCheck(Protocol):
    """A check of what the fleet serves after a hot-load (the canary)."""

    def check(self, *, identity: str | None = None) -> CheckResult:
        """Check the deployment; every answer should come from ``identity``."""
        ...


@dataclass(frozen=True)
class VersionPlan:
    """One version about to be published: what :meth:`PublishSession.begin` decided.

    Attributes:
        version: the version number.
        identity: ``<run>-v{version:06d}``.
        full: a FULL snapshot (chain cut) rather than a delta.
        previous_identity: the predecessor of a delta (what the replicas serve); ``None`` for FULL.
        budget: the one time budget of this version's whole cycle.
        measured: outcome fields a publisher measured before the session took over (its
            served copy's figures: ``mirror_seconds``, ``tensors_verified``, ...), set with
            :meth:`measure`.
        cut_reason: why the version is FULL (``NONE`` for a delta).
        cut_at_bytes: a delta plan under ``auto``: a delta of at least this many bytes (as
            stored) is published FULL instead (:meth:`PublishSession.weigh`); ``None``: no
            cost rule applies.
    """

    version: int
    identity: str
    full: bool
    previous_identity: str | None
    budget: Budget = field(compare=False)
    measured: dict[str, float] = field(default_factory=dict, compare=False)
    cut_reason: CutReason = field(default=CutReason.NONE, compare=False)
    cut_at_bytes: int | None = field(default=None, compare=False)

    @property
    def snapshot_type(self) -> SnapshotType:
        """FULL or INCREMENTAL."""
        return SnapshotType.FULL if self.full else SnapshotType.INCREMENTAL

    def measure(self, **figures: float) -> VersionPlan:
        """Record figures of this version that the outcome reports (names of :class:`PublishOutcome` fields).

        Raises:
            UsageError: a name that is not an outcome field.
        """
        unknown = sorted(set(figures) - _MEASURABLE)
        if unknown:
            raise UsageError(f"not PublishOutcome figures: {unknown}")
        self.measured.update(figures)
        return self

    def cut(self, reason: CutReason) -> VersionPlan:
        """This version as a FULL snapshot (chain cut) for ``reason``; the budget and measured figures carry over."""
        return replace(self, full=True, previous_identity=None, cut_reason=reason, cut_at_bytes=None)


@dataclass
class PublishOutcome:
    """What publishing one version did; every field has one meaning for every publisher.

    :meth:`metrics` turns it into the ``hotload/*`` metrics every integration logs.

    Attributes:
        version: the version.
        identity: its identity (``None`` when nothing was published).
        published: a snapshot was uploaded and hot-loaded (``False``: skipped, or failed).
        incremental: the snapshot was a delta.
        chain_cut: the snapshot was FULL (the baseline, a cadence cut, or after a failure).
        baseline_skipped: the baseline completed before with the same weights; not published again.
        skipped_empty: nothing changed since the served version; nothing published.
        failed: the publish raised (the outcome still reaches the sink).
        completed: the hot-load ended COMPLETED.
        tensors_changed: tensors whose bytes differ from the served version (all, for FULL).
        tensors_verified: tensors whose Adler-32 the publisher checked (the served copy's).
        bytes_changed: raw bytes of the changed tensors.
        snapshot_bytes: bytes of every object of the snapshot (shards, side files, index):
            what a cold replica reads.
        wire_bytes: bytes this publish sent to the object store (less than ``snapshot_bytes``
            when a retry found objects already stored).
        mirror_seconds: updating the trainer's copy of the served weights.
        stage_seconds: local work before the upload (checksums, encoding, gathering).
        upload_seconds: storing the snapshot (the index last).
        hot_load_seconds: from the hot-load request until every replica serves it.
        publish_seconds: the whole cycle (``stage`` + ``upload`` + ``hot_load`` and the rest).
        replicas_ready: replicas serving the identity at the end of the wait.
        replicas_total: replicas of the deployment.
        replicas_verified: replicas checked READY on the identity (``CWTRAIN_HOTLOAD_VERIFY``).
        reactivated: after a failed hot-load, every replica was brought back to the
            identity of ``served_version`` (the policy ``reactivate``).
        canary_checked: the canary ran after the hot-load.
        canary_gap: its largest gap (nats; 0 when it did not run).
        served_version: the version the replicas serve afterwards (-1: none of this run).
        chain_length: deltas since the chain's FULL snapshot, after this version.
        cut_reason: why the snapshot is FULL, as :class:`~cwtrain.hotload.lifecycle.cadence.CutReason`'s
            code (0 none: a delta or nothing; 1 first, 2 requested, 3 failed, 4 count,
            5 chain_limit, 6 share, 7 replay).
        replay_bytes: bytes a cold replica reads to serve the served version afterwards: the
            chain's FULL snapshot and every delta since.
        hot_load: the hot-load as last read (``None`` when none was created).
    """

    version: int
    identity: str | None = None
    published: bool = False
    incremental: bool = False
    chain_cut: bool = False
    baseline_skipped: bool = False
    skipped_empty: bool = False
    failed: bool = False
    completed: bool = False
    tensors_changed: int = 0
    tensors_verified: int = 0
    bytes_changed: int = 0
    snapshot_bytes: int = 0
    wire_bytes: int = 0
    mirror_seconds: float = 0.0
    stage_seconds: float = 0.0
    upload_seconds: float = 0.0
    hot_load_seconds: float = 0.0
    publish_seconds: float = 0.0
    replicas_ready: int = 0
    replicas_total: int = 0
    replicas_verified: int = 0
    reactivated: bool = False
    canary_checked: bool = False
    canary_gap: float = 0.0
    served_version: int = -1
    chain_length: int = 0
    cut_reason: int = 0
    replay_bytes: int = 0
    hot_load: HotLoad | None = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        """What the version published: ``"FULL"`` (a version planned as a delta may have been cut
        FULL once its size was known), ``"INCREMENTAL"``, or ``"SKIPPED"`` (nothing changed)."""
        if self.chain_cut:
            return "FULL"
        return "INCREMENTAL" if self.incremental else "SKIPPED"

    def metrics(self) -> dict[str, float]:
        """Every field but ``identity`` and ``hot_load`` as ``hotload/<field>``, as floats."""
        return {
            METRIC_PREFIX + item.name: float(getattr(self, item.name))
            for item in fields(self)
            if item.name not in _NOT_METRICS
        }


_NOT_METRICS = frozenset({"identity", "hot_load"})
#: What a publisher may measure itself (the rest is the session's).
_MEASURABLE = frozenset({"mirror_seconds", "stage_seconds", "tensors_changed", "tensors_verified", "bytes_changed"})


class PublishSession(Closing):
    """A run's publishing to one deployment, one version at a time (see the module docstring).

    Args:
        settings: the run's hot-load settings.
        loader: the :class:`~cwtrain.hotload.loader.HotLoader` to use (default: built from
            ``settings`` on first use).
        sink: called with every :class:`PublishOutcome` (the plug-in's logger), failures included.
        canary: checked after every hot-load (when waiting); a failed check fails the publish.
        followers: called with ``(run_id, version)`` whenever the fleet serves a version of
            this run (a rollout sampler's ``note_published``).

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
        loader: HotLoader | None = None,
        sink: Callable[[PublishOutcome], None] | None = None,
        canary: ServedCheck | None = None,
        followers: Sequence[Callable[[str, int], None]] = (),
    ) -> None:
        self.settings = settings
        self._loader = loader
        self.sink = sink
        self.canary = canary
        self.followers: list[Callable[[str, int], None]] = list(followers)
        self.cadence = ChainCadence(settings.full_every, settings.full_share, settings.replay_budget)
        self.served_identity: str | None = None
        self.last_version = -1
        self.last_attempted = -1

    # ------------------------------------------------------------------ plumbing

    @property
    def loader(self) -> HotLoader:
        """The hot-loader (built from the settings on first use)."""
        if self._loader is None:
            self._loader = build_loader(self.settings)
        return self._loader

    def close(self) -> None:
        """Close the loader's client when the session built it."""
        loader, self._loader = self._loader, None
        if loader is not None:
            loader.client.close()

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

        Call it once the delta's size is known (as it would be stored: shards and index) and
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

    def weigh_directory(self, plan: VersionPlan, directory: str | os.PathLike[str]) -> VersionPlan:
        """:meth:`weigh` a delta directory by what uploading it stores (its files and the uploaded index); nothing is encoded."""
        if plan.full or plan.cut_at_bytes is None:
            return plan
        from cwtrain.hotload.files.validate import inspect_snapshot

        info = inspect_snapshot(os.fspath(directory), previous_identity=plan.previous_identity, allow_empty_delta=True)
        if not info.incremental or info.empty_delta:
            return plan
        return self.weigh(plan, _directory_bytes(info, plan.identity))

    # ------------------------------------------------------------------ sources

    def publish_directory(
        self, plan: VersionPlan, directory: str | os.PathLike[str], *, checksums: Mapping[str, str] | None = None
    ) -> PublishOutcome:
        """Publish a snapshot directory as ``plan``'s version: a FULL checkpoint, or a delta on the served identity.

        Args:
            plan: from :meth:`begin`; a delta directory needs a delta plan.
            directory: the snapshot directory.
            checksums: the Adler-32 of every tensor of the full weights at this version
                (for the manifest; none is written without them).
        """
        with self._run(plan, checksums) as run:
            self._publish_directory(run, directory)
        return run.outcome

    def _publish_directory(self, run: _Run, directory: str | os.PathLike[str]) -> None:
        from cwtrain.hotload.files.validate import inspect_snapshot

        plan = run.plan
        started = time.perf_counter()
        info = inspect_snapshot(os.fspath(directory), previous_identity=plan.previous_identity)
        if (info.type == "INCREMENTAL") == plan.full:
            raise SnapshotError(
                f"{directory} is a {info.type} snapshot but version {plan.version} is planned {plan.snapshot_type.name}"
            )
        run.outcome.stage_seconds += time.perf_counter() - started
        started = time.perf_counter()
        stored = cycle.upload_directory(
            self._target, info, plan.identity, workers=self.settings.upload_workers, budget=plan.budget
        )
        run.stored(stored, time.perf_counter() - started)
        self._hot_load(run, info=info)

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

        An empty delta publishes nothing (the version is recorded as skipped). The encode
        overlaps the upload, so its time is part of ``upload_seconds``. Under ``auto`` a
        delta is encoded in memory and weighed (:meth:`weigh`) before any byte is uploaded;
        when it costs too much the version is published FULL from ``tensors`` instead (so
        pass ``extra_files`` with a delta plan too).

        Args:
            plan: from :meth:`begin`.
            tensors: the new weights (numpy arrays, torch tensors or ``TensorData``).
            base: the served weights, byte-exact (deltas only).
            extra_files: other files of a FULL snapshot (``config.json``, ...).
            checksums: the Adler-32 of every tensor at this version when already known (the
                manifest); default: the ones the encoder computed.
        """
        with self._run(plan, checksums) as run:
            started = time.perf_counter()
            stored = self._upload_tensors(run, tensors, base, extra_files)
            if stored.declined:
                run.outcome.stage_seconds += time.perf_counter() - started  # the delta's encode
                started = time.perf_counter()
                stored = self._upload_tensors(run, tensors, base, extra_files)
            if stored.empty:
                return run.skip_empty()
            run.stored(stored, time.perf_counter() - started)
            self._hot_load(run)
        return run.outcome

    def _upload_tensors(
        self,
        run: _Run,
        tensors: Mapping[str, Any],
        base: Mapping[str, Any] | None,
        extra_files: Mapping[str, bytes] | None,
    ) -> StoredSnapshot:
        """Upload ``run``'s version from tensors; a delta weighed under ``auto`` may come back declined (``run`` cut)."""
        plan = run.plan
        with cycle.upload_deadline(plan.identity, plan.budget):
            return self._target.store.upload_tensors(
                tensors,
                plan.identity,
                previous_identity=plan.previous_identity,
                base=None if plan.full else base,
                workers=self.settings.upload_workers,
                extra_files=extra_files if plan.full else None,
                allow_empty=True,
                accept=None if plan.full or plan.cut_at_bytes is None else run.accept,
                deadline=plan.budget,
            )

    def publish_diff(
        self, plan: VersionPlan, checkpoint: str | os.PathLike[str], base: str | os.PathLike[str]
    ) -> PublishOutcome:
        """Publish checkpoint ``checkpoint``: FULL from its directory, or as the delta from checkpoint ``base``.

        ``base`` holds the weights the replicas serve (byte-exact). An empty delta publishes
        nothing. Under ``auto`` the delta is encoded in memory and weighed (:meth:`weigh`);
        when it costs too much, ``checkpoint``'s directory is published FULL instead.
        """
        if plan.full:
            return self.publish_directory(plan, checkpoint)
        from cwtrain.hotload.files.checkpoint import check_checksum_room, open_checkpoint

        with self._run(plan, None) as run:
            started = time.perf_counter()
            with open_checkpoint(os.fspath(base)) as old, open_checkpoint(os.fspath(checkpoint)) as new:
                check_checksum_room(old, why="`snapshot apply` could never apply a delta against it")
                stored = self._upload_tensors(run, new.tensors, old.tensors, None)
            if stored.declined:
                run.outcome.stage_seconds += time.perf_counter() - started  # the delta's encode
                self._publish_directory(run, checkpoint)
                return run.outcome
            if stored.empty:
                return run.skip_empty()
            run.stored(stored, time.perf_counter() - started)
            self._hot_load(run)
        return run.outcome

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
        from cwtrain.hotload.lifecycle.shares import commit_shares

        checksums = {name: value for share in shares for name, value in share.checksums.items()}
        with self._run(plan, checksums) as run:
            problems = [share.error for share in shares if share.error]
            if problems:
                raise CWTrainError(f"publishing {plan.identity} failed: {problems[0]}")
            run.outcome.stage_seconds = max((share.stage_seconds for share in shares), default=0.0)
            started = time.perf_counter()
            stored = commit_shares(
                self._target.store, plan.identity, shares, full=plan.full,
                previous_identity=plan.previous_identity, extra_files=extra_files,
            )  # fmt: skip
            if stored.empty:
                return run.skip_empty()
            upload = max((share.upload_seconds for share in shares), default=0.0)
            run.stored(stored, upload + time.perf_counter() - started)
            self._hot_load(run)
        return run.outcome

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
        existing = self.loader.completed_hot_load(plan.identity)
        if self.settings.publish_baseline and (existing is None or not self._manifest_matches(plan.identity, sums)):
            return self.publish_directory(plan, checkpoint, checksums=sums)
        if existing is None:
            raise CWTrainError(
                f"CWTRAIN_HOTLOAD_PUBLISH_BASELINE is off but {plan.identity} was never hot-loaded on deployment "
                f"{self.settings.deployment_id}: publish it first or turn CWTRAIN_HOTLOAD_PUBLISH_BASELINE on"
            )
        log.info("baseline %s already completed with the same weights; not published again", plan.identity)
        with self._run(plan, None, manifest=False) as run:
            run.outcome.baseline_skipped = True
            run.full_bytes = self._stored_bytes(plan.identity)
            if self.loader.current_identity() != plan.identity:
                started = time.perf_counter()
                hot_load = cycle.rollback(self._target, plan.identity, wait=False, budget=plan.budget)
                self._follow(run, hot_load, started)
        return run.outcome

    def skip(self, plan: VersionPlan) -> PublishOutcome:
        """Record ``plan``'s version as an empty delta (nothing changed): nothing is published."""
        with self._run(plan, None) as run:
            run.skip_empty()
        return run.outcome

    # ------------------------------------------------------------------ the cycle

    @property
    def _target(self) -> cycle.Target:
        return self.loader.target

    def _run(self, plan: VersionPlan, checksums: Mapping[str, str] | None, *, manifest: bool = True) -> _Run:
        return _Run(self, plan, checksums, manifest)

    def _hot_load(self, run: _Run, *, info: Any = None) -> None:
        """READY → trigger → wait → verify, inside the plan's budget."""
        plan = run.plan
        started = time.perf_counter()
        hot_load = cycle.create_hot_load(
            self._target,
            plan.identity,
            info,
            previous_identity=None if info is not None else plan.previous_identity,
            snapshot_type=None if info is not None else plan.snapshot_type,
            prompt_cache_policy=self.settings.prompt_cache_policy,
            budget=plan.budget,
        )
        run.outcome.published = True
        self._follow(run, hot_load, started)

    def _follow(self, run: _Run, hot_load: HotLoad, started: float) -> None:
        plan, outcome = run.plan, run.outcome
        if self.settings.wait:
            events: list[ProgressEvent] = []
            hot_load = wait_for_hot_load(
                self.loader.client,
                hot_load.id,
                plan.budget,
                interval=self.loader.poll_interval,
                on_progress=events.append,
            )
            if events:
                outcome.replicas_ready = events[-1].ready
                outcome.replicas_total = events[-1].total
            if self.settings.verify:
                outcome.replicas_verified = len(cycle.verify_served(self._target, hot_load.id, plan.identity))
        outcome.hot_load = hot_load
        outcome.completed = hot_load.state is HotLoadState.COMPLETED
        outcome.hot_load_seconds = time.perf_counter() - started
        if self.canary is not None and outcome.completed:
            result = self.canary.check(identity=plan.identity)
            outcome.canary_checked, outcome.canary_gap = True, float(result.gap)
            if not result.passed:
                raise HotLoadVerificationError(hot_load, [], [f"canary: {result.summary()}"])

    def _ended(self, run: _Run, error: BaseException | None) -> bool:
        """The bookkeeping after a version's work: the cadence, the served identity, the manifest, the sink.

        Returns ``True`` when a failed hot-load was answered by re-activating what was served
        (the error is then not raised).
        """
        plan, outcome = run.plan, run.outcome
        self.last_attempted = max(self.last_attempted, plan.version)
        handled = False
        if error is not None:
            self.cadence.failed()  # the replicas keep (or get back) what they served: the next version is FULL
            outcome.failed = True
            handled = self._reactivate(run, error)
        else:
            self.last_version = max(self.last_version, plan.version)
            if not outcome.skipped_empty:
                self.cadence.published(full=plan.full, snapshot_bytes=run.cadence_bytes)
                self.record_served(plan.identity)
                if run.manifest and run.checksums is not None:
                    self.write_manifest(plan.identity, plan.version, run.checksums)
        outcome.publish_seconds = time.perf_counter() - run.started
        outcome.served_version = self.served_version if self.served_version is not None else -1
        outcome.chain_length = self.cadence.deltas_in_chain
        outcome.replay_bytes = self.cadence.replay_bytes
        if self.sink is not None:
            try:
                self.sink(outcome)
            except Exception:  # a logger must never fail a publish
                log.warning("the metrics sink failed on version %d", outcome.version, exc_info=True)
        if (error is None or handled) and outcome.served_version >= 0:
            for follower in self.followers:
                follower(self.run_id, outcome.served_version)
        return handled

    def _reactivate(self, run: _Run, error: BaseException) -> bool:
        """After a failed hot-load, the policy's answer: bring every replica back to one identity (or not)."""
        failed_hot_load = isinstance(error, HotLoadFailedError | HotLoadVerificationError) and run.outcome.published
        if self.settings.on_failure != "reactivate" or not failed_hot_load:
            return False
        log.warning("publishing %s failed (%s); re-activating what the fleet served", run.plan.identity, error)
        try:
            back = cycle.reactivate(self._target, run.plan.identity, budget=Budget(self.settings.timeout))
        except Exception as exc:
            raise CWTrainError(
                f"publishing {run.plan.identity} failed ({error}), and so did bringing the fleet back: {exc}"
            ) from exc
        self.served_identity = back.identity
        run.outcome.reactivated = True
        if self.settings.state_dir:
            self.record_served(back.identity)
        return True

    # ------------------------------------------------------------------ records

    def record_served(self, identity: str) -> None:
        """Remember that the replicas serve ``identity`` from now on.

        Also written to ``<state_dir>/served_identity`` (identity + newline, replaced
        atomically), where rollout functions and the prompt-cache salt read it; a failed
        write only warns.
        """
        from cwtrain.integrations.nvext import write_served_identity

        self.served_identity = identity
        if not self.settings.state_dir:
            return
        try:
            write_served_identity(self.settings.state_dir, identity)
        except OSError as exc:  # informational only
            log.warning("could not record the served identity in %s: %s", self.settings.state_dir, exc)

    def write_manifest(self, identity: str, version: int, checksums: Mapping[str, str]) -> None:
        """Write the manifest of ``identity`` (snapshot-format.md section 8.1); a failure only warns."""
        settings = self.settings
        manifest = snapshot_manifest(identity, settings.deployment_id, settings.run_id, checksums, f"{version:06d}")
        try:
            self.loader.upload_manifest(identity, manifest)
        except Exception as exc:  # manifests only help resumes: warn, never fail the step
            log.warning("could not write the manifest of %s: %s", identity, exc)

    def _stored_bytes(self, identity: str) -> int | None:
        """The stored size of a snapshot published before (the cadence's FULL size); ``None`` when unreadable."""
        try:
            return self._target.store.stored_bytes(identity)
        except Exception as exc:  # the cost rules wait for the next FULL
            log.warning(
                "could not list %s to learn its size (%s); the cost rules wait for the next FULL", identity, exc
            )
            return None

    def _manifest_matches(self, identity: str, checksums: Mapping[str, str]) -> bool:
        try:
            manifest = self.loader.read_manifest(identity)
        except Exception as exc:
            log.warning("could not read the manifest of %s (%s); publishing it again", identity, exc)
            return False
        return manifest is not None and dict(manifest.get("tensors") or {}) == dict(checksums)


class _Run:
    """One version's work in progress: its outcome, and what the manifest will hold."""

    def __init__(
        self, session: PublishSession, plan: VersionPlan, checksums: Mapping[str, str] | None, manifest: bool
    ) -> None:
        self.session = session
        self.plan = plan
        self.checksums = dict(checksums) if checksums is not None else None
        self.manifest = manifest
        self.started = time.perf_counter()
        #: The stored size of a FULL published before (a skipped baseline), for the cadence.
        self.full_bytes: int | None = None
        self.outcome = PublishOutcome(
            version=plan.version,
            identity=plan.identity,
            chain_cut=plan.full,
            incremental=not plan.full,
            cut_reason=int(plan.cut_reason),
        )
        for name, value in plan.measured.items():
            setattr(self.outcome, name, type(getattr(self.outcome, name))(value))

    @property
    def cadence_bytes(self) -> int:
        """The version's stored bytes, as the cadence counts them."""
        return self.full_bytes if self.full_bytes is not None else self.outcome.snapshot_bytes

    def accept(self, snap: EncodedSnapshot) -> bool:
        """``SnapshotStore.upload_tensors``' question: upload this delta, or cut (the plan becomes FULL)?"""
        plan = self.session.weigh(self.plan, snap.stored_bytes)
        if plan.full:
            self.cut(plan)
            if self.checksums is None:  # the delta's encode checksummed every new tensor: the manifest's
                self.checksums = dict(snap.checksums)
        return not plan.full

    def cut(self, plan: VersionPlan) -> None:
        """The version is published FULL after all (``plan``: its cut)."""
        self.plan = plan
        outcome = self.outcome
        outcome.chain_cut, outcome.incremental, outcome.cut_reason = True, False, int(plan.cut_reason)

    def stored(self, stored: StoredSnapshot, seconds: float) -> None:
        """Record what the upload stored."""
        outcome = self.outcome
        outcome.upload_seconds += seconds
        outcome.snapshot_bytes = stored.snapshot_bytes
        outcome.wire_bytes = stored.wire_bytes
        if stored.tensors_changed is not None and "tensors_changed" not in self.plan.measured:
            outcome.tensors_changed = stored.tensors_changed
            outcome.bytes_changed = stored.bytes_changed
        if self.checksums is None and stored.checksums is not None:
            self.checksums = dict(stored.checksums)

    def skip_empty(self) -> PublishOutcome:
        """Nothing changed: record the version as skipped, publish nothing."""
        outcome = self.outcome
        log.info(
            "%s is an empty delta: nothing to publish; replicas keep %s", outcome.identity, self.session.served_identity
        )
        outcome.identity = None
        outcome.skipped_empty = True
        outcome.chain_cut = outcome.incremental = False
        outcome.cut_reason = int(CutReason.NONE)
        return outcome

    def __enter__(self) -> _Run:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> bool:
        return self.session._ended(self, error)


def _directory_bytes(info: SnapshotInfo, identity: str) -> int:
    """What uploading a snapshot directory under ``identity`` stores: its files, the index in its uploaded form."""
    from cwtrain.hotload.files.validate import delta_index_for_upload
    from cwtrain.hotload.format.index import INDEX_NAME

    files = sum(path.stat().st_size for path in info.files if path.name != INDEX_NAME)
    return files + len(delta_index_for_upload(info, identity))
