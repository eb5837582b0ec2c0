"""What a version is published from: the store stage of the cycle, one class per kind of source.

The composer (:class:`~cwtrain.hotload.lifecycle.cycle.VersionCycle`) asks a source to store
its version (``source.store(attempt, target, workers)``) and hot-loads what it stored. A
source records what it did on the :class:`~cwtrain.hotload.lifecycle.version.Attempt`
(local work, upload time and bytes) and, for a delta under the cost rule of
``CWTRAIN_HOTLOAD_FULL_EVERY=auto``, asks the attempt whether the delta stays a delta once
its size is known (:meth:`Attempt.keeps_delta`); a delta cut FULL is stored from the
source's ``full`` (or from itself, when it can), so nothing is encoded twice::

    DirectorySource(info)                              # a checkpoint or delta directory, inspected once
    DirectorySource(path, full=TensorSource(mirror))   # slime: a cut is published from the served copy
    TensorSource(new, base=served, full_files=side)    # in-memory tensors: FULL, or a delta on base
    DiffSource(new_dir, base_dir)                      # the delta of two checkpoints (a cut: new_dir FULL)
    ShareSource(results, files=side)                   # every rank stored its shard: the index
    StoredSource(verify=True)                          # uploaded before: checked, then hot-loaded
    RestoreSource(identity, prior=hot_load)            # a copy of a hot-load that completed before
    UnchangedSource()                                  # a delta in which nothing changed: nothing at all

``store`` returns what was stored (a :class:`~cwtrain.hotload.store.prefix.StoredSnapshot`;
``empty`` for a delta in which nothing changed), or ``None`` when there is nothing to
hot-load because the fleet serves the version already (a kept baseline).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from cwtrain.errors import CWTrainError, SnapshotError, UsageError
from cwtrain.hotload.follow import UploadProgress
from cwtrain.hotload.lifecycle.shares import ShareResult, commit_shares
from cwtrain.hotload.lifecycle.target import Target, upload_deadline
from cwtrain.hotload.lifecycle.version import Attempt
from cwtrain.hotload.store.prefix import StoredSnapshot
from cwtrain.infra.enums import PromptCachePolicy
from cwtrain.infra.models import HotLoad

if TYPE_CHECKING:
    from cwtrain.hotload.files.validate import SnapshotInfo

__all__ = [
    "DiffSource",
    "DirectorySource",
    "RestoreSource",
    "ShareSource",
    "StoredSource",
    "TensorSource",
    "UnchangedSource",
    "VersionSource",
]

log = logging.getLogger(__name__)


class VersionSource(Protocol):
    """Stores one version's snapshot (the cycle's store stage)."""

    def store(self, attempt: Attempt, target: Target, workers: int) -> StoredSnapshot | None:
        """Store ``attempt``'s version under its identity; ``None``: nothing to hot-load (it is served already)."""
        ...


@dataclass
class DirectorySource:
    """A snapshot directory: a FULL checkpoint, or a delta (slime's and miles' ``weight_vNNNNNN``).

    Args:
        snapshot: the directory as inspected where it entered (once), or its path: inspected
            when stored, with the plan's predecessor, and refused when its type is not the
            plan's (the inspection counts as local work).
        full: what a delta cut FULL by the cost rule is published from (slime: the served
            copy); without it the directory is published as it is.
    """

    snapshot: SnapshotInfo | str | os.PathLike[str]
    _: KW_ONLY
    full: VersionSource | None = None

    def info(self, attempt: Attempt) -> SnapshotInfo:
        """The inspected directory.

        Raises:
            SnapshotError: an invalid directory, or one whose type is not the plan's.
        """
        from cwtrain.hotload.files.validate import SnapshotInfo, inspect_snapshot

        if isinstance(self.snapshot, SnapshotInfo):
            return self.snapshot
        plan, started = attempt.plan, time.perf_counter()
        info = inspect_snapshot(os.fspath(self.snapshot), previous_identity=plan.previous_identity)
        if info.incremental == plan.full:
            raise SnapshotError(
                f"{info.path} is a {info.type} snapshot but version {plan.version} is planned {plan.snapshot_type.name}"
            )
        attempt.stage(started)
        self.snapshot = info
        return info

    def store(self, attempt: Attempt, target: Target, workers: int) -> StoredSnapshot | None:
        """Upload the directory (its files, the index last, in its uploaded form)."""
        info = self.info(attempt)
        plan = attempt.plan
        if self.full is not None and info.incremental and not attempt.keeps_delta(info.stored_bytes(plan.identity)):
            return self.full.store(attempt, target, workers)
        attempt.before_upload()
        events = UploadProgress(plan.identity, info.total_bytes, attempt.on_progress) if attempt.on_progress else None
        started = time.perf_counter()
        with upload_deadline(plan.identity, plan.budget):
            stored = target.store.upload(info, plan.identity, workers=workers, on_progress=events, deadline=plan.budget)
        if events is not None:
            events.finish()
        attempt.stored(stored, time.perf_counter() - started)
        return stored


