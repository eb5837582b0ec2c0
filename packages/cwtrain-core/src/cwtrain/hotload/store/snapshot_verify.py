"""Check a stored snapshot against the hashes it was uploaded with, before it is hot-loaded.

``HotLoader.trigger(..., verify=True)`` and ``cwtrain hotload trigger`` (unless
``--no-verify``) call :func:`verify_stored_snapshot` on the deployment's store::

    from cwtrain.hotload.store.snapshot_verify import verify_stored_snapshot

    checked = verify_stored_snapshot(loader.store, "run1-v000007")
    if checked is None:
        ...                      # no index stored: nothing to check (the service will refuse it)
    else:
        print(checked.objects, checked.bytes, checked.tensors)

It reads every object directly under ``P/<identity>/`` once, as a stream (one chunk in
memory per object), and checks:

- its SHA-256 against its ``cwtrain-sha256`` metadata, which cwtrain's uploader writes on
  every snapshot object; an object without it is refused, since nothing proves its bytes;
- for a FULL snapshot, the Adler-32 of every tensor whose shard ``__metadata__`` records
  one (all of them when the index says ``checksum_format: adler32``) as its bytes pass.

A delta's Adler-32s are of the weights after the delta is applied, so they need the base
and are left to the engine. Any mismatch raises one
:class:`~cwtrain.errors.SnapshotChecksumError` naming every bad object
(``s3://bucket/key``) and tensor. Objects are checked in parallel (``workers``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from cwtrain.errors import SnapshotChecksumError, SnapshotError
from cwtrain.hotload.codec.common import run_parallel
from cwtrain.hotload.format.checksum import adler32
from cwtrain.hotload.format.index import CHECKSUM_FORMAT, INDEX_NAME, index_metadata, is_delta_index, parse_index
from cwtrain.hotload.format.safetensors import SafetensorsHeader, read_header_from
from cwtrain.hotload.store.object_writer import SHA256_METADATA
from cwtrain.infra.objectstore import ObjectStore, ObjectStream


class SnapshotLocation(Protocol):
    """Where a snapshot is stored: an object store, a bucket, and each identity's prefix (a ``SnapshotLocation``)."""

    @property
    def s3(self) -> ObjectStore:
        """The object store."""
        ...

    @property
    def bucket(self) -> str:
        """The bucket."""
        ...

    def prefix(self, identity: str) -> str:
        """The key prefix of ``identity``'s objects."""
        ...

    def uri(self, identity: str) -> str:
        """``s3://<bucket>/<prefix>/<identity>/``."""
        ...


__all__ = ["SnapshotLocation", "StoredSnapshotCheck", "verify_stored_snapshot"]

_CHUNK = 1 << 20
_MAX_REPORTED = 8


@dataclass(frozen=True)
class StoredSnapshotCheck:
    """What :func:`verify_stored_snapshot` checked.

    Attributes:
        uri: ``s3://<bucket>/<P>/<identity>/``.
        objects: objects whose SHA-256 matched their metadata.
        bytes: their total size.
        tensors: tensors whose Adler-32 matched (FULL snapshots only).
    """

    uri: str
    objects: int
    bytes: int
    tensors: int


class _HashingReader:
    """Reads an object stream exactly, hashing every byte that passes."""

    def __init__(self, stream: ObjectStream) -> None:
        self.stream = stream
        self.sha256 = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        parts: list[bytes] = []
        want = size
        while want != 0:
            part = self.stream.read(_CHUNK if want < 0 else min(want, _CHUNK))
            if not part:
                break
            parts.append(part)
            if want > 0:
                want -= len(part)
        data = b"".join(parts)
        self.sha256.update(data)
        self.size += len(data)
        return data


def _checksums(header: SafetensorsHeader, where: str, *, required: bool) -> dict[str, int]:
    expected: dict[str, int] = {}
    metadata = header.metadata or {}
    for name in header.tensors:
        text = metadata.get(name)
        if text is None:
            if required:
                raise SnapshotChecksumError(f"{where}: tensor {name!r} has no Adler-32 in the shard __metadata__")
            continue
        if len(text) != 8 or any(c not in "0123456789abcdef" for c in text):
            raise SnapshotChecksumError(f"{where}: tensor {name!r} has checksum {text!r}, not 8 lowercase hex digits")
        expected[name] = int(text, 16)
    return expected


def _check_tensors(reader: _HashingReader, where: str, size: int, required: bool) -> tuple[list[str], int]:
    """Read a FULL shard through ``reader`` and check each tensor's Adler-32; ``(problems, tensors checked)``."""
    header = read_header_from(reader, source=where, file_size=size)  # type: ignore[arg-type]
    expected = _checksums(header, where, required=required)
    problems: list[str] = []
    for entry in sorted(header.tensors.values(), key=lambda t: t.begin):
        value, left = 1, entry.nbytes
        while left:
            chunk = reader.read(min(left, _CHUNK))
            if not chunk:
                raise SnapshotChecksumError(f"{where}: the object ends inside tensor {entry.name!r}")
            value = adler32(chunk, value)
            left -= len(chunk)
        want = expected.get(entry.name)
        if want is not None and value != want:
            problems.append(f"{where}: tensor {entry.name!r} Adler-32 is {value:08x}, its header says {want:08x}")
    return problems, len(expected)


