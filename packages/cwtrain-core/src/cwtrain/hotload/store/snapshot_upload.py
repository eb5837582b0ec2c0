"""Publishing snapshots to object storage: immutable, resumable, race-free, index last.

A snapshot goes to ``s3://<bucket>/<P>/<identity>/`` (spec ``snapshot-format.md``
sections 1 and 7). Two entry points:

* :func:`upload_snapshot` publishes a directory (or a
  :class:`~cwtrain.hotload.files.validate.SnapshotInfo`)::

      from cwtrain.hotload import upload_snapshot
      from cwtrain.infra import s3_client

      uri = upload_snapshot("ckpt/step-7", bucket="weights", identity="run1-v000007",
                            path_prefix="hotload", s3=s3_client())

* :class:`SnapshotUpload` takes files as an encoder produces them, without staging them
  on disk; the index goes last, at :meth:`SnapshotUpload.commit`::

      snap = encoder.encode(new, served, version="run1-v000008", base_version="run1-v000007")
      with SnapshotUpload(s3, bucket="weights", identity="run1-v000008", path_prefix="hotload") as up:
          for shard in snap.files:
              up.add(shard)                 # uploads in the background
          uri = up.commit(snap.index)       # waits for every shard, then writes the index

  Leaving the block without ``commit`` (an exception, a signal) cancels the uploads,
  aborts their unfinished multipart uploads and never writes the index; after an interrupt
  (Ctrl-C, or SIGTERM in the CLI) a warning says what stays stored.

**Guarantees.** Every object carries ``x-amz-meta-cwtrain-sha256`` (one SHA-256 pass per
file, see :mod:`cwtrain.hotload.store.object_writer`) and is written create-only
(``If-None-Match: *``). Before writing, the keys directly under the snapshot prefix are
listed: objects with the local SHA-256 are skipped, so a second run of the same snapshot
uploads nothing and a re-run after a crash sends only what is missing (unfinished multipart
uploads continue at part granularity); different bytes, or keys that are not part of the
snapshot, raise :class:`~cwtrain.errors.SnapshotConflictError` naming each key, before
anything is written. An object found stored is checked against the local bytes, not only
its recorded SHA-256 (:meth:`~cwtrain.hotload.store.object_writer.ObjectWriter.check_existing`),
and an unfinished multipart upload is resumed only when it was made for the same bytes (its
marker part), so the index is written only over objects whose bytes are their record. The first file in name order is written alone before the others: two
publishers racing on one identity collide on it, so exactly one proceeds and the other gets
``SnapshotConflictError`` with nothing of its own stored. The index is written only after
every other object is confirmed, so a reader that sees it can rely on the shards.

**The bytes hashed are the bytes sent.** Files on disk are read with ``pread`` (never
memory-mapped) into buffers, hashed as they are read and sent from the same buffers; a file
larger than ``memory_budget`` is hashed, then re-read and hashed again in order, and its
object is completed only when both digests agree (see :mod:`cwtrain.hotload.store.object_source`).
A file that shrinks, changes or is replaced between the moment it is opened and the end
of the upload raises :class:`~cwtrain.errors.SnapshotError` naming it: its multipart
upload is aborted and the index is never written (every file is checked again before
the index goes out). Every stored object is checked with a HEAD against what was hashed.

**Concurrency and memory.** ``workers`` objects upload in parallel and ``workers`` parts
are in flight across them (``CWTRAIN_HOTLOAD_UPLOAD_WORKERS`` in the integrations). Files
on disk are read into at most ``memory_budget`` bytes of buffers
(``CWTRAIN_HOTLOAD_MEMORY_BUDGET``, 1 GiB), which stay allocated for the next publish of
the process (fresh memory costs as much CPU as hashing it;
:func:`cwtrain.hotload.store.object_buffers.release_read_buffers` frees them); in the streaming form
:meth:`SnapshotUpload.add` also blocks while the encoded bytes in flight exceed that budget. Part size:
``part_size`` or ``CWTRAIN_HOTLOAD_PART_SIZE`` (64 MiB, at least 50 MB).

**Progress.** ``on_progress(nbytes)`` is called from worker threads with every confirmed
part or object (skipped objects count as done), the signature of
:class:`cwtrain.progress.ByteProgress`; ``on_file(UploadedFile)`` once per object.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from cwtrain.config import env_int
from cwtrain.errors import ConfigError, SnapshotConflictError, SnapshotError, UsageError
from cwtrain.hotload.codec.common import MemoryBudget
from cwtrain.hotload.format.identity import snapshot_prefix, validate_identity
from cwtrain.hotload.format.index import INDEX_NAME
from cwtrain.hotload.store.object_buffers import BufferPool
from cwtrain.hotload.store.object_writer import (
    DEFAULT_PART_SIZE,
    ObjectSource,
    ObjectWriter,
    RemoteObject,
    check_part_size,
    head_object,
)
from cwtrain.infra.objectstore import Deadline, ObjectStore, ObjectStoreStatusError, OpenUpload, within
from cwtrain.infra.s3 import ObjectStoreLike, as_object_store

__all__ = ["SnapshotUpload", "UploadedFile", "snapshot_uri", "upload_snapshot"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UploadedFile:
    """One object of a published snapshot.

    Attributes:
        name: the file name.
        key: the object key.
        size: bytes.
        sha256: the SHA-256 recorded in ``cwtrain-sha256``.
        outcome: ``"uploaded"``, or ``"existing"`` when the store already held these bytes.
    """

    name: str
    key: str
    size: int
    sha256: str
    outcome: str


def snapshot_uri(bucket: str, path_prefix: str, identity: str) -> str:
    """``s3://<bucket>/<snapshot prefix>/``."""
    return f"s3://{bucket}/{snapshot_prefix(path_prefix, identity)}/"


