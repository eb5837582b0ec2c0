"""Writing one snapshot object: create-only, resumable, with its SHA-256 in user metadata.

This is the object layer under :mod:`cwtrain.hotload.store.snapshot_upload` (which plans a whole
snapshot). It follows spec ``snapshot-format.md`` section 7 for a single key:

* **Hash what is sent.** The bytes come from an :class:`ObjectSource` (the encoder's
  buffers, or a file read with ``pread``, never memory-mapped). A file is read once into
  buffers from a :class:`~cwtrain.hotload.store.object_buffers.BufferPool`, hashed as it is read, and
  its request bodies are those same buffers; a file larger than the pool is hashed first
  and re-read part by part with a second, in-order SHA-256 that must equal the first
  before CompleteMultipartUpload (see :mod:`cwtrain.hotload.store.object_source`). A file that shrinks,
  changes size, ``mtime`` or ``ctime``, or is replaced while it is read or sent raises
  :class:`~cwtrain.errors.SnapshotError` and its multipart upload is aborted. A single
  PutObject carries ``x-amz-checksum-sha256`` (the same digest as ``cwtrain-sha256``, so
  the store verifies the body at no extra cost); a store that refuses a body's checksum
  (``BadDigest``) raises :class:`~cwtrain.errors.SnapshotChecksumError`. After every
  write a HEAD checks the stored size, ``cwtrain-sha256`` and, where the store reports
  one, its SHA-256 checksum against what was hashed.
* **Create-only.** ``PutObject`` up to the part size, else a multipart upload with
  parallel parts; the condition ``If-None-Match: *`` goes on PutObject and on
  CompleteMultipartUpload. Store answers: 412 -> HEAD and compare ``cwtrain-sha256``
  (equal: already uploaded; else :class:`~cwtrain.errors.SnapshotConflictError`); 409
  ``ConditionalRequestConflict`` -> retried 3 times with backoff, then as 412; 501
  ``NotImplemented`` -> HEAD, then an unconditional write when absent, with one warning
  per process.
* **Resume, only of an upload made for these bytes.** The ``cwtrain-sha256`` of a
  multipart upload is fixed when it is created and cannot be read back before it is
  completed, so completing another writer's upload would store our bytes under its record
  (or its bytes under ours). Every multipart upload therefore carries a *marker part*: part
  :data:`MARKER_PART` (10,000; data uses parts 1..9,999) holds ``cwtrain-sha256 <hex>``,
  sent right after the upload is created. An unfinished upload of the same key (listed by
  the caller with ListMultipartUploads) is continued only when ListParts shows its marker
  with the local SHA-256 (the part's ETag is the MD5 of the marker) and every data part
  matches the local bytes (ETag = MD5 of the part, sizes per the same part plan); only
  missing parts are sent. CompleteMultipartUpload names the data parts only, so the store
  drops the marker. After completion a HEAD checks the recorded ``cwtrain-sha256`` and that
  the object's ETag is the one of exactly those parts; a mismatch raises
  :class:`~cwtrain.errors.SnapshotChecksumError`.
* **An object already stored is checked, not trusted.** Its ``cwtrain-sha256`` must be the
  local one, and its bytes must be the ones that digest names: the store's own SHA-256
  checksum where it keeps one (a single PutObject), else its ETag against the local bytes
  (the MD5 of a single part, or of the parts' MD5s under this writer's part plan or the
  SDK's 8 MiB one), else it is read back and hashed. An object whose bytes are not its
  record raises :class:`~cwtrain.errors.SnapshotChecksumError` naming it.
* **Abort.** A multipart upload that fails or is cancelled in this process is aborted, and
  once a key is stored (by this writer or found stored) every other unfinished upload of
  it that was listed is aborted too: none of them can ever complete (the key is
  create-once), and a publisher killed mid-upload would otherwise leave it behind.
  Nothing is ever deleted or overwritten.

Every request goes through an :class:`~cwtrain.infra.objectstore.ObjectStore`; the store
answers above arrive as its errors (``PreconditionFailedError``,
``ConditionalConflictError``, ``StoreNotImplementedError``, ``UploadNotFoundError``)::

    with ThreadPoolExecutor(8) as parts:
        writer = ObjectWriter(store, "weights", "run1-v000007", part_size=64 << 20, part_pool=parts)
        writer.write("hotload/run1-v000007/config.json", ObjectSource.from_path("ckpt/config.json"))
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from cwtrain.errors import ConfigError, SnapshotChecksumError, SnapshotConflictError, SnapshotError
from cwtrain.hotload.store.object_buffers import BufferPool
from cwtrain.hotload.store.object_source import ObjectSource, Reading
from cwtrain.infra.objectstore import (
    ConditionalConflictError,
    ObjectStore,
    ObjectStoreDeadlineError,
    ObjectStoreStatusError,
    OpenUpload,
    Payload,
    PreconditionFailedError,
    StoreNotImplementedError,
    UploadNotFoundError,
)
from cwtrain.infra.s3 import ObjectStoreLike, as_object_store

__all__ = [
    "DEFAULT_PART_SIZE",
    "ETAG_PART_SIZE",
    "MARKER_PART",
    "MAX_PARTS",
    "MIN_PART_SIZE",
    "SHA256_METADATA",
    "ObjectSource",
    "ObjectWriter",
    "RemoteObject",
    "head_object",
    "part_size_for",
]

log = logging.getLogger(__name__)

#: Default multipart part size (64 MiB).
DEFAULT_PART_SIZE = 64 << 20
#: Smallest part size the store recommends (50 MB); only the last part may be smaller.
MIN_PART_SIZE = 50_000_000
#: Most parts one multipart upload may have.
MAX_PARTS = 10_000
#: The part number of an upload's marker (its SHA-256, never completed); data parts come before it.
MARKER_PART = MAX_PARTS
#: User-metadata name of the object's SHA-256 (``x-amz-meta-cwtrain-sha256``).
SHA256_METADATA = "cwtrain-sha256"
#: Part size of the SDK's managed transfers, used to check multipart ETags.
ETAG_PART_SIZE = 8 << 20
#: Read buffers of a writer built without a pool (an upload passes its memory budget instead).
DEFAULT_READ_BUFFERS = 1 << 30

_MIB = 1 << 20
_CONFLICT_RETRIES = 3

_conditional_lock = threading.Lock()
_conditional_unsupported = False


def part_size_for(size: int, part_size: int = DEFAULT_PART_SIZE) -> int:
    """The part size for an object of ``size`` bytes: ``part_size``, or more for huge objects.

    Objects that would need more than ``MAX_PARTS - 1`` parts (the last number is the
    marker's, :data:`MARKER_PART`) get ``ceil(size / 9999)`` rounded up to a whole MiB.
    """
    needed = -(-size // (MAX_PARTS - 1))
    needed = -(-needed // _MIB) * _MIB
    return max(part_size, needed)


def check_part_size(part_size: int) -> int:
    """Refuse part sizes below :data:`MIN_PART_SIZE` (the store's advice) or above 5 GiB."""
    if part_size < MIN_PART_SIZE or part_size > (5 << 30):
        raise ConfigError(
            f"part size {part_size} is out of range: use at least {MIN_PART_SIZE} bytes (50 MB) and at most 5 GiB"
        )
    return part_size


# ------------------------------------------------------------------------ remote


@dataclass(frozen=True)
class RemoteObject:
    """What HEAD says about a stored object."""

    key: str
    size: int
    etag: str
    sha256: str | None

    def matches(self, source: ObjectSource) -> bool:
        """Whether the stored object holds ``source``'s bytes (spec section 7)."""
        if self.sha256:
            return self.sha256.lower() == source.sha256()
        return self.size == source.size and etag_matches(source, self.etag)


def etag_matches(source: ObjectSource, etag: str) -> bool:
    """Whether an ETag (no ``cwtrain-sha256``) proves the object equals ``source``.

    Single-part: MD5 hex of the content. Multipart ``<hex>-<P>``: MD5 of the concatenated
    MD5 digests of 8 MiB parts, checkable only when 8 MiB parts give exactly ``P`` parts.
    """
    etag = etag.strip('"').lower()
    if "-" not in etag:
        return etag == source.md5_hex(0, source.size)
    hex_part, _, count = etag.partition("-")
    if not count.isdigit() or -(-source.size // ETAG_PART_SIZE) != int(count):
        return False
    digest = hashlib.md5(usedforsecurity=False)
    for offset in range(0, source.size, ETAG_PART_SIZE):
        digest.update(bytes.fromhex(source.md5_hex(offset, min(ETAG_PART_SIZE, source.size - offset))))
    return digest.hexdigest() == hex_part


def marker_bytes(sha256: str) -> bytes:
    """The body of a multipart upload's marker part: the SHA-256 its object will record."""
    return f"{SHA256_METADATA} {sha256}\n".encode()


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _hex_etag(etag: str) -> str:
    return etag.strip('"').lower()


def _composite_etag(part_etags: Sequence[str]) -> str | None:
    """The ETag S3 gives an object completed from parts with these ETags (``None`` if they are not MD5s)."""
    digest = hashlib.md5(usedforsecurity=False)
    for etag in part_etags:
        text = _hex_etag(etag)
        if len(text) != 32 or any(c not in "0123456789abcdef" for c in text):
            return None
        digest.update(bytes.fromhex(text))
    return f"{digest.hexdigest()}-{len(part_etags)}"


def _plan_etag(source: ObjectSource, part_size: int, etag: str) -> bool:
    """Whether a multipart ``etag`` is the one of ``source`` sent in parts of this writer's plan."""
    step = part_size_for(source.size, part_size)
    _, _, count = _hex_etag(etag).partition("-")
    if not count.isdigit() or int(count) != -(-source.size // step) or int(count) < 2:
        return False
    offsets = range(0, source.size, step)
    parts = [source.md5_hex(offset, min(step, source.size - offset)) for offset in offsets]
    return _composite_etag(parts) == _hex_etag(etag)


def head_object(s3: ObjectStore, bucket: str, key: str) -> RemoteObject | None:
    """HEAD ``key``: a :class:`RemoteObject`, or ``None`` when it does not exist."""
    stored = s3.head(bucket, key)
    if stored is None:
        return None
    return RemoteObject(key=key, size=stored.size, etag=stored.etag, sha256=stored.metadata.get(SHA256_METADATA))


def _warn_unconditional() -> None:
    global _conditional_unsupported
    with _conditional_lock:
        if _conditional_unsupported:
            return
        _conditional_unsupported = True
    log.warning(
        "the object store refuses If-None-Match (501 NotImplemented): falling back to check-then-write, "
        "which cannot stop two publishers racing on one identity"
    )


#: Store error codes for a request body whose checksum or digest did not match.
DIGEST_MISMATCH_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch", "InvalidChecksum"})


def _refused_digest(exc: ObjectStoreStatusError, key: str) -> SnapshotChecksumError | None:
    """The error for a store that refused a body's checksum (nothing was stored), else ``None``."""
    if exc.code not in DIGEST_MISMATCH_CODES:
        return None
    return SnapshotChecksumError(
        f"{key}: the store received other bytes than the ones hashed ({exc.code}: the request's checksum did "
        "not match its body) and stored nothing; the snapshot index is not written. Publish again"
    )


def conditional_writes_supported() -> bool:
    """False once a store answered 501 to a conditional write in this process."""
    return not _conditional_unsupported


# ------------------------------------------------------------------------ writer


class _Progress:
    """Bytes reported for one object, so that its total is reported exactly once."""

    def __init__(self, report: Callable[[int], None]) -> None:
        self._report = report
        self._lock = threading.Lock()
        self.sent = 0

    def __call__(self, nbytes: int) -> None:
        with self._lock:
            nbytes = max(0, nbytes)
            self.sent += nbytes
        self._report(nbytes)

    def finish(self, size: int) -> None:
        """Report what was not reported yet (an object found already stored)."""
        with self._lock:
            rest = max(0, size - self.sent)
            self.sent += rest
        if rest:
            self._report(rest)


class ObjectWriter:
    """Writes objects create-only under one snapshot identity (one key at a time per call).

    Args:
        s3: the object store (a boto3 client is wrapped, see :func:`~cwtrain.infra.s3.as_object_store`).
        bucket: the bucket.
        identity: the snapshot identity (named by conflicts).
        part_size: multipart part size (see :func:`part_size_for`).
        part_pool: the executor that sends parts (shared by all objects).
        on_bytes: called with the byte count of every part or object the store confirmed.
        open_uploads: unfinished multipart uploads by key, candidates for resuming.
        cancelled: set to make running uploads stop (and abort) at the next part.
        buffers: where files are read into (default: a pool of :data:`DEFAULT_READ_BUFFERS` bytes).
    """

    def __init__(
        self,
        s3: ObjectStoreLike,
        bucket: str,
        identity: str,
        *,
        part_size: int,
        part_pool: ThreadPoolExecutor,
        on_bytes: Callable[[int], None] | None = None,
        open_uploads: Mapping[str, Sequence[OpenUpload]] | None = None,
        cancelled: threading.Event | None = None,
        buffers: BufferPool | None = None,
    ) -> None:
        self.s3 = as_object_store(s3)
        self.bucket = bucket
        self.identity = identity
        self.part_size = part_size
        self._pool = part_pool
        self._on_bytes = on_bytes or (lambda n: None)
        self._open = dict(open_uploads or {})
        self._cancelled = cancelled or threading.Event()
        self.buffers = buffers if buffers is not None else BufferPool(DEFAULT_READ_BUFFERS)

    # ---------------------------------------------------------------- entry point

    def write(self, key: str, source: ObjectSource) -> str:
        """Write ``source`` at ``key``: ``"uploaded"``, or ``"existing"`` when it was already there.

        The bytes are read once into buffers (see :mod:`cwtrain.hotload.store.object_source`), hashed,
        and sent from those buffers; a stored object is then checked with a HEAD.

        Raises:
            SnapshotConflictError: the key holds different bytes.
            SnapshotChecksumError: the store refused or recorded other bytes than the ones
                hashed, or a resumed upload completed with a different recorded SHA-256.
            SnapshotError: a file changed while it was read or sent (nothing is completed then).
        """
        self._check_cancelled()
        step = part_size_for(source.size, self.part_size)
        progress = _Progress(self._on_bytes)
        with source.reading(part_size=step, pool=self.buffers, cancelled=self._cancelled) as reading:
            metadata = {SHA256_METADATA: reading.sha256}
            if source.size <= step:
                outcome = self._put(key, source, reading, metadata, progress)
            else:
                outcome = self._multipart(key, source, reading, metadata, progress)
        if outcome == "uploaded":
            self._verify_stored(key, source, reading.sha256)
        progress.finish(source.size)
        return outcome

    # ----------------------------------------------------------------- helpers

    def _check_cancelled(self) -> None:
        if self._cancelled.is_set():
            raise SnapshotError(f"upload of snapshot {self.identity!r} was cancelled")

    def _existing(self, key: str, source: ObjectSource) -> str | None:
        """After a refused create: ``"existing"`` when equal, ``None`` when absent; else conflict."""
        remote = head_object(self.s3, self.bucket, key)
        if remote is None:
            return None
        if remote.matches(source):
            self.check_existing(key, source)
            self.drop_stale(key)
            return "existing"
        recorded = remote.sha256 or f"no {SHA256_METADATA}, ETag {remote.etag}"
        raise SnapshotConflictError(
            self.identity, [f"{source.name} (stored {recorded}, local sha256 {source.sha256()})"]
        )

    def check_existing(self, key: str, source: ObjectSource) -> None:
        """An object found stored with ``source``'s SHA-256 as its record: are its bytes that record?

        The store's whole-object SHA-256 checksum decides where it keeps one; else its ETag
        against the local bytes (one part's MD5, or the MD5 of the parts' MD5s under this
        writer's part plan or the SDK's 8 MiB one); else the object is read back and hashed.

        Raises:
            SnapshotChecksumError: the stored bytes are not the ones its ``cwtrain-sha256`` names.
        """
        stored = self.s3.head(self.bucket, key, checksum=True)
        if stored is None:
            raise SnapshotChecksumError(f"{key}: the stored object vanished while it was being checked")
        sha256 = source.sha256()
        if stored.size != source.size:
            self._not_its_record(key, f"{stored.size} bytes stored, {source.size} local")
        if stored.checksum_sha256 is not None:
            if stored.checksum_sha256 != sha256:
                self._not_its_record(key, f"the store's SHA-256 checksum is {stored.checksum_sha256}")
            return
        if etag_matches(source, stored.etag) or _plan_etag(source, self.part_size, stored.etag):
            return
        digest = hashlib.sha256()
        with self.s3.get(self.bucket, key) as body:
            while chunk := body.read(8 << 20):
                digest.update(chunk)
        log.info("%s: checked by reading it back (its ETag %s proves nothing about the local bytes)", key, stored.etag)
        if digest.hexdigest() != sha256:
            self._not_its_record(key, f"its bytes hash to {digest.hexdigest()}")

    def _not_its_record(self, key: str, why: str) -> None:
        raise SnapshotChecksumError(
            f"{key}: the stored object records {SHA256_METADATA} of the local file, but {why}: its bytes are "
            f"not what its record says (an earlier writer stored them under identity {self.identity!r}); the "
            "snapshot index is not written. Publish under a new identity"
        )

    def drop_stale(self, key: str, keep: str = "") -> None:
        """Abort every listed unfinished upload of ``key`` (but ``keep``): the key is stored, none can complete."""
        for upload in self._open.pop(key, ()):
            if upload.upload_id != keep:
                log.info("%s: aborting unfinished multipart upload %s (the key is stored)", key, upload.upload_id)
                self._abort(key, upload.upload_id, quiet=True)

    def _answer(self, exc: ObjectStoreStatusError, key: str, source: ObjectSource, attempt: int) -> str:
        """The store-answer table: ``"retry"``, ``"existing"``, or raise."""
        if isinstance(exc, ConditionalConflictError) and attempt < _CONFLICT_RETRIES:
            time.sleep(0.1 * (2**attempt) * (1 + random.random()))
            return "retry"
        if isinstance(exc, (ConditionalConflictError, PreconditionFailedError)):  # 409 three times counts as 412
            found = self._existing(key, source)
            if found is None:
                raise exc  # refused, yet absent: let the caller see the store's answer
            return found
        if isinstance(exc, StoreNotImplementedError):
            _warn_unconditional()
            return "retry"
        refused = _refused_digest(exc, key)
        if refused is not None:
            raise refused from exc
        raise exc

    def _verify_stored(self, key: str, source: ObjectSource, sha256: str) -> None:
        """HEAD the object just written: its size, ``cwtrain-sha256`` and store checksum are what was hashed."""
        stored = self.s3.head(self.bucket, key, checksum=True)
        problems = []
        if stored is None:
            problems.append("it is absent")
        else:
            recorded = stored.metadata.get(SHA256_METADATA, "").lower()
            if stored.size != source.size:
                problems.append(f"{stored.size} bytes stored, {source.size} hashed")
            if recorded != sha256:
                problems.append(f"recorded {SHA256_METADATA} {recorded or 'absent'}, hashed {sha256}")
            if stored.checksum_sha256 is not None and stored.checksum_sha256 != sha256:
                problems.append(f"the store's SHA-256 checksum is {stored.checksum_sha256}, hashed {sha256}")
        if problems:
            raise SnapshotChecksumError(
                f"{key}: the stored object is not the bytes that were hashed ({'; '.join(problems)}); the "
                f"snapshot index is not written. An earlier attempt or another writer stored other bytes under "
                f"identity {self.identity!r}: publish under a new identity"
            )

    # ---------------------------------------------------------------- PutObject

    def _put(
        self, key: str, source: ObjectSource, reading: Reading, metadata: dict[str, str], progress: _Progress
    ) -> str:
        body = reading.part(0, source.size)
        try:
            outcome = self._write_once(
                key,
                source,
                reading,
                lambda conditional: self.s3.put(
                    self.bucket, key, body, metadata=metadata, if_none_match=conditional, sha256=reading.sha256
                ),
            )
        finally:
            reading.done(body)
        if outcome == "uploaded":
            progress(source.size)
        return outcome

    def _write_once(self, key: str, source: ObjectSource, reading: Reading, write: Callable[[bool], None]) -> str:
        """The write that creates ``key`` (a PutObject or a CompleteMultipartUpload), through the store-answer table.

        ``write(conditional)`` sends it, create-only when the store honours ``If-None-Match``; where it
        does not, an object already there is compared first. ``"uploaded"``, or what :meth:`_answer`
        or :meth:`_existing` found.
        """
        attempt = 0
        while True:
            self._check_cancelled()
            conditional = conditional_writes_supported()
            if not conditional:
                found = self._existing(key, source)
                if found is not None:
                    return found
            reading.check()  # the bytes sent are the bytes hashed, and the file did not change
            try:
                write(conditional)
            except ObjectStoreStatusError as exc:
                outcome = self._answer(exc, key, source, attempt)
                attempt += 1
                if outcome == "retry":
                    continue
                return outcome
            return "uploaded"

    # ---------------------------------------------------------------- multipart

    def _plan(self, size: int) -> list[tuple[int, int, int]]:
        step = part_size_for(size, self.part_size)
        return [(i + 1, offset, min(step, size - offset)) for i, offset in enumerate(range(0, size, step))]

    def _resume(self, key: str, reading: Reading, plan: list[tuple[int, int, int]]) -> tuple[str, dict[int, str]]:
        """An open upload of ``key`` made for these bytes (its marker) whose data parts all match them, if any."""
        by_number = {number: (offset, length) for number, offset, length in plan}
        marker = marker_bytes(reading.sha256)
        for upload in sorted(self._open.get(key, ()), key=lambda u: u.initiated, reverse=True):
            try:
                parts = self.s3.list_parts(self.bucket, key, upload.upload_id)
            except ObjectStoreStatusError as exc:
                log.debug("cannot list parts of upload %s of %s (%s); not resuming it", upload.upload_id, key, exc)
                continue
            ours = any(
                p.number == MARKER_PART and p.size == len(marker) and _hex_etag(p.etag) == _md5(marker) for p in parts
            )
            if not ours:
                log.debug(
                    "upload %s of %s was not made for sha256 %s; not resuming it", upload.upload_id, key, reading.sha256
                )
                continue
            done: dict[int, str] = {}
            for part in parts:
                if part.number == MARKER_PART:
                    continue
                where = by_number.get(part.number)
                if where is None or where[1] != part.size or reading.md5_hex(*where) != _hex_etag(part.etag):
                    done = {}
                    break
                done[part.number] = part.etag
            else:
                log.info("%s: resuming multipart upload (%d of %d parts already stored)", key, len(done), len(plan))
                return upload.upload_id, done
        return "", {}

    def _send_part(self, key: str, upload_id: str, number: int, body: Payload, progress: _Progress) -> str:
        self._check_cancelled()
        try:
            etag = self.s3.upload_part(self.bucket, key, upload_id, number, body)
        except ObjectStoreStatusError as exc:
            refused = _refused_digest(exc, key)
            if refused is None:
                raise
            raise refused from exc
        progress(len(body))
        return etag

    def _abort(self, key: str, upload_id: str, *, quiet: bool = False) -> None:
        try:
            self.s3.abort_multipart(self.bucket, key, upload_id)
        except ObjectStoreDeadlineError:
            log.info(
                "%s: multipart upload %s left unfinished (the deadline passed): publishing identity %r again resumes it",
                key,
                upload_id,
                self.identity,
            )
        except Exception as exc:  # best effort: the original error matters more
            (log.debug if quiet else log.warning)("could not abort multipart upload %s of %s: %s", upload_id, key, exc)

    def _multipart(
        self,
        key: str,
        source: ObjectSource,
        reading: Reading,
        metadata: dict[str, str],
        progress: _Progress,
        *,
        restarted: bool = False,
    ) -> str:
        plan = self._plan(source.size)
        upload_id, done = self._resume(key, reading, plan)
        resumed = bool(upload_id)
        if not conditional_writes_supported():
            found = self._existing(key, source)
            if found is not None:
                return found
        if not upload_id:
            upload_id = self.s3.create_multipart(self.bucket, key, metadata=metadata)
        else:
            progress(sum(length for number, _, length in plan if number in done))
        etags: dict[int, str] = {}
        try:
            outcome = "" if resumed else self._send_marker(key, source, upload_id, reading.sha256)
            if not outcome:
                outcome = self._send_and_complete(key, source, reading, plan, upload_id, done, progress, etags)
        except BaseException:
            self._abort(key, upload_id)
            raise
        if outcome == "restart":  # the upload vanished under us and the key is still absent
            self._abort(key, upload_id, quiet=True)  # normally gone already
            if restarted:
                raise SnapshotError(f"{key}: the store dropped the multipart upload twice (NoSuchUpload); try again")
            self._open.pop(key, None)
            reading.restart()
            return self._multipart(key, source, reading, metadata, progress, restarted=True)
        if outcome == "uploaded":
            self.drop_stale(key, keep=upload_id)
        if outcome == "uploaded" and resumed:
            self._check_resumed(key, reading.sha256, [etags[number] for number, _, _ in plan])
        return outcome

    def _send_marker(self, key: str, source: ObjectSource, upload_id: str, sha256: str) -> str:
        """Part :data:`MARKER_PART` of a new upload: a resume may continue it only with these bytes.

        ``""``, or what :meth:`_after_lost_upload` says when the upload is already gone.
        """
        try:
            self.s3.upload_part(self.bucket, key, upload_id, MARKER_PART, marker_bytes(sha256))
        except UploadNotFoundError:
            return self._after_lost_upload(key, source)
        return ""

    def _check_resumed(self, key: str, sha256: str, part_etags: Sequence[str]) -> None:
        """A resumed upload, completed: its record is the local SHA-256, its ETag the one of the parts named."""
        stored = self.s3.head(self.bucket, key)
        problems = []
        if stored is None:
            problems.append("it is absent")
        else:
            recorded = stored.metadata.get(SHA256_METADATA, "").lower()
            if recorded != sha256:
                problems.append(f"its recorded {SHA256_METADATA} is {recorded or 'absent'}, the local one {sha256}")
            expected = _composite_etag(part_etags)
            if expected is not None and "-" in stored.etag and _hex_etag(stored.etag) != expected:
                problems.append(
                    f"its ETag {stored.etag} is not the one of the parts it was completed from ({expected})"
                )
        if problems:
            raise SnapshotChecksumError(
                f"{key}: the resumed multipart upload completed, but {'; '.join(problems)}; an earlier attempt "
                f"uploaded other bytes under identity {self.identity!r}: publish under a new identity"
            )

    def _send_parts(
        self,
        key: str,
        reading: Reading,
        plan: list[tuple[int, int, int]],
        upload_id: str,
        done: dict[int, str],
        progress: _Progress,
    ) -> dict[int, Future[str]]:
        """Submit every part not stored yet, in order (reading each as its turn comes); wait for all."""
        futures: dict[int, Future[str]] = {}
        try:
            for number, offset, length in plan:
                if any(f.done() and not f.cancelled() and f.exception() is not None for f in futures.values()):
                    break  # a part failed: read no further
                self._check_cancelled()
                body = reading.part(offset, length)  # every part, in order: a re-read file is verified whole
                if number in done:
                    reading.done(body)
                    continue
                future = self._pool.submit(self._send_part, key, upload_id, number, body, progress)
                future.add_done_callback(lambda _, body=body: reading.done(body))  # type: ignore[misc]
                futures[number] = future
        except BaseException:
            for future in futures.values():
                future.cancel()
            wait(futures.values())
            raise
        finished, _ = wait(futures.values(), return_when=FIRST_EXCEPTION)
        if any(f.exception() is not None for f in finished if not f.cancelled()):
            for future in futures.values():
                future.cancel()
            wait(futures.values())
        return futures

    def _send_and_complete(
        self,
        key: str,
        source: ObjectSource,
        reading: Reading,
        plan: list[tuple[int, int, int]],
        upload_id: str,
        done: dict[int, str],
        progress: _Progress,
        etags: dict[int, str],
    ) -> str:
        """Send the missing parts and complete; ``etags`` gets every part's ETag (for the check after a resume)."""
        futures = self._send_parts(key, reading, plan, upload_id, done, progress)
        failures = [f.exception() for f in futures.values() if f.done() and not f.cancelled() and f.exception()]
        if any(isinstance(error, UploadNotFoundError) for error in failures):
            return self._after_lost_upload(key, source)
        if failures:
            raise failures[0]  # type: ignore[misc]
        etags.update(done)
        etags.update({number: future.result() for number, future in futures.items()})
        parts = [(number, etags[number]) for number, _, _ in plan]
        try:
            outcome = self._write_once(  # raising: the caller aborts
                key,
                source,
                reading,
                lambda conditional: self.s3.complete_multipart(
                    self.bucket, key, upload_id, parts, if_none_match=conditional
                ),
            )
        except UploadNotFoundError:
            return self._after_lost_upload(key, source)
        if outcome != "uploaded":
            self._abort(key, upload_id, quiet=True)  # the key holds these bytes already (checked by _existing)
        return outcome

    def _after_lost_upload(self, key: str, source: ObjectSource) -> str:
        """The upload vanished (completed or aborted by another publisher): compare or restart."""
        found = self._existing(key, source)
        return "restart" if found is None else found