def _check_object(store: SnapshotLocation, key: str, adler: bool | None) -> tuple[list[str], int, int, bytes | None]:
    """One object: ``(problems, bytes, tensors checked, its bytes when it is the index)``.

    ``adler``: ``None`` checks no tensors; ``False``/``True`` checks the Adler-32s a FULL
    shard records (``True``: every tensor must have one).
    """
    where = f"s3://{store.bucket}/{key}"
    with store.s3.get(store.bucket, key) as stream:
        recorded = {k.lower(): v for k, v in stream.info.metadata.items()}.get(SHA256_METADATA)
        if recorded is None:
            return [f"{where} has no {SHA256_METADATA} metadata, so nothing proves its bytes"], 0, 0, None
        reader = _HashingReader(stream)
        problems: list[str] = []
        tensors = 0
        keep = key.endswith("/" + INDEX_NAME)
        kept = reader.read() if keep else None
        if adler is not None:
            try:
                problems, tensors = _check_tensors(reader, where, stream.info.size, adler)
            except SnapshotError as exc:  # a bad header or a short object: reported with the SHA-256 below
                problems = [str(exc)]
        while reader.read(_CHUNK):
            pass
    actual = reader.sha256.hexdigest()
    if actual != recorded.strip().lower():
        problems.insert(
            0, f"{where}: SHA-256 of the stored bytes is {actual}, its {SHA256_METADATA} metadata says {recorded[:64]}"
        )
    return problems, reader.size, tensors, kept


def verify_stored_snapshot(store: SnapshotLocation, identity: str, *, workers: int = 8) -> StoredSnapshotCheck | None:
    """Check every stored object of ``identity`` against its recorded SHA-256 (and FULL Adler-32s).

    Args:
        store: the deployment's snapshot store (``HotLoader.store``).
        identity: the snapshot identity.
        workers: objects read in parallel.

    Returns:
        What was checked, or ``None`` when no index of ``identity`` is stored (nothing to
        check: the hot-load will be refused as missing).

    Raises:
        SnapshotChecksumError: an object's bytes differ from its recorded SHA-256, an object
            has no recorded SHA-256, or a FULL tensor's Adler-32 does not match; the message
            names each (``s3://bucket/key``, tensor) and how to skip the check.
        SnapshotError: the index is not valid JSON, or it names a shard that is not stored.
        ObjectStoreError: the store could not be read.
    """
    prefix = store.prefix(identity)
    index_key = f"{prefix}/{INDEX_NAME}"
    if store.s3.head(store.bucket, index_key) is None:
        return None
    problems, size, _, raw = _check_object(store, index_key, None)
    if raw is None or problems:
        raise _failed(store, identity, problems)
    index = parse_index(raw, source=f"s3://{store.bucket}/{index_key}")
    listed = {o.key: o for o in store.s3.list_objects(store.bucket, prefix + "/", delimiter="/")}
    shards = set(index["weight_map"].values())
    missing = sorted(name for name in shards if f"{prefix}/{name}" not in listed)
    if missing:
        raise SnapshotError(
            f"{store.uri(identity)}: the index names shards that are not stored: {', '.join(missing[:_MAX_REPORTED])}"
        )
    full = not is_delta_index(index)
    required = str(index_metadata(index).get("checksum_format", "")).lower().replace("-", "") == CHECKSUM_FORMAT
    jobs: dict[str, bool | None] = {
        key: (required if full and key.rsplit("/", 1)[-1] in shards else None) for key in listed if key != index_key
    }
    results = run_parallel(
        lambda item: _check_object(store, item[0], item[1]), list(jobs.items()), workers, name="cwtrain-verify"
    )
    for found, nbytes, _, _ in results:
        problems.extend(found)
        size += nbytes
    if problems:
        raise _failed(store, identity, problems)
    return StoredSnapshotCheck(
        uri=store.uri(identity), objects=len(results) + 1, bytes=size, tensors=sum(r[2] for r in results)
    )


def _failed(store: SnapshotLocation, identity: str, problems: list[str]) -> SnapshotChecksumError:
    shown = "; ".join(problems[:_MAX_REPORTED]) + (
        f"; and {len(problems) - _MAX_REPORTED} more" if len(problems) > _MAX_REPORTED else ""
    )
    return SnapshotChecksumError(
        f"snapshot {identity!r} at {store.uri(identity)} is not what was uploaded: {shown}. Publish the weights again "
        "under a new identity (identities are immutable); --no-verify (verify=False) triggers it unchecked"
    )
