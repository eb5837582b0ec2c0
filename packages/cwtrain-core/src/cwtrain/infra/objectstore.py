"""The object-store seam: the operations cwtrain performs on S3-compatible storage.

Everything in cwtrain that reads or writes objects (uploads, manifests, the permission
check, model staging) talks to an :class:`ObjectStore`, never to an SDK. The one
implementation that ships is :class:`~cwtrain.infra.s3.Boto3ObjectStore` (a boto3 client
underneath, configured like :func:`~cwtrain.infra.s3.s3_client`); every botocore detail
(request checksums, the zero-copy send path, error parsing) stays inside it::

    from cwtrain.infra.s3 import object_store

    store = object_store()                                    # endpoint and region from the environment
    store.put("weights", "p/a.bin", b"...", metadata={"cwtrain-sha256": digest}, if_none_match=True,
              sha256=digest)                                  # the store verifies the body's SHA-256
    store.head("weights", "p/a.bin")                          # StoredObject(key, size, etag, metadata) or None
    store.head("weights", "p/a.bin", checksum=True).checksum_sha256   # the store's own SHA-256, if it keeps one
    with store.get("weights", "p/a.bin") as body:
        data = body.read()
    [o.key for o in store.list_objects("weights", "p/", delimiter="/")]   # every page

Functions that take ``s3=`` (``upload_snapshot``, ``HotLoader``, ``SnapshotStore``,
``check_snapshot_access``, ...) accept an ``ObjectStore`` or a raw boto3 client, which
they wrap with :func:`~cwtrain.infra.s3.as_object_store`.

**Errors.** A store raises cwtrain's own errors, so callers never inspect SDK
exceptions; the original exception is the ``__cause__``, and the message is the
store's own (for boto3: ``An error occurred (AccessDenied) when calling the PutObject
operation: Access Denied``)::

    ObjectStoreError (CWTrainError)       any failed call; .operation, .key
    ├── ObjectStoreTransportError         no answer: connection refused or cut, timeout, TLS
    │   └── ObjectStoreDeadlineError      no answer before the caller's deadline (see within())
    └── ObjectStoreStatusError            the store answered with an error; .code, .http_status
        ├── ObjectNotFoundError           404, NoSuchKey, NotFound
        │   └── UploadNotFoundError       NoSuchUpload (a multipart upload completed or aborted)
        ├── PreconditionFailedError       412: a create-only write found the key taken
        ├── ConditionalConflictError      409 ConditionalRequestConflict: a concurrent conditional write
        ├── AccessDeniedError             403
        └── StoreNotImplementedError      501 NotImplemented (e.g. no If-None-Match support)

**Deadlines.** :func:`within` gives a view of a store whose every call is bounded by
what a :class:`Deadline` (a :class:`cwtrain.polling.Budget`) has left: a publish's one budget
covers its uploads too. A store that can bound a call in flight does (the boto3 store: each
request's read timeout is at most what is left, no retry starts with under
:data:`MIN_ATTEMPT_SECONDS` left, none after the deadline); any other store is checked
before each call. Past the deadline a call raises :class:`ObjectStoreDeadlineError` at
once, without a request::

    bounded = within(store, budget)
    bounded.put("weights", "p/a.bin", b"...")          # ObjectStoreDeadlineError once budget.remaining is 0

``.code`` is the S3 error code (``"?"`` when the answer had none; a HEAD answer has no
body, so its code is the status, e.g. ``"403"``). :func:`status_error` picks the class
for a code and status; implementations use it so that every store maps alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from cwtrain.closing import Closing
from cwtrain.errors import CWTrainError

__all__ = [
    "AccessDeniedError",
    "Body",
    "BoundableStore",
    "ConditionalConflictError",
    "Deadline",
    "ListedObject",
    "MIN_ATTEMPT_SECONDS",
    "ObjectNotFoundError",
    "ObjectStore",
    "ObjectStoreDeadlineError",
    "ObjectStoreError",
    "ObjectStoreStatusError",
    "ObjectStoreTransportError",
    "ObjectStream",
    "OpenUpload",
    "Payload",
    "PreconditionFailedError",
    "StoreNotImplementedError",
    "StoredObject",
    "UploadNotFoundError",
    "UploadedPart",
    "deadline_passed",
    "status_error",
    "within",
]

#: No retry of a store call starts with less than this many seconds left before its deadline.
MIN_ATTEMPT_SECONDS = 1.0


# ------------------------------------------------------------------------ errors


class ObjectStoreError(CWTrainError):
    """An object-store call failed.

    Attributes:
        operation: the S3 operation (``"PutObject"``, ``"HeadObject"``, ...).
        key: the object key, ``""`` for calls on a bucket or prefix.
    """

    def __init__(self, message: str, *, operation: str = "", key: str = "") -> None:
        super().__init__(message)
        self.operation = operation
        self.key = key


class ObjectStoreTransportError(ObjectStoreError):
    """No answer from the store (refused or cut connection, timeout, TLS), after the client's retries."""