def _list_existing(s3: ObjectStore, bucket: str, prefix: str) -> dict[str, RemoteObject]:
    """Objects directly under ``prefix/`` (all pages, ``Delimiter=/``), with their metadata."""
    names = [item.key[len(prefix) + 1 :] for item in s3.list_objects(bucket, prefix + "/", delimiter="/")]
    if not names:
        return {}
    with ThreadPoolExecutor(min(8, len(names)), thread_name_prefix="cwtrain-head") as pool:
        heads = pool.map(lambda name: head_object(s3, bucket, f"{prefix}/{name}"), names)
        return {name: remote for name, remote in zip(names, heads, strict=True) if remote is not None}


def _list_open_uploads(s3: ObjectStore, bucket: str, prefix: str) -> dict[str, list[OpenUpload]]:
    """Unfinished multipart uploads under ``prefix/``, by key (empty if listing is refused)."""
    found: dict[str, list[OpenUpload]] = {}
    try:
        uploads = s3.list_multipart_uploads(bucket, prefix + "/")
    except ObjectStoreStatusError as exc:
        log.debug("cannot list unfinished multipart uploads under %s (%s); no part-level resume", prefix, exc)
        return found
    for upload in uploads:
        found.setdefault(upload.key, []).append(upload)
    return found


def _file_name(name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise UsageError(f"snapshot file name {name!r} must be one path segment")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"snapshot file name {name!a} is not valid UTF-8 (object keys are UTF-8)") from None
    return name


