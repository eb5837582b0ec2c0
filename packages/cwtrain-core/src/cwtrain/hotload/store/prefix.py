"""Where a deployment's snapshots live: one bucket and path prefix, and what is written there.

:class:`SnapshotStore` is the public target of every upload: :class:`~cwtrain.hotload.loader.HotLoader`
builds one from the deployment's ``hotLoad`` block (``loader.store``), and the
integrations that publish from tensors or from several ranks use the same object::

    store = SnapshotStore(object_store(), bucket="weights", path_prefix="hotload")   # or a boto3 client
    store.uri("run1-v000007")                                 # s3://weights/hotload/run1-v000007/
    store.upload(info, "run1-v000007", workers=8)             # a directory or its SnapshotInfo
    store.upload_tensors(new, "run1-v000008", previous_identity="run1-v000007", base=served)
    with store.open_upload("run1-v000009") as upload: ...     # streaming: add files, commit the index
    store.index_exists("run1-v000007")
    store.write_manifest(identity, manifest); store.read_manifest(identity)

Every object goes through :attr:`SnapshotStore.s3`, an
:class:`~cwtrain.infra.objectstore.ObjectStore` (a boto3 client passed in is wrapped by
:func:`~cwtrain.infra.s3.as_object_store`). Nothing here talks to the inference API or
checks chains: the loader does that before it calls the store.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cwtrain.errors import SnapshotError
from cwtrain.hotload.format.identity import snapshot_prefix
from cwtrain.hotload.format.index import INDEX_NAME, SnapshotFile
from cwtrain.hotload.format.tensors import to_tensor_data
from cwtrain.hotload.store import prefix_manifests as manifest
from cwtrain.hotload.store.snapshot_checks import check_published_tensors
from cwtrain.infra.enums import SnapshotType
from cwtrain.infra.objectstore import Deadline, ObjectStore
from cwtrain.infra.s3 import ObjectStoreLike, as_object_store

if TYPE_CHECKING:
    from cwtrain.hotload.codec.encode import EncodedSnapshot
    from cwtrain.hotload.codec.stages import StageStats
    from cwtrain.hotload.files.validate import SnapshotInfo
    from cwtrain.hotload.store.snapshot_upload import SnapshotUpload, UploadedFile

__all__ = ["SnapshotStore", "StoredSnapshot"]


@dataclass(frozen=True)
class StoredSnapshot:
    """What an upload stored.

    Attributes:
        uri: ``s3://<bucket>/<P>/<identity>/``; ``None`` when nothing was stored (an empty delta).
        snapshot_type: FULL or INCREMENTAL.
        snapshot_bytes: bytes of every object of the snapshot (shards, side files, index).
        wire_bytes: bytes this upload sent (less when a retry found objects already stored).
        tensors_changed: tensors the snapshot holds (a delta's changed ones); ``None`` unknown.
        bytes_changed: raw bytes of those tensors.
        checksums: the Adler-32 (8 hex) of every tensor of the full weights at this
            snapshot, when the encoder computed them.
        info: the inspected directory, for a directory upload.
        declined: the delta was encoded but not uploaded: ``accept`` said no (nothing stored).
        earlier: stored before (a snapshot hot-loaded again, or triggered): nothing uploaded now.
    """

    uri: str | None
    snapshot_type: SnapshotType
    snapshot_bytes: int = 0
    wire_bytes: int = 0
    tensors_changed: int | None = None
    bytes_changed: int = 0
    checksums: Mapping[str, str] | None = field(default=None, repr=False)
    info: SnapshotInfo | None = field(default=None, repr=False)
    declined: bool = False
    earlier: bool = False

    @property
    def empty(self) -> bool:
        """Nothing changed, so nothing was stored (an empty delta is never published)."""
        return self.uri is None and not self.declined and not self.earlier

    @staticmethod
    def sizes(files: Iterable[UploadedFile]) -> tuple[int, int]:
        """``(snapshot bytes, wire bytes)`` of uploaded files."""
        items = list(files)
        return sum(f.size for f in items), sum(f.size for f in items if f.outcome == "uploaded")


@dataclass(frozen=True, init=False)
class SnapshotStore:
    """The snapshot location of one deployment: an object store, a bucket and a path prefix.

    Args:
        s3: the object store, or a boto3 S3 client (wrapped).
        bucket: the deployment's ``hotLoad.bucket``.
        path_prefix: ``hotLoad.pathPrefix`` (leading and trailing ``/`` are dropped; may be empty).

    Attributes:
        s3: the object store.
        bucket: the bucket.
        path_prefix: the prefix without leading or trailing ``/``.
    """

    s3: ObjectStore
    bucket: str
    path_prefix: str

    def __init__(self, s3: ObjectStoreLike, bucket: str, path_prefix: str = "") -> None:
        object.__setattr__(self, "s3", as_object_store(s3))
        object.__setattr__(self, "bucket", bucket)
        object.__setattr__(self, "path_prefix", (path_prefix or "").strip("/"))

    def prefix(self, identity: str) -> str:
        """The key prefix of ``identity``'s objects (``P/<identity>``)."""
        return snapshot_prefix(self.path_prefix, identity)

    def uri(self, identity: str) -> str:
        """``s3://<bucket>/<P>/<identity>/``."""
        return f"s3://{self.bucket}/{self.prefix(identity)}/"

    # ------------------------------------------------------------------ uploads

    def upload(
        self,
        snapshot: str | SnapshotInfo,
        identity: str,
        *,
        workers: int = 8,
        on_progress: Callable[[int], None] | None = None,
        deadline: Deadline | None = None,
    ) -> StoredSnapshot:
        """Upload a snapshot directory (or its ``SnapshotInfo``) under ``identity``.

        ``deadline`` (a :class:`cwtrain.polling.Budget`) bounds every object-store call
        (:func:`cwtrain.infra.objectstore.within`).
        """
        from cwtrain.hotload.files.validate import SnapshotInfo, inspect_snapshot
        from cwtrain.hotload.store.snapshot_upload import upload_snapshot

        info = snapshot if isinstance(snapshot, SnapshotInfo) else inspect_snapshot(snapshot)
        files: list[UploadedFile] = []
        uri = upload_snapshot(
            info,
            bucket=self.bucket,
            identity=identity,
            path_prefix=self.path_prefix,
            s3=self.s3,
            workers=workers,
            on_progress=on_progress,
            on_file=files.append,
            deadline=deadline,
        )
        total, sent = StoredSnapshot.sizes(files)
        return StoredSnapshot(
            uri,
            SnapshotType.parse(info.type),
            total,
            sent,
            tensors_changed=len(info.index["weight_map"]),
            bytes_changed=info.tensor_bytes,
            info=info,
        )

    def open_upload(
        self,
        identity: str,
        *,
        workers: int = 8,
        shared_files: Iterable[str] = (),
        deadline: Deadline | None = None,
    ) -> SnapshotUpload:
        """A streaming upload of ``identity`` (a context manager: ``add`` files, then ``commit`` the index).

        ``shared_files`` names files other writers store (a distributed publish's shards),
        which the commit requires before it writes the index; ``deadline`` bounds every
        object-store call.
        """
        from cwtrain.hotload.store.snapshot_upload import SnapshotUpload

        return SnapshotUpload(
            self.s3,
            bucket=self.bucket,
            identity=identity,
            path_prefix=self.path_prefix,
            workers=workers,
            shared_files=list(shared_files),
            deadline=deadline,
        )

    def upload_tensors(
        self,
        tensors: Mapping[str, Any],
        identity: str,
        *,
        previous_identity: str | None = None,
        base: Mapping[str, Any] | None = None,
        workers: int = 8,
        extra_files: Mapping[str, bytes] | None = None,
        stats: StageStats | None = None,
        allow_empty: bool = False,
        accept: Callable[[EncodedSnapshot], bool] | None = None,
        deadline: Deadline | None = None,
    ) -> StoredSnapshot:
        """Encode in-memory tensors and upload them under ``identity``; returns what was stored.

        FULL (with checksums) when ``previous_identity`` is ``None``; else an XOR delta
        against ``base``. Tensors may be numpy arrays, torch tensors or ``TensorData``;
        nothing is staged on disk.

        What overlaps: the upload lists what the prefix holds while the encoder works; a
        FULL snapshot's layout is known before any byte is read, so
        shard k uploads while shard k+1 is checksummed. A delta's shards go out once the
        last tensor is compressed: a shard's header (every member's Adler-32 and frame
        length) comes first in the file, its name carries the shard count, and its
        SHA-256 is part of the create request (``snapshot-format.md`` sections 5 and 7),
        so no byte of it can leave earlier. Within the encode, tensors run in parallel
        and each 1 MiB chunk is read, XORed, checksummed and compressed while in cache.

        Args:
            tensors: the new weights.
            identity: the snapshot identity.
            previous_identity: the predecessor (makes this a delta against ``base``).
            base: the weights replicas serve now, byte-exact: a delta is encoded against
                them; a FULL snapshot is checked against them (names, dtypes, shapes).
            workers: objects uploaded in parallel.
            extra_files: other files of the snapshot (name → bytes); a FULL snapshot needs
                ``config.json``.
            stats: where to record the ``gather``, ``read``, ``xor``, ``adler``, ``zstd``
                and ``sha256`` stages (:mod:`cwtrain.hotload.codec.stages`).
            allow_empty: an empty delta stores nothing and returns an empty result
                instead of raising.
            accept: asked with a (non-empty) delta once it is encoded, before any byte of
                it is uploaded; ``False`` stores nothing and returns a ``declined`` result
                (a publisher that publishes this version FULL instead: the cadence's cost
                rule, :meth:`~cwtrain.hotload.lifecycle.session.PublishSession.weigh`).
            deadline: bounds every object-store call (a :class:`cwtrain.polling.Budget`).

        Before anything is encoded, :func:`~cwtrain.hotload.store.snapshot_checks.check_published_tensors`
        checks the dtypes against the served ones and a FULL snapshot's ``config.json``
        (an error, or a :class:`~cwtrain.hotload.store.snapshot_checks.DtypeWarning`).

        Raises:
            SnapshotError: a delta without ``base``, an empty delta (nothing changed, so
                nothing to publish) unless ``allow_empty``, a delta that changes a served
                dtype, a FULL snapshot without ``config.json`` (or, with ``base``, unlike the
                served weights), or tensors the codec refuses.
        """
        from cwtrain.hotload.codec.encode import DeltaEncoder

        if previous_identity and base is None:
            raise SnapshotError(
                f"publishing {identity!r} as a delta on {previous_identity!r} needs base= (the weights "
                "replicas serve now); without it, publish FULL (no previous_identity)"
            )
        check_published_tensors(tensors, base=base, extra_files=extra_files, delta=bool(previous_identity))
        mark = stats.clock() if stats is not None else None
        new = to_tensor_data(tensors)
        served = to_tensor_data(base) if previous_identity and base is not None else None
        if stats is not None and mark is not None:
            stats.lap("gather", sum(t.nbytes for t in new.values()), mark)
        kind = SnapshotType.INCREMENTAL if previous_identity else SnapshotType.FULL
        with (
            DeltaEncoder() as encoder,
            _entered_meanwhile(self.open_upload(identity, workers=workers, deadline=deadline)) as opened,
        ):
            if previous_identity and served is not None:
                snap = encoder.encode(new, served, version=identity, base_version=previous_identity, stats=stats)
                if snap.empty:
                    if allow_empty:
                        return StoredSnapshot(None, kind, tensors_changed=0, checksums=snap.checksums)
                    raise SnapshotError(
                        f"no tensor changed between {previous_identity!r} and {identity!r}: an empty delta is never "
                        "published; keep serving the previous identity"
                    )
                if accept is not None and not accept(snap):
                    return StoredSnapshot(None, kind, tensors_changed=len(snap.changed), declined=True)
                shards: Iterable[SnapshotFile] = snap.files
                index = snap.index
                changed = snap.changed
                checksums: Mapping[str, str] = snap.checksums
            else:
                plan = encoder.plan_full(new, stats=stats)
                shards = (plan.build(shard) for shard in plan.shards)  # built one by one, as the upload takes them
                index = plan.index
                changed = list(new)
                checksums = plan.checksums
            upload = opened()
            for name, data in (extra_files or {}).items():
                upload.add(_source(SnapshotFile.from_bytes(name, data), stats))
            for file in shards:
                upload.add(_source(file, stats))
            uri = upload.commit(_source(index, stats))
            total, sent = StoredSnapshot.sizes(upload.results.values())
        return StoredSnapshot(
            uri,
            kind,
            total,
            sent,
            tensors_changed=len(changed),
            bytes_changed=sum(new[name].nbytes for name in changed),
            checksums=dict(checksums),
        )

    # ------------------------------------------------------------------ reads

    def stored_bytes(self, identity: str) -> int:
        """Bytes of every object stored under ``identity`` (one listing): what a cold replica reads of it."""
        return sum(item.size for item in self.s3.list_objects(self.bucket, f"{self.prefix(identity)}/"))

    def index_exists(self, identity: str) -> bool:
        """Whether ``identity``'s index object is stored (its snapshot is complete)."""
        return self.s3.head(self.bucket, f"{self.prefix(identity)}/{INDEX_NAME}") is not None

    def identities(self, starting: str) -> set[str]:
        """The identities whose names start with ``starting`` that hold anything under the prefix.

        An identity counts once one object, or one unfinished multipart upload, is stored
        under ``P/<identity>/``: what an interrupted or failed upload left counts too (its
        identity cannot be published again with other bytes). Two listings, every page.
        """
        root = snapshot_prefix(self.path_prefix, starting)
        keys = [item.key for item in self.s3.list_objects(self.bucket, root)]
        keys += [upload.key for upload in self.s3.list_multipart_uploads(self.bucket, root)]
        skip = len(root) - len(starting)  # the key's identity starts there
        return {key[skip:].split("/", 1)[0] for key in keys if "/" in key[skip:]}

    def check_access(self) -> str:
        """The four-call permission check on the prefix (snapshot-format.md section 9); returns the URI."""
        from cwtrain.hotload.store.prefix_access import check_snapshot_access

        return check_snapshot_access(self.s3, self.bucket, self.path_prefix)

    # ------------------------------------------------------------------ manifests

    def manifest_key(self, identity: str) -> str:
        """``P/_manifests/<identity>.json`` (snapshot-format.md section 8.1)."""
        return manifest.manifest_key(self.path_prefix, identity)

    def write_manifest(self, identity: str, manifest_json: Mapping[str, Any]) -> str:
        """Write the manifest create-only (identical content already there is success); returns its URI.

        Raises:
            SnapshotConflictError: another manifest is stored under this identity.
        """
        return manifest.write_manifest(self.s3, self.bucket, self.path_prefix, identity, manifest_json)

    def read_manifest(self, identity: str) -> dict[str, Any] | None:
        """The manifest of ``identity``, or ``None`` when absent."""
        return manifest.read_manifest(self.s3, self.bucket, self.path_prefix, identity)


@contextmanager
def _entered_meanwhile(upload: SnapshotUpload) -> Iterator[Callable[[], SnapshotUpload]]:
    """Enter ``upload`` (two listings of the prefix) on another thread while the caller works.

    Yields a function that waits for the upload to be open and returns it (raising what
    opening raised); on leaving, an opened upload is closed (cancelled unless committed).
    """
    with ThreadPoolExecutor(1, thread_name_prefix="cwtrain-open") as pool:
        opening = pool.submit(upload.__enter__)
        try:
            yield opening.result
        finally:
            if opening.exception() is None:
                error = sys.exc_info()[1]  # what ends the block (an interrupt is reported by the upload)
                upload.__exit__(type(error) if error else None, error, None)


def _source(file: SnapshotFile, stats: StageStats | None) -> Any:
    """What ``SnapshotUpload.add`` takes: the file itself, or with ``stats`` a source whose SHA-256 pass is timed."""
    if stats is None:
        return file
    from cwtrain.hotload.store.object_source import ObjectSource

    timed: StageStats = stats
    lock = threading.Lock()

    class _TimedSource(ObjectSource):
        hashed = False

        def sha256(self) -> str:
            with lock:  # the first call hashes (timed); later ones return the cached digest
                if not self.hashed:
                    with timed.measure("sha256", self.size):
                        super().sha256()
                    self.hashed = True
            return super().sha256()

    return _TimedSource.from_buffers(file.name, file.buffers)