class ObjectStoreDeadlineError(ObjectStoreTransportError):
    """The caller's deadline passed before the store answered (or before the call could start)."""


class ObjectStoreStatusError(ObjectStoreError):
    """The store answered with an error.

    Attributes:
        code: the S3 error code (``"?"`` when the answer had none).
        http_status: the HTTP status, when known.
    """

    def __init__(
        self, message: str, *, code: str = "?", http_status: int | None = None, operation: str = "", key: str = ""
    ) -> None:
        super().__init__(message, operation=operation, key=key)
        self.code = code
        self.http_status = http_status


class ObjectNotFoundError(ObjectStoreStatusError):
    """No such key (404, ``NoSuchKey``, ``NotFound``)."""


class UploadNotFoundError(ObjectNotFoundError):
    """No such multipart upload (``NoSuchUpload``): it was completed or aborted."""


class PreconditionFailedError(ObjectStoreStatusError):
    """412: a create-only write (``If-None-Match: *``) found the key taken."""


class ConditionalConflictError(ObjectStoreStatusError):
    """409 ``ConditionalRequestConflict``: another conditional write to the key is in progress; retry."""


class AccessDeniedError(ObjectStoreStatusError):
    """403: the credentials may not make this call."""


class StoreNotImplementedError(ObjectStoreStatusError):
    """501 ``NotImplemented``: the store does not support the request (e.g. ``If-None-Match``)."""


def status_error(
    message: str, *, code: str = "?", http_status: int | None = None, operation: str = "", key: str = ""
) -> ObjectStoreStatusError:
    """The error for a store's answer: the class is chosen by ``code``, else by ``http_status``.

    The order settles answers that fit two rows: ``NoSuchUpload``; 409 (retried) before 412;
    501; 404; 403.
    """
    cls: type[ObjectStoreStatusError] = ObjectStoreStatusError
    if code == "NoSuchUpload":
        cls = UploadNotFoundError
    elif code == "ConditionalRequestConflict" or http_status == 409:
        cls = ConditionalConflictError
    elif code == "PreconditionFailed" or http_status == 412:
        cls = PreconditionFailedError
    elif code == "NotImplemented" or http_status == 501:
        cls = StoreNotImplementedError
    elif code in ("NoSuchKey", "NotFound", "404") or http_status == 404:
        cls = ObjectNotFoundError
    elif code == "AccessDenied" or http_status == 403:
        cls = AccessDeniedError
    return cls(message, code=code or "?", http_status=http_status, operation=operation, key=key)


# ------------------------------------------------------------------------ values


@dataclass(frozen=True)
class StoredObject:
    """What the store says about one object (HEAD, or the headers of a GET).

    Attributes:
        key: the object key.
        size: bytes.
        etag: the ETag as sent (with its quotes).
        metadata: user metadata, names lowercased and without ``x-amz-meta-``.
        checksum_sha256: the whole object's SHA-256 (hex) as the store recorded and verified
            it (``x-amz-checksum-sha256``), when asked for (``head(..., checksum=True)``) and
            kept; ``None`` otherwise (e.g. multipart objects, whose checksums are per part).
    """

    key: str
    size: int
    etag: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    checksum_sha256: str | None = None


@dataclass(frozen=True)
class ListedObject:
    """One entry of a listing: key, size and ETag (listings carry no user metadata)."""

    key: str
    size: int
    etag: str = ""


@dataclass(frozen=True)
class UploadedPart:
    """One stored part of an unfinished multipart upload."""

    number: int
    etag: str
    size: int


@dataclass(frozen=True)
class OpenUpload:
    """An unfinished multipart upload: key, upload id and when it began (POSIX seconds, 0 if unknown)."""

    key: str
    upload_id: str
    initiated: float