class SnapshotUpload:
    """Streaming upload of one snapshot: files as they are produced, the index last.

    Args:
        s3: the object store, or a boto3 client (wrapped); default :func:`cwtrain.infra.s3.object_store`.
        bucket: the bucket (deployment ``spec.hotLoad.bucket``).
        identity: the snapshot identity.
        path_prefix: deployment ``spec.hotLoad.pathPrefix`` (may be empty).
        workers: objects uploaded in parallel, and parts in flight.
        part_size: multipart part size; else ``CWTRAIN_HOTLOAD_PART_SIZE``, else 64 MiB.
        memory_budget: bytes of added files in flight before :meth:`add` blocks; else
            ``CWTRAIN_HOTLOAD_MEMORY_BUDGET``, else 1 GiB.
        on_file: called with an :class:`UploadedFile` once each object is stored.
        on_progress: called with byte counts as the store confirms them.
        shared_files: names of files of this snapshot written by other writers (the
            ranks of a distributed publish): not counted as strays; :meth:`commit`
            requires them to be stored before it writes the index.
        deadline: bounds every object-store call (a :class:`cwtrain.polling.Budget`, see
            :func:`cwtrain.infra.objectstore.within`); past it the upload fails with
            :class:`~cwtrain.infra.objectstore.ObjectStoreDeadlineError`, its unfinished
            multipart uploads left for a resume.
    """

    def __init__(
        self,
        s3: ObjectStoreLike | None = None,
        *,
        bucket: str,
        identity: str,
        path_prefix: str = "",
        workers: int = 8,
        part_size: int | None = None,
        memory_budget: int | None = None,
        on_file: Callable[[UploadedFile], None] | None = None,
        on_progress: Callable[[int], None] | None = None,
        shared_files: Iterable[str] = (),
        deadline: Deadline | None = None,
    ) -> None:
        if workers < 1:
            raise UsageError(f"workers={workers} must be at least 1")
        self.s3 = within(as_object_store(s3), deadline)
        self.bucket = bucket
        self.identity = validate_identity(identity)
        self.path_prefix = (path_prefix or "").strip("/")
        self.prefix = snapshot_prefix(self.path_prefix, self.identity)
        self.uri = snapshot_uri(bucket, self.path_prefix, self.identity)
        self.workers = workers
        if part_size is None:
            configured = env_int("CWTRAIN_HOTLOAD_PART_SIZE", DEFAULT_PART_SIZE)
            try:
                part_size = check_part_size(configured)
            except ConfigError as exc:
                raise ConfigError(f"CWTRAIN_HOTLOAD_PART_SIZE={configured}: {exc}") from None
        self.part_size = check_part_size(part_size)
        self._budget = MemoryBudget(memory_budget)
        self._buffers = BufferPool(self._budget.limit)
        self._sources: list[ObjectSource] = []
        self._on_file = on_file
        self._on_progress = on_progress
        self._given_existing: dict[str, RemoteObject] | None = None
        self.shared_files = frozenset(shared_files)
        self.existing: dict[str, RemoteObject] = {}
        self.results: dict[str, UploadedFile] = {}
        self._futures: dict[str, Future[UploadedFile]] = {}
        self._claim: Future[UploadedFile] | None = None
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._writer: ObjectWriter | None = None
        self._objects: ThreadPoolExecutor | None = None
        self._parts: ThreadPoolExecutor | None = None
        self._committed = False

    def existing_known(self, existing: Mapping[str, RemoteObject]) -> None:
        """What the prefix holds, listed by the caller just now: entering does not list it again."""
        self._given_existing = dict(existing)

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> SnapshotUpload:
        self.existing = (
            dict(self._given_existing)
            if self._given_existing is not None
            else _list_existing(self.s3, self.bucket, self.prefix)
        )
        opened = _list_open_uploads(self.s3, self.bucket, self.prefix)
        self._objects = ThreadPoolExecutor(self.workers, thread_name_prefix="cwtrain-upload")
        self._parts = ThreadPoolExecutor(self.workers, thread_name_prefix="cwtrain-part")
        self._writer = ObjectWriter(
            self.s3,
            self.bucket,
            self.identity,
            part_size=self.part_size,
            part_pool=self._parts,
            on_bytes=self._progress,
            open_uploads=opened,
            cancelled=self._cancelled,
            buffers=self._buffers,
        )
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._committed:
            self.cancel()
            if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or SIGTERM in the CLI: say what is left
                stored = sum(1 for f in self._futures.values() if f.done() and not f.cancelled() and not f.exception())
                log.warning(
                    "upload of %s stopped: no index was written and its unfinished multipart uploads were "
                    "aborted; %d object(s) already stored stay (publishing %r again skips them)",
                    self.uri,
                    stored,
                    self.identity,
                )
        self._shutdown()

    def cancel(self) -> None:
        """Stop: pending files are dropped, running multipart uploads aborted, no index written."""
        self._cancelled.set()
        for future in list(self._futures.values()):
            future.cancel()
        for future in list(self._futures.values()):
            if not future.cancelled():
                try:
                    future.result()
                except BaseException:  # already reported by whoever needed it
                    pass

    def _shutdown(self) -> None:
        for pool in (self._objects, self._parts):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._objects = self._parts = None

    def _progress(self, nbytes: int) -> None:
        if self._on_progress is not None and nbytes:
            self._on_progress(nbytes)

    # ---------------------------------------------------------------- files

    def add(self, file: Any) -> None:
        """Upload one file in the background (blocks while the memory budget is used up).

        Args:
            file: a :class:`~cwtrain.hotload.format.index.SnapshotFile` (``name``, ``buffers``)
                or an :class:`~cwtrain.hotload.store.object_writer.ObjectSource`.

        Raises:
            SnapshotConflictError: an earlier file found a conflict.
            UsageError: a duplicate or invalid name, the index, or use outside ``with``.
        """
        if self._objects is None or self._writer is None:
            raise UsageError("SnapshotUpload.add() needs the upload opened with `with SnapshotUpload(...)`")
        source = file if isinstance(file, ObjectSource) else ObjectSource.from_buffers(file.name, file.buffers)
        name = _file_name(source.name)
        if name == INDEX_NAME:
            raise UsageError(f"{INDEX_NAME} is the index: pass it to commit(), which writes it last")
        with self._lock:
            if name in self._futures:
                raise UsageError(f"{name} was already added to snapshot {self.identity!r}")
        self._raise_failures(done_only=True)
        held = min(source.size, self._budget.limit) if source.in_memory else 0  # files use the read buffers
        if not self._budget.acquire(held, self._cancelled):
            raise SnapshotError("upload cancelled")
        claim = self._claim
        future = self._objects.submit(self._upload_one, source, claim, held)
        with self._lock:
            self._futures[name] = future
            self._sources.append(source)
            if self._claim is None:
                self._claim = future

    def _upload_one(self, source: ObjectSource, claim: Future[UploadedFile] | None, held: int) -> UploadedFile:
        try:
            if claim is not None:
                claim.result()  # the first file decides who owns the identity
            assert self._writer is not None
            key = f"{self.prefix}/{source.name}"
            remote = self.existing.get(source.name)
            if remote is not None:
                if not remote.matches(source):
                    raise SnapshotConflictError(self.identity, [_conflict_line(source, remote)])
                self._writer.check_existing(key, source)  # its bytes, not only its record
                self._writer.drop_stale(key)
                outcome = "existing"
                self._progress(source.size)
            else:
                outcome = self._writer.write(key, source)
            result = UploadedFile(source.name, key, source.size, source.sha256(), outcome)
            if self._on_file is not None:
                self._on_file(result)
            log.debug("%s: %s (%d bytes)", key, outcome, source.size)
            return result
        finally:
            self._budget.release(held)
            source.close()

    def _raise_failures(self, *, done_only: bool) -> None:
        """Raise the first failure; conflicts from several files become one error."""
        conflicts: list[str] = []
        first: BaseException | None = None
        for name, future in list(self._futures.items()):
            if done_only and not future.done():
                continue
            error = future.exception() if not future.cancelled() else None
            if error is None:
                if future.done() and not future.cancelled():
                    self.results[name] = future.result()
                continue
            if isinstance(error, SnapshotConflictError):
                conflicts.extend(error.conflicts)
            elif first is None:
                first = error
        if conflicts:
            raise SnapshotConflictError(self.identity, list(dict.fromkeys(conflicts)))
        if first is not None:
            raise first

    def wait(self) -> list[UploadedFile]:
        """Wait for every added file; raise the first failure.

        Raises:
            SnapshotError: also when a file added from disk changed since it was opened
                (the snapshot would mix versions of it).
        """
        for future in list(self._futures.values()):
            try:
                future.result()
            except Exception:  # a file failed: stop waiting (an interrupt of this thread propagates)
                break
        if any(not f.done() for f in self._futures.values()):
            self.cancel()
        self._raise_failures(done_only=False)
        for source in list(self._sources):
            source.verify_unchanged()
        return [self.results[name] for name in sorted(self.results)]

    def finish_share(self) -> list[UploadedFile]:
        """Wait for every added file and close without writing an index.

        For one rank of a distributed publish: its shards are stored, the snapshot stays
        invisible until one writer commits the index (with ``shared_files`` naming the
        other ranks' files).
        """
        try:
            results = self.wait()
        except BaseException:
            self.cancel()
            raise
        self._committed = True
        return results

    def commit(self, index: Any) -> str:
        """Wait for every file, then write the index; returns ``s3://bucket/prefix/identity/``.

        Args:
            index: the index file (a ``SnapshotFile``, an ``ObjectSource``, or raw bytes);
                ``None`` for a snapshot without one (only files, for tests and side uses).

        Raises:
            SnapshotConflictError: a conflict on any file, or stored keys that are not part
                of this snapshot; the index is then not written.
        """
        if self._writer is None:
            raise UsageError("SnapshotUpload.commit() needs the upload opened with `with SnapshotUpload(...)`")
        source: ObjectSource | None
        if index is None:
            source = None
        elif isinstance(index, (bytes, bytearray, memoryview)):
            source = ObjectSource.from_buffers(INDEX_NAME, [index])
        elif isinstance(index, ObjectSource):
            source = index
        else:
            source = ObjectSource.from_buffers(index.name, index.buffers)
        try:
            self.wait()
            for name in sorted(self.shared_files - set(self.existing)):  # other writers may have finished since
                remote = head_object(self.s3, self.bucket, f"{self.prefix}/{name}")
                if remote is not None:
                    self.existing[name] = remote
            missing = sorted(self.shared_files - set(self.existing))
            if missing:
                raise SnapshotError(f"{self.uri}: files of other writers are not stored yet: {', '.join(missing)}")
            strays = sorted(
                set(self.existing)
                - set(self._futures)
                - self.shared_files
                - {INDEX_NAME if source is None else source.name}
            )
            if strays:
                raise SnapshotConflictError(self.identity, [f"{name} (not part of this snapshot)" for name in strays])
            if source is not None:
                self.results[source.name] = self._upload_one(source, None, 0)
        except BaseException:
            self.cancel()
            raise
        self._committed = True
        log.info("snapshot %s complete: %s", self.uri, describe_results(list(self.results.values())))
        return self.uri