@dataclass(frozen=True)
class TensorSource:
    """In-memory tensors (numpy arrays, torch tensors or ``TensorData``): FULL, or an XOR delta on ``base``.

    Args:
        tensors: the new weights.
        base: what the replicas serve, byte-exact: a delta is encoded against it, a FULL
            snapshot checked against it (names, dtypes, shapes); empty or ``None``: nothing
            is served yet.
        files: other files of the snapshot, uploaded beside the shards whatever its type.
        full_files: other files of a FULL snapshot only (``config.json``, tokenizer: what a
            publisher passes in case the cost rule cuts its delta).
        full: what a delta cut FULL is published from (default: these tensors).

    The encode overlaps the upload, so its time is part of the upload's; a delta the cost
    rule declines was encoded in memory only, and that encode is local work.
    """

    tensors: Mapping[str, Any]
    _: KW_ONLY
    base: Mapping[str, Any] | None = None
    files: Mapping[str, bytes] | None = None
    full_files: Mapping[str, bytes] | None = None
    full: VersionSource | None = None

    def store(self, attempt: Attempt, target: Target, workers: int) -> StoredSnapshot | None:
        """Encode and upload (a delta weighed first under the cost rule); an empty delta stores nothing."""
        started = time.perf_counter()
        stored = self._upload(attempt, target, workers)
        if stored.declined:  # cut FULL: the delta was only encoded
            attempt.stage(started)
            if self.full is not None:
                return self.full.store(attempt, target, workers)
            started = time.perf_counter()
            stored = self._upload(attempt, target, workers)
        if not stored.empty:
            attempt.stored(stored, time.perf_counter() - started)
        return stored

    def _upload(self, attempt: Attempt, target: Target, workers: int) -> StoredSnapshot:
        attempt.before_upload()
        plan = attempt.plan
        files = dict(self.files or {})
        if plan.full:
            files.update(self.full_files or {})
        with upload_deadline(plan.identity, plan.budget):
            return target.store.upload_tensors(
                self.tensors,
                plan.identity,
                previous_identity=plan.previous_identity,
                base=self.base or None,  # an empty mapping: nothing is served yet
                workers=workers,
                extra_files=files or None,
                allow_empty=attempt.skip_empty,
                accept=None if attempt.weigh is None else attempt.accept,
                deadline=plan.budget,
            )


@dataclass(frozen=True)
class DiffSource:
    """The XOR delta from checkpoint ``base`` to checkpoint ``checkpoint``, in one pass (nothing staged on disk).

    Both checkpoints are read in chunks (never memory-mapped). A FULL plan, or a delta the
    cost rule cuts, publishes ``checkpoint``'s directory itself. With ``keep`` the delta
    directory is written there first and uploaded from it.

    Args:
        checkpoint: the new checkpoint directory.
        base: the checkpoint the replicas serve (the plan's predecessor's weights, byte-exact).
        keep: also keep the delta directory here (must not exist or be empty).
    """

    checkpoint: str | os.PathLike[str]
    base: str | os.PathLike[str]
    _: KW_ONLY
    keep: str | os.PathLike[str] | None = None

    def store(self, attempt: Attempt, target: Target, workers: int) -> StoredSnapshot | None:
        """Encode the delta and upload it (or the new checkpoint's directory, for a FULL)."""
        from cwtrain.hotload.files.checkpoint import check_checksum_room, open_checkpoint

        plan = attempt.plan
        whole = DirectorySource(os.fspath(self.checkpoint))
        if plan.full:
            return whole.store(attempt, target, workers)
        if self.keep is not None:
            return self._kept(attempt, target, workers)
        with open_checkpoint(os.fspath(self.base)) as old, open_checkpoint(os.fspath(self.checkpoint)) as new:
            check_checksum_room(old, why="`snapshot apply` could never apply a delta against it")
            log.info("encoding the delta %s -> %s as %r on %r", old.path, new.path, plan.identity,
                     plan.previous_identity)  # fmt: skip
            return TensorSource(new.tensors, base=old.tensors, full=whole).store(attempt, target, workers)

    def _kept(self, attempt: Attempt, target: Target, workers: int) -> StoredSnapshot | None:
        from cwtrain.hotload.files.write import write_delta

        plan = attempt.plan
        assert self.keep is not None and plan.previous_identity is not None
        started = time.perf_counter()
        stats = write_delta(
            os.fspath(self.base), os.fspath(self.checkpoint), os.fspath(self.keep), version=plan.identity,
            base_version=plan.previous_identity,
        )  # fmt: skip
        if stats.empty:
            raise SnapshotError(
                f"no tensor changed between {self.base} and {self.checkpoint}: an empty delta is never published "
                f"(its index is in {self.keep}); keep serving {plan.previous_identity!r}"
            )
        attempt.stage(started)
        return DirectorySource(os.fspath(self.keep)).store(attempt, target, workers)