class Payload:
    """A request body over memory views, sent as they are (no copy into a buffer).

    Args:
        views: the bytes, in order (flat ``"B"`` memory views), kept alive and unchanged
            by the caller until the request returns.
    """

    __slots__ = ("size", "views")

    def __init__(self, views: Sequence[memoryview]) -> None:
        self.views = tuple(views)
        self.size = sum(v.nbytes for v in self.views)

    def __len__(self) -> int:
        return self.size


#: A request body: bytes, or a :class:`Payload` over memory the caller keeps alive.
type Body = bytes | Payload


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class ObjectStream(Closing):
    """The body of a GET, read as it arrives; close it when done (or use ``with``).

    Attributes:
        info: the object's key, size, ETag and metadata.
    """

    def __init__(self, info: StoredObject, raw: _Readable) -> None:
        self.info = info
        self._raw = raw

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all that is left when ``size`` is negative)."""
        return self._raw.read(size)

    def close(self) -> None:
        """Release the connection."""
        self._raw.close()


# ------------------------------------------------------------------------ the protocol


@runtime_checkable
class ObjectStore(Protocol):
    """The object-store operations cwtrain uses (S3 semantics: buckets, keys, multipart uploads).

    Every method raises :class:`ObjectStoreError` subclasses only (see the module
    docstring); ``head`` answers ``None`` for a missing key instead of raising.
    """

    def head(self, bucket: str, key: str, *, checksum: bool = False) -> StoredObject | None:
        """The object's size, ETag and metadata (HeadObject), or ``None`` when there is no such key.

        ``checksum`` also asks for the store's whole-object SHA-256 checksum
        (``StoredObject.checksum_sha256``; ``x-amz-checksum-mode: ENABLED``).
        """
        ...

    def get(self, bucket: str, key: str) -> ObjectStream:
        """The object's bytes as a stream (GetObject).

        Raises:
            ObjectNotFoundError: no such key.
        """
        ...

    def put(
        self,
        bucket: str,
        key: str,
        body: Body,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
        if_none_match: bool = False,
        sha256: str | None = None,
    ) -> None:
        """Write one object (PutObject); ``if_none_match`` makes it create-only (``If-None-Match: *``).

        ``sha256`` (hex) is the body's SHA-256, sent as its checksum
        (``x-amz-checksum-sha256``): the store refuses a body that does not match it.

        Raises:
            ObjectStoreStatusError: code ``BadDigest`` (or ``InvalidDigest``), the body does not match ``sha256``.
            PreconditionFailedError: create-only, and the key exists.
            ConditionalConflictError: create-only, and another conditional write is in progress.
            StoreNotImplementedError: the store refuses ``If-None-Match``.
        """
        ...

    def list_objects(
        self, bucket: str, prefix: str, *, delimiter: str | None = None, limit: int | None = None
    ) -> list[ListedObject]:
        """Objects whose keys start with ``prefix`` (ListObjectsV2), every page.

        Args:
            bucket: the bucket.
            prefix: the key prefix (``""`` for the whole bucket).
            delimiter: ``"/"`` lists only the keys directly under ``prefix``.
            limit: at most this many (one request, ``MaxKeys=limit``, when it is enough).
        """
        ...

    def create_multipart(self, bucket: str, key: str, *, metadata: Mapping[str, str] | None = None) -> str:
        """Start a multipart upload (CreateMultipartUpload); returns its upload id.

        User metadata is fixed here, before any part is sent.
        """
        ...

    def upload_part(self, bucket: str, key: str, upload_id: str, number: int, body: Body) -> str:
        """Send part ``number`` (1-based) of an upload (UploadPart); returns its ETag.

        Raises:
            UploadNotFoundError: the upload is gone (completed or aborted elsewhere).
        """
        ...

    def complete_multipart(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]], *, if_none_match: bool = False
    ) -> None:
        """Complete an upload from ``(part number, ETag)`` pairs (CompleteMultipartUpload).

        ``if_none_match`` makes it create-only; the condition is evaluated at completion.

        Raises:
            UploadNotFoundError: the upload is gone.
            PreconditionFailedError: create-only, and the key exists.
            ConditionalConflictError: create-only, and another conditional write is in progress.
            StoreNotImplementedError: the store refuses ``If-None-Match``.
        """
        ...

    def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        """Abort an upload and drop its parts (AbortMultipartUpload)."""
        ...

    def list_parts(self, bucket: str, key: str, upload_id: str) -> list[UploadedPart]:
        """The stored parts of an unfinished upload (ListParts), every page."""
        ...

    def list_multipart_uploads(self, bucket: str, prefix: str) -> list[OpenUpload]:
        """Unfinished multipart uploads under ``prefix`` (ListMultipartUploads), every page."""
        ...

    def download(self, bucket: str, key: str, path: str | os.PathLike[str]) -> None:
        """Copy one object into a local file (parallel ranged GETs for large objects)."""
        ...


# ------------------------------------------------------------------------ deadlines


class Deadline(Protocol):
    """What bounds a store's calls: the seconds left (a :class:`cwtrain.polling.Budget` is one)."""

    @property
    def remaining(self) -> float:
        """Seconds left, never below 0."""
        ...