def _conflict_line(source: ObjectSource, remote: RemoteObject) -> str:
    if remote.sha256:
        return f"{source.name} (stored sha256 {remote.sha256}, local {source.sha256()})"
    return f"{source.name} (stored object without cwtrain-sha256, {remote.size} bytes, ETag {remote.etag})"


# ------------------------------------------------------------------- directory


def _snapshot_sources(snapshot: Any, identity: str) -> tuple[list[ObjectSource], ObjectSource]:
    """The files (opened now) and the index bytes as uploaded, of a directory or a ``SnapshotInfo``."""
    from cwtrain.hotload.files.validate import SnapshotInfo, inspect_snapshot

    info = snapshot if isinstance(snapshot, SnapshotInfo) else inspect_snapshot(snapshot)
    if info.empty_delta:
        raise SnapshotError(f"{info.path}: an empty delta (no changed tensor) is never uploaded")
    index = ObjectSource.from_buffers(INDEX_NAME, [info.uploaded_index(identity)])
    files: list[ObjectSource] = []
    try:
        for path in info.files:
            if Path(path).name != INDEX_NAME:
                files.append(ObjectSource.from_path(path, Path(path).name))
    except BaseException:
        for source in files:
            source.close()
        raise
    return files, index


def upload_snapshot(
    snapshot: Any,
    *,
    bucket: str,
    identity: str,
    path_prefix: str = "",
    s3: ObjectStoreLike | None = None,
    workers: int = 8,
    on_file: Callable[[UploadedFile], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
    part_size: int | None = None,
    deadline: Deadline | None = None,
) -> str:
    """Publish a snapshot under ``<path_prefix>/<identity>/``; returns its ``s3://`` URI.

    Args:
        snapshot: a snapshot directory, or a ``SnapshotInfo`` from ``inspect_snapshot``
            (a delta's index is uploaded in the rewritten form of spec section 5.2).
        bucket: the bucket.
        identity: the snapshot identity.
        path_prefix: the deployment's hot-load path prefix.
        s3: the object store, or a boto3 client (wrapped); default :func:`cwtrain.infra.s3.object_store`.
        workers: objects in parallel (and parts in flight), at least 1.
        on_file: called with an :class:`UploadedFile` per object.
        on_progress: called with byte counts (see :class:`cwtrain.progress.ByteProgress`).
        part_size: multipart part size (default ``CWTRAIN_HOTLOAD_PART_SIZE`` or 64 MiB).
        deadline: bounds every object-store call (see :class:`SnapshotUpload`).

    Raises:
        SnapshotConflictError: the identity holds other bytes or other keys (nothing written).
        ObjectStoreDeadlineError: the deadline passed (what is stored stays, resumable).
        SnapshotError: the snapshot cannot be published (e.g. an empty delta).
    """
    upload = SnapshotUpload(  # checks the identity, the workers and the part size before any I/O
        s3,
        bucket=bucket,
        identity=identity,
        path_prefix=path_prefix,
        workers=workers,
        part_size=part_size,
        on_file=on_file,
        on_progress=on_progress,
        deadline=deadline,
    )
    files, index = _snapshot_sources(snapshot, upload.identity)
    everything = [*files, index]
    try:
        existing = _list_existing(upload.s3, bucket, upload.prefix)
        _check_conflicts(upload.identity, existing, everything)
        upload.existing_known(existing)
        with upload:
            for source in files:
                upload.add(source)
            return upload.commit(index)
    finally:
        for source in everything:
            source.close()


def _check_conflicts(identity: str, existing: Mapping[str, RemoteObject], sources: Iterable[ObjectSource]) -> None:
    """Every conflict between stored keys and local files, raised before anything is written."""
    local = {s.name: s for s in sources}
    conflicts = [f"{name} (not part of this snapshot)" for name in sorted(set(existing) - set(local))]
    for name in sorted(set(existing) & set(local)):
        if not existing[name].matches(local[name]):
            conflicts.append(_conflict_line(local[name], existing[name]))
    if conflicts:
        raise SnapshotConflictError(identity, conflicts)


def describe_results(results: Sequence[UploadedFile]) -> str:
    """``"3 uploaded, 1 already stored (1.2 GiB)"`` for logs."""
    from cwtrain.progress import format_bytes

    uploaded = sum(1 for r in results if r.outcome == "uploaded")
    total = sum(r.size for r in results)
    return f"{uploaded} uploaded, {len(results) - uploaded} already stored ({format_bytes(total)})"