@dataclass(frozen=True)
class ShareSource:
    """A distributed publish's shards, stored by the ranks: the index over them, the side files, then the hot-load.

    Args:
        results: every rank's :class:`~cwtrain.hotload.lifecycle.shares.ShareResult`.
        files: side files of a FULL snapshot (``config.json``, tokenizer), written before the index.
    """

    results: Sequence[ShareResult]
    _: KW_ONLY
    files: Mapping[str, bytes] | None = None

    def store(self, attempt: Attempt, target: Target, workers: int) -> StoredSnapshot | None:
        """Write the index once every shard it names is stored (nothing for an empty delta).

        Raises:
            CWTrainError: a rank reported an error (nothing is committed).
        """
        del workers
        plan, results = attempt.plan, list(self.results)
        problems = [result.error for result in results if result.error]
        if problems:
            raise CWTrainError(f"publishing {plan.identity} failed: {problems[0]}")
        attempt.outcome.stage_seconds = max((result.stage_seconds for result in results), default=0.0)
        attempt.before_upload()
        started = time.perf_counter()
        stored = commit_shares(
            target.store, plan.identity, results, full=plan.full, previous_identity=plan.previous_identity,
            extra_files=self.files if plan.full else None,
        )  # fmt: skip
        if not stored.empty:
            upload = max((result.upload_seconds for result in results), default=0.0)
            attempt.stored(stored, upload + time.perf_counter() - started)
        return stored


@dataclass(frozen=True)
class StoredSource:
    """A snapshot uploaded before (``cwtrain hotload trigger``): optionally read back and checked, then hot-loaded.

    Args:
        verify: first read every stored object back and check it against the SHA-256 it
            was uploaded with, and a FULL snapshot's tensors against their Adler-32s
            (:func:`~cwtrain.hotload.store.snapshot_verify.verify_stored_snapshot`; skipped
            when no index is stored: the service refuses it then).
    """

    _: KW_ONLY
    verify: bool = False

    def store(self, attempt: Attempt, target: Target, workers: int) -> StoredSnapshot | None:
        """Check what is stored (with ``verify``); nothing is uploaded."""
        del workers
        identity = attempt.plan.identity
        attempt.before_upload(uploads=False)
        if self.verify:
            from cwtrain.hotload.store.snapshot_verify import verify_stored_snapshot

            checked = verify_stored_snapshot(target.store, identity)
            if checked is not None:
                log.info("verified %s: %d objects, %d tensors", checked.uri, checked.objects, checked.tensors)
        return StoredSnapshot(None, attempt.plan.snapshot_type, earlier=True)


@dataclass(frozen=True)
class RestoreSource:
    """An identity served before, hot-loaded again: a copy of its newest COMPLETED hot-load.

    The copy has that hot-load's type and delta metadata, and its prompt cache policy unless
    ``prompt_cache_policy`` is given. The index object of every identity of its chain must
    still be stored.

    Args:
        identity: the identity to go back to.
        prior: its completed hot-load, when the caller has it (default: looked up).
        prompt_cache_policy: sent instead of the original's.
        unless_served: nothing is hot-loaded when the newest completed hot-load is of
            ``identity`` already.
        measure: record the identity's stored bytes on the attempt (a kept baseline's FULL,
            for the cadence's cost rules).
    """

    identity: str
    _: KW_ONLY
    prior: HotLoad | None = None
    prompt_cache_policy: PromptCachePolicy | str | None = None
    unless_served: bool = False
    measure: bool = False

    def store(self, attempt: Attempt, target: Target, workers: int) -> StoredSnapshot | None:
        """Check that the identity can be hot-loaded again; nothing is uploaded.

        Raises:
            UsageError: no COMPLETED hot-load of the identity on this deployment.
            SnapshotError: its objects (or its chain's) are gone from the bucket.
        """
        del workers
        identity = self.identity
        prior = self.prior if self.prior is not None else target.completed(identity)
        if prior is None:
            raise UsageError(
                f"no COMPLETED hot-load of {identity!r} on deployment {target.deployment_id}; "
                "only identities that were served can be rolled back to (see `cwtrain hotload list`)"
            )
        if self.measure:
            attempt.full_bytes = _stored_bytes(target, identity)
        if self.unless_served:
            latest = target.completed()
            if latest is not None and latest.identity == identity:
                return None
        missing = target.missing_objects(prior)
        if missing:
            store = target.store
            raise SnapshotError(
                f"cannot roll back to {identity!r}: the snapshot objects of {', '.join(map(repr, missing))} are gone "
                f"from s3://{store.bucket}/{store.path_prefix}; publish the weights again under a new identity"
            )
        attempt.restore(prior, self.prompt_cache_policy)
        return StoredSnapshot(None, prior.type, earlier=True)


@dataclass(frozen=True)
class UnchangedSource:
    """A delta in which no tensor changed (slime's empty ``weight_map``): nothing is stored or hot-loaded."""

    def store(self, attempt: Attempt, target: Target, workers: int) -> StoredSnapshot | None:
        """Nothing: an empty delta."""
        del target, workers
        return StoredSnapshot(None, attempt.plan.snapshot_type)


def _stored_bytes(target: Target, identity: str) -> int | None:
    """The stored size of a snapshot published before; ``None`` (with a warning) when it cannot be listed."""
    try:
        return target.store.stored_bytes(identity)
    except Exception as exc:  # the cost rules wait for the next FULL
        log.warning("could not list %s to learn its size (%s); the cost rules wait for the next FULL", identity, exc)
        return None
