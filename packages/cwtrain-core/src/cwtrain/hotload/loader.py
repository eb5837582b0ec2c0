"""``HotLoader``: publish weights to a deployment by checkpoint hot-load.

The task layer above :class:`~cwtrain.infra.client.InferenceClient` and the snapshot
modules (service-api.md section 8, snapshot-format.md)::

    from cwtrain import HotLoader, InferenceClient

    loader = HotLoader(InferenceClient(), deployment_id="3b1d2c54-...")
    loader.publish("ckpt/step-0", identity="run1-v000000")                  # FULL
    loader.publish("ckpt/step-1-delta", identity="run1-v000001",
                   previous_identity="run1-v000000")                        # INCREMENTAL
    loader.publish(model.state_dict(), identity="run1-v000002")             # FULL from memory
    loader.publish(new_weights, identity="run1-v000003",
                   previous_identity="run1-v000002", base=served_weights)   # delta from memory
    loader.publish_diff("ckpt/step-4", "ckpt/step-3", "run1-v000004",
                        previous_identity="run1-v000003")                  # delta of two checkpoints
    loader.rollback("run1-v000000")

A thin facade: each method checks what it is given (identities, a directory, misuse of
the arguments) where it enters, then makes one call on the composer of a version's cycle,
:class:`~cwtrain.hotload.lifecycle.cycle.VersionCycle` (the one every framework's run drives
too), with the CLI's policy: stop on a failed hot-load unless ``on_failure="reactivate"``, no
replica verification unless asked, no canary. ``publish`` is inspect (or encode) → upload →
create (readiness and single-flight handled) → wait, inside one time budget (``timeout``,
default 1800 s); nothing comes back into this module midway. In-memory tensors (a mapping of
name → numpy array, torch tensor or :class:`~cwtrain.hotload.format.tensors.TensorData`) are
encoded by :mod:`cwtrain.hotload.codec.encode` and streamed into the deployment's
:class:`~cwtrain.hotload.store.prefix.SnapshotStore` (``loader.store``) without touching disk.

Progress: ``on_progress`` (of ``publish``, ``upload`` and ``wait``) receives
:class:`~cwtrain.hotload.follow.ProgressEvent` objects, one type throughout: upload
events (bytes stored of the total, a few a second, the last with every byte), then one
per poll of the hot-load::

    from cwtrain.progress import ByteProgress

    loader.publish("ckpt/step-7", "run1-v000007", on_progress=ByteProgress("uploading"))
    loader.publish("ckpt/step-8", "run1-v000008", on_progress=lambda e: print(e.summary()))

Without ``on_progress``, ``publish`` and ``publish_diff`` show the upload as the CLI does
(a :class:`~cwtrain.progress.ByteProgress`: redrawn on stderr while it is a terminal, else one
INFO line at the end on ``cwtrain.progress`` with the bytes, rate and seconds). Every stage
logs one INFO line on a ``cwtrain.*`` logger (see the core README, "What a publish logs").

One hot-load at a time (single-flight): when the service says another is in progress,
``trigger`` adopts it if it is this request's earlier attempt (same ``hotLoadId``),
otherwise waits for it to end and re-sends with the same id, all inside the budget.
``wait`` returns once the aggregate state is COMPLETED and every replica serves the
identity; FAILED or CANCELED raise :class:`~cwtrain.errors.HotLoadFailedError`;
transient API errors and transport errors during the wait are logged and polling goes
on (:mod:`cwtrain.hotload.follow`).

Refused before anything is uploaded, so the identity stays free for a corrected retry: a
delta on ``initial`` (the deployment's base weights), on an identity that never completed on
the deployment, or on one whose snapshot is not in the bucket (the error names
``previous_identity`` and the newest identity that completed), and a delta whose resolved
chain would exceed the cold-start limit (63 deltas after the last FULL snapshot; publish a
FULL snapshot instead).
"""

from __future__ import annotations

