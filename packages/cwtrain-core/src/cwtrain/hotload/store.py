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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cwtrain.errors import SnapshotError
from cwtrain.hotload import manifest
from cwtrain.hotload.format import INDEX_NAME, SnapshotFile
from cwtrain.hotload.identity import snapshot_prefix
from cwtrain.hotload.tensors import to_tensor_data
from cwtrain.infra.enums import SnapshotType
from cwtrain.infra.objectstore import ObjectStore
from cwtrain.infra.s3 import ObjectStoreLike, as_object_store

if TYPE_CHECKING:
    from cwtrain.hotload.inspect import SnapshotInfo
    from cwtrain.hotload.upload import SnapshotUpload

__all__ = ["SnapshotStore"]


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
    ) -> str:
        """Upload a snapshot directory (or its ``SnapshotInfo``) under ``identity``; returns the URI."""
        from cwtrain.hotload.upload import upload_snapshot

        return upload_snapshot(
            snapshot,
            bucket=self.bucket,
            identity=identity,
            path_prefix=self.path_prefix,
            s3=self.s3,
            workers=workers,
            on_progress=on_progress,
        )

    def open_upload(self, identity: str, *, workers: int = 8) -> SnapshotUpload:
        """A streaming upload of ``identity`` (a context manager: ``add`` files, then ``commit`` the index)."""
        from cwtrain.hotload.upload import SnapshotUpload

        return SnapshotUpload(
            self.s3, bucket=self.bucket, identity=identity, path_prefix=self.path_prefix, workers=workers
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
    ) -> SnapshotType:
        """Encode in-memory tensors and upload them under ``identity``; returns the snapshot type.

        FULL (with checksums) when ``previous_identity`` is ``None``; else an XOR delta
        against ``base``. Tensors may be numpy arrays, torch tensors or ``TensorData``;
        nothing is staged on disk.

        Raises:
            SnapshotError: a delta without ``base``, an empty delta (nothing changed, so
                nothing to publish), or tensors the codec refuses.
        """
        from cwtrain.hotload.codec import DeltaEncoder

        new = to_tensor_data(tensors)
        with DeltaEncoder() as encoder:
            if previous_identity:
                if base is None:
                    raise SnapshotError(
                        f"publishing {identity!r} as a delta on {previous_identity!r} needs base= (the weights "
                        "replicas serve now); without it, publish FULL (no previous_identity)"
                    )
                snap = encoder.encode(new, to_tensor_data(base), version=identity, base_version=previous_identity)
                if snap.empty:
                    raise SnapshotError(
                        f"no tensor changed between {previous_identity!r} and {identity!r}: an empty delta is never "
                        "published; keep serving the previous identity"
                    )
            else:
                snap = encoder.encode_full(new)
            with self.open_upload(identity, workers=workers) as upload:
                for name, data in (extra_files or {}).items():
                    upload.add(SnapshotFile.from_bytes(name, data))
                for file in snap.files:
                    upload.add(file)
                upload.commit(snap.index)
        return SnapshotType.INCREMENTAL if previous_identity else SnapshotType.FULL

    # ------------------------------------------------------------------ reads

    def index_exists(self, identity: str) -> bool:
        """Whether ``identity``'s index object is stored (its snapshot is complete)."""
        return self.s3.head(self.bucket, f"{self.prefix(identity)}/{INDEX_NAME}") is not None

    def check_access(self) -> str:
        """The four-call permission check on the prefix (snapshot-format.md section 9); returns the URI."""
        from cwtrain.hotload.access import check_snapshot_access

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