@runtime_checkable
class BoundableStore(Protocol):
    """A store that bounds a call in flight by a deadline (its :meth:`within` view does)."""

    def within(self, deadline: Deadline) -> ObjectStore:
        """A view of this store (same connections) whose calls end by ``deadline``."""
        ...


def deadline_passed(deadline: Deadline, operation: str = "", key: str = "") -> ObjectStoreDeadlineError:
    """The error of a call that finds its deadline passed."""
    what = f"{operation} {key}".strip() or "an object-store call"
    return ObjectStoreDeadlineError(
        f"{what}: the deadline passed before the object store answered", operation=operation, key=key
    )


def within(store: ObjectStore, deadline: Deadline | None) -> ObjectStore:
    """``store`` with every call bounded by what ``deadline`` has left (``store`` itself when ``None``).

    A :class:`BoundableStore` bounds each call in flight; any other store is checked before
    each call (a call already running may then end later).
    """
    if deadline is None:
        return store
    if isinstance(store, BoundableStore):
        return store.within(deadline)
    return _CheckedStore(store, deadline)


class _CheckedStore:
    """Any store, with its deadline checked before every call."""

    def __init__(self, store: ObjectStore, deadline: Deadline) -> None:
        self.store = store
        self.deadline = deadline

    def _check(self, operation: str, key: str = "") -> None:
        if self.deadline.remaining <= 0:
            raise deadline_passed(self.deadline, operation, key)

    def head(self, bucket: str, key: str, *, checksum: bool = False) -> StoredObject | None:
        self._check("HeadObject", key)
        return self.store.head(bucket, key, checksum=checksum)

    def get(self, bucket: str, key: str) -> ObjectStream:
        self._check("GetObject", key)
        return self.store.get(bucket, key)

    def put(
        self,
        bucket: str,
        key: str,
        body: Body,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
        if_none_match: bool = False,
        sha256: str | None = None,
    ) -> None:
        self._check("PutObject", key)
        self.store.put(
            bucket, key, body, metadata=metadata, content_type=content_type, if_none_match=if_none_match, sha256=sha256
        )

    def list_objects(
        self, bucket: str, prefix: str, *, delimiter: str | None = None, limit: int | None = None
    ) -> list[ListedObject]:
        self._check("ListObjectsV2")
        return self.store.list_objects(bucket, prefix, delimiter=delimiter, limit=limit)

    def create_multipart(self, bucket: str, key: str, *, metadata: Mapping[str, str] | None = None) -> str:
        self._check("CreateMultipartUpload", key)
        return self.store.create_multipart(bucket, key, metadata=metadata)

    def upload_part(self, bucket: str, key: str, upload_id: str, number: int, body: Body) -> str:
        self._check("UploadPart", key)
        return self.store.upload_part(bucket, key, upload_id, number, body)

    def complete_multipart(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]], *, if_none_match: bool = False
    ) -> None:
        self._check("CompleteMultipartUpload", key)
        self.store.complete_multipart(bucket, key, upload_id, parts, if_none_match=if_none_match)

    def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        self._check("AbortMultipartUpload", key)
        self.store.abort_multipart(bucket, key, upload_id)

    def list_parts(self, bucket: str, key: str, upload_id: str) -> list[UploadedPart]:
        self._check("ListParts", key)
        return self.store.list_parts(bucket, key, upload_id)

    def list_multipart_uploads(self, bucket: str, prefix: str) -> list[OpenUpload]:
        self._check("ListMultipartUploads")
        return self.store.list_multipart_uploads(bucket, prefix)

    def download(self, bucket: str, key: str, path: str | os.PathLike[str]) -> None:
        self._check("GetObject", key)
        self.store.download(bucket, key, path)