import builtins
import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from cwtrain.errors import ConfigError, SnapshotError
from cwtrain.hotload.follow import HotLoadStatus, ProgressEvent, verify_served, wait_for_hot_load
from cwtrain.hotload.format import chain
from cwtrain.hotload.format.identity import validate_identity
from cwtrain.hotload.lifecycle import target as targets
from cwtrain.hotload.lifecycle.cycle import CyclePolicy, VersionCycle
from cwtrain.hotload.lifecycle.settings import HotLoadSettings
from cwtrain.hotload.lifecycle.sources import DiffSource, DirectorySource, StoredSource, TensorSource, VersionSource
from cwtrain.hotload.lifecycle.target import Target, require_hot_load
from cwtrain.hotload.lifecycle.version import Attempt, VersionPlan
from cwtrain.hotload.store.prefix import SnapshotStore
from cwtrain.infra import lifecycle
from cwtrain.infra.client import InferenceClient
from cwtrain.infra.enums import PromptCachePolicy, SnapshotType
from cwtrain.infra.models import Deployment, HotLoad, HotLoadReplica
from cwtrain.infra.objectstore import ObjectStore
from cwtrain.infra.s3 import ObjectStoreLike
from cwtrain.polling import Budget
from cwtrain.progress import ByteProgress

if TYPE_CHECKING:
    from cwtrain.hotload.files.validate import SnapshotInfo

__all__ = ["HotLoadStatus", "HotLoader", "ProgressEvent", "build_loader"]

log = logging.getLogger(__name__)


def build_loader(settings: HotLoadSettings) -> HotLoader:
    """A :class:`HotLoader` for a run's ``settings`` (a new API client; the token from the environment).

    Raises:
        CWTrainError: the settings name no deployment.
    """
    if not settings.deployment_id:
        raise ConfigError("no deployment to publish to: set CWTRAIN_HOTLOAD_DEPLOYMENT_ID")
    return HotLoader(
        settings.client(), settings.deployment_id, timeout=settings.timeout, poll_interval=targets.POLL_INTERVAL
    )


