"""The permission check: can this trainer publish snapshots under a prefix? (spec section 9)

:func:`check_snapshot_access` makes the four calls publishing needs, under the
deployment's hot-load prefix ``P``, and leaves nothing behind::

    from cwtrain.hotload import check_snapshot_access
    from cwtrain.infra import s3_client

    check_snapshot_access(s3_client(), "my-weights", "hotload")   # -> "s3://my-weights/hotload/"

======  ===========================================  ==========================  ===========================
Step    Call                                         Expected                    Proves
======  ===========================================  ==========================  ===========================
1       ListObjectsV2(``P/``, MaxKeys=1)             success                     ``s3:ListBucket``
2       HeadObject(``P/_preflight/<uuid4 hex>``)     404 / NoSuchKey / NotFound  ``s3:GetObject``
3       CreateMultipartUpload(the same key)          an ``UploadId``             ``s3:PutObject``
4       AbortMultipartUpload(that upload)            success                     ``s3:AbortMultipartUpload``
======  ===========================================  ==========================  ===========================

The multipart upload is never completed, so no object remains. A refusal raises
:class:`~cwtrain.errors.SnapshotAccessError` naming the permission, the S3 error code and
both policy layers (and the open upload id when step 4 fails); the code is the store's
(:attr:`~cwtrain.infra.objectstore.ObjectStoreStatusError.code`). Errors without an answer
(missing credentials, an unreachable endpoint: the store's
:class:`~cwtrain.infra.objectstore.ObjectStoreError` that is not a status error) pass
through unchanged. The same check runs as ``cwtrain hotload check`` and
``python -m cwtrain.integrations.preflight``.
"""

from __future__ import annotations

import uuid

from cwtrain.errors import SnapshotAccessError
from cwtrain.infra.objectstore import ObjectStoreStatusError
from cwtrain.infra.s3 import ObjectStoreLike, as_object_store

__all__ = ["check_snapshot_access"]


def check_snapshot_access(s3: ObjectStoreLike | None, bucket: str, path_prefix: str = "") -> str:
    """Prove the four permissions publishing needs, leaving nothing behind (spec section 9).

    1. ListObjectsV2(``P/``, MaxKeys=1) -> ``s3:ListBucket``; 2. HEAD of a random
    ``P/_preflight/<hex>`` answering 404 -> ``s3:GetObject``; 3. CreateMultipartUpload
    there -> ``s3:PutObject``; 4. AbortMultipartUpload -> ``s3:AbortMultipartUpload``.

    Args:
        s3: the object store, or a boto3 client (wrapped); ``None`` builds one from the environment.
        bucket: the bucket.
        path_prefix: the hot-load path prefix (may be empty).

    Returns:
        ``s3://<bucket>/<P>/`` (``s3://<bucket>/`` when ``P`` is empty).

    Raises:
        SnapshotAccessError: a call was refused; names the permission and the S3 error code.
            Missing credentials and transport errors pass through unchanged.
    """
    store = as_object_store(s3)
    prefix = (path_prefix or "").strip("/")
    base = f"{prefix}/" if prefix else ""
    uri = f"s3://{bucket}/{base}"
    probe = f"{base}_preflight/{uuid.uuid4().hex}"
    try:
        store.list_objects(bucket, base, limit=1)
    except ObjectStoreStatusError as exc:
        raise SnapshotAccessError(uri, "s3:ListBucket", exc.code) from exc
    try:
        found = store.head(bucket, probe)
    except ObjectStoreStatusError as exc:
        raise SnapshotAccessError(uri, "s3:GetObject", exc.code) from exc
    if found is not None:
        raise SnapshotAccessError(uri, "s3:GetObject", "?")  # a random key that exists: not a 404
    try:
        upload_id = store.create_multipart(bucket, probe)
    except ObjectStoreStatusError as exc:
        raise SnapshotAccessError(uri, "s3:PutObject", exc.code) from exc
    try:
        store.abort_multipart(bucket, probe, upload_id)
    except ObjectStoreStatusError as exc:
        raise SnapshotAccessError(uri, "s3:AbortMultipartUpload", exc.code, upload_id=upload_id) from exc
    return uri
