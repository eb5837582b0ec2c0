"""One version: its plan, the attempt to publish it, and what the attempt did.

* :class:`VersionPlan`: what is about to be published (the version, its identity, FULL or a
  delta on what is served, the one time budget, why it is FULL). A run's plans come from
  :meth:`PublishSession.begin <cwtrain.hotload.lifecycle.session.PublishSession.begin>`; a
  one-version use (:class:`~cwtrain.hotload.loader.HotLoader`) makes one with
  :meth:`VersionPlan.of_identity`.
* :class:`Attempt`: the work in progress of one plan, passed down the cycle's stages: the
  plan as it stands (the cost rule may cut a delta to FULL once its size is known), the
  outcome being filled in, the checksums for the manifest.
* :class:`PublishOutcome`: what publishing one version did, the one metrics schema every
  publisher reports (:meth:`PublishOutcome.metrics`: ``hotload/*``).
* :class:`ServedCheck` and :class:`CheckResult`: the canary's seam (a check of what the fleet
  serves after a hot-load; :class:`cwtrain.integrations.rollout.Canary` is one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Protocol

from cwtrain.errors import UsageError
from cwtrain.hotload.format.identity import split_version_identity
from cwtrain.hotload.lifecycle.cadence import CutReason
from cwtrain.infra.enums import PromptCachePolicy, SnapshotType
from cwtrain.infra.models import HotLoad
from cwtrain.polling import Budget

if TYPE_CHECKING:
    from cwtrain.hotload.codec.encode import EncodedSnapshot
    from cwtrain.hotload.follow import ProgressEvent
    from cwtrain.hotload.store.prefix import StoredSnapshot

__all__ = [
    "METRIC_PREFIX",
    "Attempt",
    "CheckResult",
    "DeltaCheck",
    "PublishOutcome",
    "ServedCheck",
    "VersionPlan",
    "Weigh",
]

log = logging.getLogger(__name__)

METRIC_PREFIX = "hotload/"


@dataclass(frozen=True)
class VersionPlan:
    """One version about to be published.

    Attributes:
        version: the version number (-1 for an identity that names none).
        identity: ``<run>-v{version:06d}`` (or the identity a one-version use was given).
        full: a FULL snapshot (chain cut) rather than a delta.
        previous_identity: the predecessor of a delta (what the replicas serve); ``None`` for FULL.
        budget: the one time budget of this version's whole cycle.
        measured: outcome fields a publisher measured before the cycle took over (its
            served copy's figures: ``mirror_seconds``, ``tensors_verified``, ...), set with
            :meth:`measure`.
        cut_reason: why the version is FULL (``NONE`` for a delta).
        cut_at_bytes: a delta plan under ``auto``: a delta of at least this many bytes (as
            stored) is published FULL instead; ``None``: no cost rule applies.
        run_id: the run whose version this is (its manifest names it); ``None`` for a
            one-version use, which writes no manifest.
    """

    version: int
    identity: str
    full: bool
    previous_identity: str | None
    budget: Budget = field(compare=False)
    measured: dict[str, float] = field(default_factory=dict, compare=False)
    cut_reason: CutReason = field(default=CutReason.NONE, compare=False)
    cut_at_bytes: int | None = field(default=None, compare=False)
    run_id: str | None = field(default=None, compare=False)

    @classmethod
    def of_identity(cls, identity: str, previous_identity: str | None, budget: Budget) -> VersionPlan:
        """The plan of a one-version use: FULL without a predecessor, else a delta on it."""
        parts = split_version_identity(identity)
        version = parts[1] if parts is not None else -1
        return cls(version, identity, previous_identity is None, previous_identity, budget)

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

    def restoring(self, hot_load: HotLoad) -> VersionPlan:
        """This version as a copy of ``hot_load``: its type and predecessor (a rollback, a re-activation)."""
        full = hot_load.type is not SnapshotType.INCREMENTAL
        return replace(self, full=full, previous_identity=None if full else hot_load.previous_identity)


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
        trainer_wait_seconds: how long the training loop was blocked by this version: the whole
            publish when it waits for it (synchronous), or, one step ahead
            (:class:`~cwtrain.hotload.lifecycle.ahead.PublishAhead`), how long the next hand-over
            waited for this version to end.
        replicas_ready: replicas serving the identity at the end of the wait.
        replicas_total: replicas of the deployment.
        replicas_verified: replicas checked READY on the identity (``CWTRAIN_HOTLOAD_VERIFY``).
        converged: whether every replica the service lists served the identity when its
            hot-load completed, checked whatever the settings: 1 yes, 0 no (the fleet was
            split: the version failed), -1 not checked (no hot-load completed, or the cycle
            did not wait for it: ``wait`` off, which it logs).
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
        served_identity: what the replicas serve afterwards (or will, once a hot-load that
            was not waited for completes); ``None`` when the cycle cannot tell (it failed
            and nothing brought the fleet back).
        error: what failed, for an outcome returned after a failure (the fleet was brought
            back: ``reactivated``).
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
    trainer_wait_seconds: float = 0.0
    replicas_ready: int = 0
    replicas_total: int = 0
    replicas_verified: int = 0
    converged: int = -1
    reactivated: bool = False
    canary_checked: bool = False
    canary_gap: float = 0.0
    served_version: int = -1
    chain_length: int = 0
    cut_reason: int = 0
    replay_bytes: int = 0
    hot_load: HotLoad | None = field(default=None, repr=False)
    served_identity: str | None = field(default=None, repr=False)
    error: BaseException | None = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        """What the version published: ``"FULL"`` (a version planned as a delta may have been cut
        FULL once its size was known), ``"INCREMENTAL"``, or ``"SKIPPED"`` (nothing changed)."""
        if self.chain_cut:
            return "FULL"
        return "INCREMENTAL" if self.incremental else "SKIPPED"

    def metrics(self) -> dict[str, float]:
        """Every figure (not ``identity``, ``hot_load``, ``served_identity``, ``error``) as ``hotload/<field>``, as floats."""
        return {
            METRIC_PREFIX + item.name: float(getattr(self, item.name))
            for item in fields(self)
            if item.name not in _NOT_METRICS
        }


_NOT_METRICS = frozenset({"identity", "hot_load", "served_identity", "error"})
#: What a publisher may measure itself (the rest is the cycle's).
_MEASURABLE = frozenset({"mirror_seconds", "stage_seconds", "tensors_changed", "tensors_verified", "bytes_changed"})


class DeltaCheck(Protocol):
    """The cycle's check of a delta before its first byte is stored (``Target.check_delta``)."""

    def __call__(self, identity: str, previous_identity: str, *, bucket: bool = True) -> None:
        """Refuse a delta ``identity`` on ``previous_identity`` the service would refuse (``bucket``: look there too)."""
        ...


Weigh = Callable[[VersionPlan, int], VersionPlan]
"""The cost rule: a delta plan and its size as stored → the plan, or its FULL cut (``PublishSession.weigh``)."""


class Attempt:
    """One plan's work in progress, handed down the cycle's stages.

    Args:
        plan: the version's plan.
        checksums: the Adler-32 of every tensor of the full weights at this version, when
            the caller knows them (the manifest; default: what the encoder computes).
        weigh: the cost rule, asked once a delta's size is known (``None``: no cost rule).
        manifest: write the version's manifest (when its plan names a run and checksums are known).
        skip_empty: an empty delta is recorded as skipped; ``False`` refuses it.
        on_progress: where upload and hot-load :class:`~cwtrain.hotload.follow.ProgressEvent` s go.

    Attributes:
        plan: the plan as it stands (a cut replaces it).
        outcome: the outcome being filled in.
        full_bytes: the stored size of a FULL published before (a kept baseline), for the cadence.
        prompt_cache_policy: sent with the hot-load instead of the cycle's (a restore keeps
            its original's).
        restoring: the version is an identity served before, hot-loaded again (nothing new
            is published).
    """

    def __init__(
        self,
        plan: VersionPlan,
        *,
        checksums: Mapping[str, str] | None = None,
        weigh: Weigh | None = None,
        manifest: bool = True,
        skip_empty: bool = False,
        on_progress: Callable[[ProgressEvent], None] | None = None,
    ) -> None:
        self.plan = plan
        self.checksums = dict(checksums) if checksums is not None else None
        self.weigh = weigh if not plan.full and plan.cut_at_bytes is not None else None
        self.manifest = manifest
        self.skip_empty = skip_empty
        self.on_progress = on_progress
        self.started = time.perf_counter()
        self.full_bytes: int | None = None
        self.prompt_cache_policy: PromptCachePolicy | str | None = None
        self.restoring = False
        #: What a delta must pass before its first byte is stored (the cycle's delta check,
        #: :meth:`Target.check_delta <cwtrain.hotload.lifecycle.target.Target.check_delta>`), run once.
        self.chain_check: DeltaCheck | None = None
        self.outcome = PublishOutcome(
            version=plan.version,
            identity=plan.identity,
            chain_cut=plan.full,
            incremental=not plan.full,
            cut_reason=int(plan.cut_reason),
        )
        for name, value in plan.measured.items():
            setattr(self.outcome, name, type(getattr(self.outcome, name))(value))

    def before_upload(self, *, uploads: bool = True) -> None:
        """A source is about to store its first byte: a delta plan passes the cycle's delta check now (once).

        Sources call it once their local checks passed, so a refusal they can make without the
        network comes first. ``uploads=False``: the source stores nothing (a trigger of objects
        stored before, a restore), so the predecessor's objects are not looked for in the bucket.
        """
        check, self.chain_check = self.chain_check, None
        plan = self.plan
        if check is not None and not plan.full and plan.previous_identity:
            check(plan.identity, plan.previous_identity, bucket=uploads)

    @property
    def cadence_bytes(self) -> int:
        """The version's stored bytes, as the cadence counts them."""
        return self.full_bytes if self.full_bytes is not None else self.outcome.snapshot_bytes

    def keeps_delta(self, delta_bytes: int) -> bool:
        """The cost rule on a delta of ``delta_bytes`` (as stored): ``True`` keeps it, ``False`` cut the plan FULL."""
        if self.weigh is None:
            return True
        plan = self.weigh(self.plan, delta_bytes)
        if plan.full:
            self.cut(plan)
        return not plan.full

    def accept(self, snap: EncodedSnapshot) -> bool:
        """``SnapshotStore.upload_tensors``' question: upload this delta, or cut (the plan becomes FULL)?"""
        keep = self.keeps_delta(snap.stored_bytes)
        if not keep and self.checksums is None:  # the delta's encode checksummed every new tensor: the manifest's
            self.checksums = dict(snap.checksums)
        return keep

    def cut(self, plan: VersionPlan) -> None:
        """The version is published FULL after all (``plan``: its cut)."""
        self.plan = plan
        self.weigh = None
        outcome = self.outcome
        outcome.chain_cut, outcome.incremental, outcome.cut_reason = True, False, int(plan.cut_reason)

    def restore(self, prior: HotLoad, prompt_cache_policy: PromptCachePolicy | str | None = None) -> None:
        """The version is ``prior``'s identity hot-loaded again: its type, predecessor and (unless given) cache policy."""
        self.plan = self.plan.restoring(prior)
        self.prompt_cache_policy = prompt_cache_policy if prompt_cache_policy is not None else prior.prompt_cache_policy
        self.restoring = True

    def stage(self, started: float) -> None:
        """Count the time since ``started`` (``time.perf_counter()``) as local work before the upload."""
        self.outcome.stage_seconds += time.perf_counter() - started

    def stored(self, stored: StoredSnapshot, seconds: float) -> None:
        """Record what the upload stored, in ``seconds``."""
        outcome = self.outcome
        outcome.upload_seconds += seconds
        outcome.snapshot_bytes = stored.snapshot_bytes
        outcome.wire_bytes = stored.wire_bytes
        if stored.tensors_changed is not None and "tensors_changed" not in self.plan.measured:
            outcome.tensors_changed = stored.tensors_changed
            outcome.bytes_changed = stored.bytes_changed
        if self.checksums is None and stored.checksums is not None:
            self.checksums = dict(stored.checksums)

    def skip_empty_delta(self) -> None:
        """Nothing changed: record the version as skipped, publish nothing."""
        outcome = self.outcome
        log.info("%s is an empty delta: nothing to publish; replicas keep %s", outcome.identity,
                 self.plan.previous_identity)  # fmt: skip
        outcome.identity = None
        outcome.skipped_empty = True
        outcome.chain_cut = outcome.incremental = False
        outcome.cut_reason = int(CutReason.NONE)


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

    def check(self, *, identity: str | None = None, timeout: float | None = None) -> CheckResult:
        """Check the deployment; every answer should come from ``identity``; done within ``timeout`` seconds or raise."""
        ...