class HotLoader:
    """Publish snapshots to one hot-load-enabled deployment and follow their hot-loads.

    Args:
        client: the API client.
        deployment_id: the target deployment (must have ``spec.hotLoad``).
        s3: the object store, or a boto3 S3 client (wrapped); built with
            :func:`cwtrain.infra.s3.object_store` on first use.
        timeout: default seconds per call (publish: upload, readiness, single-flight, completion).
        poll_interval: the longest pause between polls of a hot-load (they adapt below it to how
            fast the service answers: :func:`cwtrain.polling.adaptive_pause`).
    """

    def __init__(
        self,
        client: InferenceClient,
        deployment_id: str,
        *,
        s3: ObjectStoreLike | None = None,
        timeout: float = 1800.0,
        poll_interval: float = 5.0,
    ) -> None:
        if not deployment_id:
            raise ConfigError("HotLoader needs a deployment id (CWTRAIN_HOTLOAD_DEPLOYMENT_ID)")
        self.client = client
        self.deployment_id = deployment_id
        self.timeout = float(timeout)
        self.poll_interval = float(poll_interval)
        self._target = Target(client, deployment_id, poll_interval=self.poll_interval, s3=s3)
        self._deployment: Deployment | None = None

    def __repr__(self) -> str:
        return f"HotLoader(deployment_id={self.deployment_id!r})"

    # ------------------------------------------------------------ deployment, s3

    @property
    def s3(self) -> ObjectStore:
        """The object store (a boto3 client passed in is wrapped; built from the environment on first use)."""
        return self._target.objects

    @s3.setter
    def s3(self, value: ObjectStoreLike | None) -> None:
        self._target = Target(self.client, self.deployment_id, poll_interval=self.poll_interval, s3=value)

    @property
    def deployment(self) -> Deployment:
        """The deployment (read once, cached); ``ConfigError`` (a ``CWTrainError``) when it has no ``hotLoad``."""
        if self._deployment is None:
            return self.refresh_deployment()
        return self._deployment

    def refresh_deployment(self) -> Deployment:
        """Re-read the deployment and check that hot-load is enabled on it."""
        deployment = self.client.get_deployment(self.deployment_id)
        require_hot_load(deployment)
        self._deployment = deployment
        return deployment

    @property
    def store(self) -> SnapshotStore:
        """Where this deployment's snapshots live (its ``hotLoad`` bucket and prefix, and :attr:`s3`; read once)."""
        return self._target.store

    @property
    def target(self) -> Target:
        """What the composer runs against: the client, the deployment and (built on first use) its store."""
        return self._target

    def _cycle(self, **policy: Any) -> VersionCycle:
        """The composer, with the CLI's policy and this call's options."""
        policy.setdefault("timeout", self.timeout)
        return VersionCycle(self.target, CyclePolicy(**policy))

    def _budget(self, timeout: float | None) -> Budget:
        return Budget(self.timeout if timeout is None else timeout)

    def snapshot_uri(self, identity: str) -> str:
        """``s3://<bucket>/<prefix>/<identity>/``."""
        return self.store.uri(identity)

    def wait_for_deployment_ready(self, timeout: float | None = None, poll_interval: float | None = None) -> Deployment:
        """Wait until the deployment is READY (hot-loads need it); refreshes the cache."""
        deployment = lifecycle.wait_for_deployment(
            self.client,
            self.deployment_id,
            timeout=self.timeout if timeout is None else timeout,
            poll_interval=self.poll_interval if poll_interval is None else poll_interval,
        )
        if deployment.hot_load is None:
            raise ConfigError(f"deployment {self.deployment_id} has no hotLoad block, so it cannot hot-load")
        self._deployment = deployment
        return deployment

    def check_snapshot_access(self) -> str:
        """The four-call permission check on the deployment's prefix; returns the URI."""
        return self.store.check_access()

    # ------------------------------------------------------------------ listings

    def list(self, limit: int | None = None) -> builtins.list[HotLoad]:
        """The deployment's hot-loads, newest first, fetching only the pages needed."""
        found: builtins.list[HotLoad] = []
        if limit is not None and limit <= 0:
            return found
        for hot_load in self.client.list_hot_loads(self.deployment_id):
            found.append(hot_load)
            if limit is not None and len(found) >= limit:
                break
        return found

    def status(self, hot_load_id: str) -> HotLoadStatus:
        """The hot-load and all its replicas."""
        return HotLoadStatus(self.client.get_hot_load(hot_load_id), self.client.list_hot_load_replicas(hot_load_id))

    def active_hot_load(self) -> HotLoad | None:
        """The newest unfinished hot-load of the deployment, if any."""
        return self.target.active()

    def latest_completed(self) -> HotLoad | None:
        """The newest COMPLETED hot-load of the deployment, if any."""
        return self.target.completed()

    def completed_hot_load(self, identity: str) -> HotLoad | None:
        """The newest COMPLETED hot-load of ``identity``, if any."""
        return self.target.completed(identity)

    def current_identity(self) -> str:
        """The identity of the newest COMPLETED hot-load, else ``"initial"``."""
        latest = self.target.completed()
        return latest.identity if latest is not None else "initial"

    def chain_deltas(self, previous_identity: str) -> int | None:
        """How many deltas a new delta on ``previous_identity`` would make the chain hold.

        ``None`` when the predecessor's chain cannot be resolved from the listing.
        """
        return self.target.chain_deltas(previous_identity)

    # --------------------------------------------------------------------- trigger

    def trigger(
        self,
        identity: str,
        info: SnapshotInfo | None = None,
        *,
        previous_identity: str | None = None,
        snapshot_type: SnapshotType | None = None,
        prompt_cache_policy: PromptCachePolicy | str | None = None,
        hot_load_id: str | None = None,
        wait_for_active: bool = True,
        timeout: float | None = None,
        verify: bool = False,
    ) -> HotLoad:
        """Create the hot-load of an uploaded snapshot, with single-flight handling.

        The type comes from ``info``, else ``snapshot_type``, else INCREMENTAL iff
        ``previous_identity``. Does not wait for completion. A deployment that refuses the
        hot-load because it is not READY is waited for (within ``timeout``) and asked again.
        With ``verify``, the stored objects of ``identity`` are first read back and checked
        against the SHA-256 each was uploaded with, and a FULL snapshot's tensors against
        their Adler-32s (:func:`cwtrain.hotload.store.snapshot_verify.verify_stored_snapshot`;
        skipped when no index is stored). ``cwtrain hotload trigger`` verifies unless
        ``--no-verify``.

        Raises:
            SnapshotError: misuse (``previous_identity`` with ``info`` or with FULL,
                INCREMENTAL without it, an invalid identity, a chain too long).
            SnapshotChecksumError: with ``verify``, a stored object is not what was uploaded.
            HotLoadInProgressError: another hot-load was still running when the budget ran out.
        """
        validate_identity(identity)
        kind, previous = chain.resolve_type(info, previous_identity, snapshot_type)
        _check_previous(previous if kind is SnapshotType.INCREMENTAL else None)
        plan = VersionPlan.of_identity(identity, previous if kind is SnapshotType.INCREMENTAL else None,
                                       self._budget(timeout))  # fmt: skip
        outcome = self._cycle(wait=False, prompt_cache_policy=prompt_cache_policy).publish(
            plan, StoredSource(verify=verify), hot_load_id=hot_load_id, wait_for_active=wait_for_active
        )
        assert outcome.hot_load is not None
        return outcome.hot_load

    # ------------------------------------------------------------------------ wait

    def wait(
        self,
        hot_load_id: str,
        *,
        timeout: float | None = None,
        poll_interval: float | None = None,
        raise_on_failure: bool = True,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        on_failure: str = "stop",
    ) -> HotLoad:
        """Poll until the hot-load ends and every replica serves its identity.

        Returns once the state is COMPLETED and every replica is READY on the identity.
        The aggregate state decides: replicas still lagging 30 s (or ten polls) after
        COMPLETED, or when the budget is spent, are logged as a warning and the hot-load
        is returned (:meth:`verify_served` is the strict check). ``on_progress`` gets a
        hot-load :class:`ProgressEvent` on every poll.

        With ``on_failure="reactivate"``, a hot-load that ends FAILED or CANCELED is followed
        by :meth:`reactivate` before its error is raised.

        Raises:
            HotLoadFailedError: FAILED or CANCELED (unless ``raise_on_failure=False``).
            HotLoadTimeoutError: the budget ran out before the hot-load ended.
        """
        interval = self.poll_interval if poll_interval is None else poll_interval
        if not raise_on_failure:  # the documented plain wait: the hot-load however it ended
            return wait_for_hot_load(
                self.client, hot_load_id, self._budget(timeout), interval=interval, raise_on_failure=False,
                on_progress=on_progress,
            )  # fmt: skip
        cycle = VersionCycle(self._target.polling(interval), CyclePolicy(on_failure=on_failure, timeout=self.timeout))
        return cycle.follow(hot_load_id, self._budget(timeout), on_progress=on_progress)

    def verify_served(self, hot_load_id: str, identity: str) -> builtins.list[HotLoadReplica]:
        """Every replica READY on ``identity``, else :class:`HotLoadVerificationError`."""
        return verify_served(self.client, hot_load_id, identity)

    # ----------------------------------------------------------------- rollback

    def rollback(
        self,
        identity: str,
        *,
        prompt_cache_policy: PromptCachePolicy | str | None = None,
        hot_load_id: str | None = None,
        wait: bool = True,
        timeout: float | None = None,
    ) -> HotLoad:
        """Re-activate ``identity``: a new hot-load copying its newest COMPLETED one.

        The new hot-load has that one's type and delta metadata, and its prompt cache
        policy unless ``prompt_cache_policy`` is given. The index objects of every
        identity of its chain must still be in the bucket. Waits like :meth:`publish`
        unless ``wait=False``.

        Raises:
            UsageError: (a ``CWTrainError``) no COMPLETED hot-load of ``identity`` on this deployment.
            SnapshotError: its objects (or its chain's) are gone from the bucket.
        """
        validate_identity(identity)
        return self._cycle(wait=wait).restore(
            identity, budget=self._budget(timeout), prompt_cache_policy=prompt_cache_policy, hot_load_id=hot_load_id
        )

    def reactivate(self, failed_identity: str, *, timeout: float | None = None) -> HotLoad:
        """Bring every replica back to the newest intact identity that completed, other than ``failed_identity``.

        Raises:
            CWTrainError: nothing to go back to, or the re-activation failed.
        """
        return self._cycle().reactivate(failed_identity, budget=self._budget(timeout))

    # ------------------------------------------------------------------ publish

    def upload(
        self,
        checkpoint: str | os.PathLike[str] | SnapshotInfo,
        identity: str,
        *,
        previous_identity: str | None = None,
        workers: int = 8,
        on_progress: Callable[[ProgressEvent], None] | None = None,
    ) -> SnapshotInfo:
        """Inspect a snapshot directory and upload it under ``identity`` (no hot-load).

        A delta is checked before anything is written: its predecessor completed on the
        deployment and is in the bucket, and the chain stays within the limit.

        Args:
            checkpoint: the snapshot directory, or its ``SnapshotInfo`` from ``inspect_snapshot``.
            identity: the snapshot identity.
            previous_identity: the predecessor of a delta (default: from its index).
            workers: files uploaded in parallel.
            on_progress: called with upload :class:`ProgressEvent` s (bytes stored of the
                snapshot's total) a few times a second, and once when every byte is stored
                (a :class:`cwtrain.progress.ByteProgress` renders them).
        """
        validate_identity(identity)
        info = _inspected(checkpoint, previous_identity)
        plan = VersionPlan.of_identity(identity, info.previous_identity if info.incremental else None,
                                       self._budget(None))  # fmt: skip
        if info.incremental and info.previous_identity:
            self.target.check_delta(identity, info.previous_identity)
        DirectorySource(info).store(Attempt(plan, on_progress=on_progress), self.target, workers)
        return info

    def publish(
        self,
        checkpoint: str | os.PathLike[str] | SnapshotInfo | Mapping[str, Any],
        identity: str,
        *,
        previous_identity: str | None = None,
        prompt_cache_policy: PromptCachePolicy | str | None = None,
        wait: bool = True,
        timeout: float | None = None,
        workers: int = 8,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        base: Mapping[str, Any] | None = None,
        hot_load_id: str | None = None,
        extra_files: Mapping[str, bytes] | None = None,
        on_failure: str = "stop",
    ) -> HotLoad:
        """Upload a snapshot, create its hot-load and (by default) wait for it.

        Args:
            checkpoint: a snapshot directory (FULL checkpoint or delta), its
                ``SnapshotInfo``, or in-memory tensors (name → numpy array / torch tensor /
                :class:`~cwtrain.hotload.format.tensors.TensorData`; numpy has no bfloat16, so BF16
                bytes go over as ``TensorData("BF16", shape, raw_bytes)``). TensorSource are
                checked first (:func:`~cwtrain.hotload.store.snapshot_checks.check_published_tensors`): a
                delta must keep the served dtypes, a FULL snapshot needs ``config.json`` in
                ``extra_files``, and tensors in another dtype than its ``torch_dtype`` give a
                :class:`~cwtrain.hotload.format.dtypes.DtypeWarning`.
            identity: the new snapshot identity.
            previous_identity: the predecessor (a delta directory's default comes from
                its index; for tensors it makes the snapshot a delta against ``base``).
            prompt_cache_policy: ``RESET_ALL`` / ``PRESERVE``; unset omits the field.
            wait: wait until every replica serves ``identity``.
            timeout: one budget for upload, readiness, single-flight and completion.
            workers: files uploaded in parallel.
            on_progress: called with :class:`ProgressEvent` s: while a directory uploads
                (``stage="upload"``, see :meth:`upload`), then on every poll of the wait
                (``stage="hot_load"``). In-memory tensors report the wait only.
            base: for tensors: the weights replicas serve now (byte-exact); with
                ``previous_identity`` the delta is computed against them, without it the
                FULL snapshot is checked against them (names, dtypes, shapes).
            hot_load_id: the hot-load's permanent id (default a new UUID4).
            extra_files: for tensors: other files of the snapshot, name → bytes, uploaded
                beside the shards; a FULL snapshot needs ``config.json`` (the served model's).
            on_failure: ``stop`` raises when the hot-load ends FAILED or CANCELED;
                ``reactivate`` first brings every replica back to the newest intact identity
                that completed (:meth:`VersionCycle.reactivate <cwtrain.hotload.lifecycle.cycle.VersionCycle.reactivate>`),
                then raises.
        """
        validate_identity(identity)
        source: VersionSource
        if isinstance(checkpoint, Mapping):
            previous = previous_identity or None
            _check_previous(previous)
            source = TensorSource(checkpoint, base=base, files=extra_files)
        else:
            info = _inspected(checkpoint, previous_identity)
            previous = info.previous_identity if info.incremental else None
            source = DirectorySource(info)
        plan = VersionPlan.of_identity(identity, previous, self._budget(timeout))
        return self._publish(plan, source, wait=wait, workers=workers, prompt_cache_policy=prompt_cache_policy,
                             on_failure=on_failure, on_progress=on_progress, hot_load_id=hot_load_id)  # fmt: skip

    def publish_diff(
        self,
        checkpoint: str | os.PathLike[str],
        base: str | os.PathLike[str],
        identity: str,
        *,
        previous_identity: str,
        keep: str | os.PathLike[str] | None = None,
        prompt_cache_policy: PromptCachePolicy | str | None = None,
        wait: bool = True,
        timeout: float | None = None,
        workers: int = 8,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        hot_load_id: str | None = None,
        on_failure: str = "stop",
    ) -> HotLoad:
        """Publish the XOR delta from checkpoint ``base`` to checkpoint ``checkpoint`` in one pass.

        The snapshot is byte for byte what ``write_delta(base, checkpoint, DIR,
        version=identity, base_version=previous_identity)`` followed by
        ``publish(DIR, identity, previous_identity=previous_identity)`` stores, but no
        delta directory is written: both checkpoints are read in chunks (never
        memory-mapped), and the compressed frames stay in memory until the last tensor is
        encoded (a shard's header and name need every frame), then go to the object store.
        With ``keep``, the delta directory is written there first and uploaded from it.

        Args:
            checkpoint: the new checkpoint directory.
            base: the checkpoint replicas serve now (``previous_identity``'s weights, byte-exact).
            identity: the new snapshot identity.
            previous_identity: the identity the delta applies to.
            keep: also keep the delta directory here (must not exist or be empty).
            prompt_cache_policy, wait, timeout, workers, on_progress, hot_load_id: as for
                :meth:`publish` (upload events only with ``keep``).

        Raises:
            SnapshotError: a missing or invalid checkpoint, different tensor sets, dtypes or
                shapes (publish FULL instead), or nothing changed (an empty delta is never
                published).
        """
        validate_identity(identity)
        _check_previous(previous_identity)
        plan = VersionPlan.of_identity(identity, previous_identity, self._budget(timeout))
        return self._publish(plan, DiffSource(checkpoint, base, keep=keep), wait=wait, workers=workers,
                             prompt_cache_policy=prompt_cache_policy, on_failure=on_failure, on_progress=on_progress,
                             hot_load_id=hot_load_id)  # fmt: skip

    def _publish(
        self,
        plan: VersionPlan,
        source: VersionSource,
        *,
        on_progress: Callable[[ProgressEvent], None] | None,
        hot_load_id: str | None,
        **policy: Any,
    ) -> HotLoad:
        """One version through the composer; a failed hot-load the fleet was brought back from is raised too."""
        policy["upload_workers"] = policy.pop("workers")
        if on_progress is None:  # as the CLI shows it: redrawn on a terminal, else one INFO line at the end
            on_progress = ByteProgress(f"uploading {plan.identity}")
        outcome = self._cycle(**policy).publish(plan, source, on_progress=on_progress, hot_load_id=hot_load_id)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.hot_load is not None
        return outcome.hot_load

    # ---------------------------------------------------------------- manifests

    def manifest_key(self, identity: str) -> str:
        """``P/_manifests/<identity>.json`` (snapshot-format.md section 8.1)."""
        return self.store.manifest_key(identity)

    def upload_manifest(self, identity: str, manifest_json: Mapping[str, Any]) -> str:
        """Write the manifest create-only (identical content already there is success); returns its URI.

        Raises:
            SnapshotConflictError: another manifest is stored under this identity.
        """
        return self.store.write_manifest(identity, manifest_json)

    def read_manifest(self, identity: str) -> dict[str, Any] | None:
        """The manifest of ``identity``, or ``None`` when absent."""
        return self.store.read_manifest(identity)


def _check_previous(previous_identity: str | None) -> None:
    """A predecessor given by the caller is a valid identity (``initial`` too)."""
    if previous_identity:
        validate_identity(previous_identity, what="previous identity", allow_reserved=previous_identity == "initial")


def _inspected(checkpoint: str | os.PathLike[str] | SnapshotInfo, previous_identity: str | None) -> SnapshotInfo:
    """The directory inspected where it enters (or the ``SnapshotInfo`` given, without a second predecessor)."""
    from cwtrain.hotload.files.validate import SnapshotInfo, inspect_snapshot

    if isinstance(checkpoint, SnapshotInfo):
        if previous_identity is not None:
            raise SnapshotError("pass previous_identity to inspect_snapshot, not together with its SnapshotInfo")
        return checkpoint
    _check_previous(previous_identity)
    return inspect_snapshot(os.fspath(checkpoint), previous_identity=previous_identity)
