"""The bytes of one snapshot object: read once into buffers, hashed, and sent from those buffers.

An :class:`ObjectSource` is one object's bytes: the encoder's buffers
(:meth:`ObjectSource.from_buffers`: memory the caller hands over and leaves alone) or a
file on disk (:meth:`ObjectSource.from_path`: read with ``pread``, never memory-mapped).
The writer (:mod:`cwtrain.hotload.store.object_writer`) opens a :class:`Reading` of it for each write
and takes the request bodies from it::

    pool = BufferPool(1 << 30)                       # at most 1 GiB of read buffers
    source = ObjectSource.from_path("ckpt/model-00001-of-00002.safetensors")
    with source.reading(part_size=64 << 20, pool=pool) as reading:
        metadata = {"cwtrain-sha256": reading.sha256}     # of exactly the bytes below
        for offset in range(0, source.size, 64 << 20):     # in order
            body = reading.part(offset, min(64 << 20, source.size - offset))
            store.upload_part(bucket, key, upload_id, offset // (64 << 20) + 1, body)
            reading.done(body)
        reading.check()                                   # right before CompleteMultipartUpload
    source.close()

**Hash what is sent.** Multipart metadata is fixed at CreateMultipartUpload, so a file's
SHA-256 must be known before its first part goes out. A file that fits the pool
(``size <= pool.limit``, the upload's memory budget) is read once, part by part into
buffers, each 8 MiB piece hashed right after it is read, and its parts are sent from those
same buffers: the bytes hashed are the bytes sent, by construction. A larger file is read
twice: a hash pass (one small buffer), then each part is read again into a buffer, hashed
again in order and sent from that buffer; :meth:`Reading.check` compares the second digest
with the first before the object is completed, so bytes that differ from the ones hashed
are never completed into an object. (Memory-mapping the file would spare the copy, but a
mapping shows whatever the file holds at the moment of each access, and a file truncated
under it kills the process with ``SIGBUS``.)

**Files that change.** A file source remembers its size, ``mtime``, ``ctime``, inode and
device when it is opened. A read that comes back short (the file shrank), a digest that
differs between the two passes, or a different ``fstat``/``stat`` signature at
:meth:`Reading.check` or :meth:`ObjectSource.verify_unchanged` raises
:class:`~cwtrain.errors.SnapshotError` naming the file. Write a checkpoint completely
before publishing it, and leave it alone until the publish returns.

**Cost** (client CPU, 2-core VM, ``bench/upload.py``): the SHA-256 (about 0.56 CPU-s/GB
with SHA-NI), one copy out of the page cache (``pread``, about 0.13), and the send of the
buffers; files larger than the pool pay a second read and a second SHA-256. Buffers are
reused across parts, files and uploads (:mod:`cwtrain.hotload.store.object_buffers`), so a publish
after the first faults in no new pages.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cwtrain.closing import Closing
from cwtrain.errors import SnapshotError
from cwtrain.hotload.format.fileio import pread_into
from cwtrain.hotload.store.object_buffers import BufferPool, release_read_buffers
from cwtrain.infra.objectstore import Payload

__all__ = ["BufferPool", "ObjectSource", "Reading", "release_read_buffers"]  # the pool re-exported from buffers

#: Bytes read (and hashed) per ``pread``: large enough to keep syscalls rare, small enough
#: to hash each piece while it is still in the CPU cache.
READ_CHUNK = 8 << 20


# ------------------------------------------------------------------------ sources


class ObjectSource:
    """One object's bytes: flat memory views (the base class), or a file (:meth:`from_path`).

    Build one with :meth:`from_buffers` or :meth:`from_path`.

    Attributes:
        name: the object's file name.
        size: bytes.
        in_memory: whether the bytes are caller memory (counted against an upload's
            in-flight budget) rather than a file read into pool buffers.
    """

    in_memory = True

    def __init__(self, name: str, views: Sequence[memoryview] = ()) -> None:
        self.name = name
        self.views = tuple(views)
        self.size = sum(v.nbytes for v in self.views)
        self._sha256: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_buffers(cls, name: str, buffers: Sequence[Any]) -> ObjectSource:
        """A source over in-memory buffers (bytes-like objects), concatenated in order.

        The buffers are hashed and sent as they are: leave them unchanged until the upload returns.
        """
        views = []
        for buffer in buffers:
            view = memoryview(buffer)
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")
            if view.nbytes:
                views.append(view)
        return cls(name, views)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], name: str | None = None) -> ObjectSource:
        """A source over a regular file, opened now (its signature is taken now) and read with ``pread``.

        Raises:
            SnapshotError: not a regular file.
            OSError: it cannot be opened.
        """
        return FileSource(path, name)

    def sha256(self) -> str:
        """SHA-256 of the bytes, 64 lowercase hex digits (computed once; hashlib drops the GIL)."""
        with self._lock:
            if self._sha256 is None:
                digest = hashlib.sha256()
                for view in self.views:
                    for start in range(0, view.nbytes, READ_CHUNK):
                        digest.update(view[start : start + READ_CHUNK])
                self._sha256 = digest.hexdigest()
            return self._sha256

    def slice(self, offset: int, length: int) -> tuple[memoryview, ...]:
        """The views covering ``[offset, offset + length)``, without copying."""
        return _slice(self.views, offset, length)

    def md5_hex(self, offset: int, length: int) -> str:
        """MD5 of a byte range (to compare with a part's ETag)."""
        digest = hashlib.md5(usedforsecurity=False)
        for view in self.slice(offset, length):
            digest.update(view)
        return digest.hexdigest()

    def reading(self, *, part_size: int, pool: BufferPool, cancelled: threading.Event | None = None) -> Reading:
        """Open the bytes for one write: its SHA-256 and its request bodies (see :class:`Reading`)."""
        return _MemoryReading(self)

    def verify_unchanged(self) -> None:
        """Raise :class:`~cwtrain.errors.SnapshotError` if a file source changed since it was opened."""

    def close(self) -> None:
        """Release what the source holds (a file's descriptor)."""


def _slice(views: Sequence[memoryview], offset: int, length: int) -> tuple[memoryview, ...]:
    out: list[memoryview] = []
    position = 0
    end = offset + length
    for view in views:
        lo, hi = position, position + view.nbytes
        position = hi
        if hi <= offset:
            continue
        if lo >= end:
            break
        out.append(view[max(offset, lo) - lo : min(end, hi) - lo])
    return tuple(out)


def _signature(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


class FileSource(ObjectSource):
    """A regular file, read with ``pread`` (never mapped); see the module docstring."""

    in_memory = False

    def __init__(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        self.path = Path(path)
        super().__init__(name or self.path.name)
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SnapshotError(f"{self.path}: not a regular file")
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        self._signature = _signature(st)
        self.size = st.st_size
        if hasattr(os, "posix_fadvise") and self.size:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)

    def __repr__(self) -> str:
        return f"FileSource({str(self.path)!r})"

    # ---------------------------------------------------------------- reading

    def _descriptor(self) -> int:
        if self._fd is None:
            raise SnapshotError(f"{self.path}: the file was already closed")
        return self._fd

    def read_into(self, view: memoryview, offset: int) -> None:
        """Fill ``view`` with the bytes at ``offset`` (``pread``; a short read means the file shrank).

        Raises:
            SnapshotError: the file ended early, or could not be read.
        """
        fd = self._descriptor()
        try:
            pread_into(fd, view, offset, source=str(self.path))
        except OSError as exc:
            raise SnapshotError(f"{self.path}: cannot read at offset {offset}: {exc}") from exc
        except SnapshotError:
            raise self._changed(
                f"it ended at byte {os.fstat(fd).st_size} of the {self.size} it had when opened"
            ) from None

    def _changed(self, what: str) -> SnapshotError:
        return SnapshotError(
            f"{self.path}: the file changed while it was being published ({what}); the snapshot index is "
            "not written. Write a checkpoint completely before publishing it and leave it unchanged until "
            "the publish returns, then publish it again"
        )

    def verify_unchanged(self) -> None:
        """Compare the file's ``fstat`` and ``stat`` (size, mtime, ctime, inode) with those at open.

        Raises:
            SnapshotError: it changed, was replaced, or is gone.
        """
        current: list[tuple[int, int, int, int, int]] = []
        try:
            current.append(_signature(os.stat(self.path)))  # first: a replaced file is named as such
            if self._fd is not None:
                current.append(_signature(os.fstat(self._fd)))
        except OSError as exc:
            raise self._changed(f"it can no longer be read: {exc.strerror or exc}") from exc
        for now in current:
            if now != self._signature:
                size, _, _, inode, device = self._signature
                if (now[3], now[4]) != (inode, device):
                    what = "it was replaced by another file"
                elif now[0] != size:
                    what = f"size {size} -> {now[0]} bytes"
                else:
                    what = "it was modified: mtime/ctime changed"
                raise self._changed(what)

    def sha256(self) -> str:
        """SHA-256 of the file: one ``pread`` pass (8 MiB at a time), then a check that it did not change."""
        with self._lock:
            if self._sha256 is None:
                digest = hashlib.sha256()
                scratch = memoryview(bytearray(min(READ_CHUNK, max(1, self.size))))
                for offset in range(0, self.size, READ_CHUNK):
                    piece = scratch[: min(READ_CHUNK, self.size - offset)]
                    self.read_into(piece, offset)
                    digest.update(piece)
                self.verify_unchanged()
                self._sha256 = digest.hexdigest()
            return self._sha256

    def record_sha256(self, digest: str) -> None:
        """Remember the SHA-256 a reading computed; a different earlier one means the file changed.

        Raises:
            SnapshotError: an earlier pass found another SHA-256.
        """
        with self._lock:
            if self._sha256 is not None and self._sha256 != digest:
                raise self._changed("its SHA-256 differs between two reads")
            self._sha256 = digest

    def slice(self, offset: int, length: int) -> tuple[memoryview, ...]:
        """A copy of ``[offset, offset + length)`` (read now; for ETag comparisons)."""
        data = memoryview(bytearray(length))
        self.read_into(data, offset)
        return (data,)

    def md5_hex(self, offset: int, length: int) -> str:
        """MD5 of a byte range, read in 8 MiB pieces."""
        digest = hashlib.md5(usedforsecurity=False)
        scratch = memoryview(bytearray(min(READ_CHUNK, max(1, length))))
        for start in range(offset, offset + length, READ_CHUNK):
            piece = scratch[: min(READ_CHUNK, offset + length - start)]
            self.read_into(piece, start)
            digest.update(piece)
        return digest.hexdigest()

    def reading(self, *, part_size: int, pool: BufferPool, cancelled: threading.Event | None = None) -> Reading:
        """Read the file once into pool buffers when it fits the pool, else prepare a verified re-read."""
        if self.size <= pool.limit:
            return _KeptReading(self, part_size, pool, cancelled)
        return _RereadReading(self, pool, cancelled)

    def close(self) -> None:
        """Close the descriptor (:meth:`verify_unchanged` still compares the path's ``stat``)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


# ------------------------------------------------------------------------ readings


class Reading(Closing):
    """The bytes of one write of a source: their SHA-256 and request bodies over them.

    Get one from :meth:`ObjectSource.reading`; use it as a context manager (closing returns
    every buffer to the pool).

    Attributes:
        sha256: SHA-256 of the bytes the bodies carry (hex).
    """

    sha256: str

    def part(self, offset: int, length: int) -> Payload:
        """The request body for ``[offset, offset + length)``.

        A file larger than the pool is re-read here: call it for consecutive ranges from
        offset 0 (every part, including ones that need not be sent), and :meth:`restart`
        before starting over.
        """
        raise NotImplementedError

    def done(self, body: Payload) -> None:
        """The store confirmed (or will never need) ``body``: its buffer may go back to the pool."""

    def md5_hex(self, offset: int, length: int) -> str:
        """MD5 of a byte range of the bytes being written (to compare with a part's ETag)."""
        raise NotImplementedError

    def restart(self) -> None:
        """Start over: :meth:`part` may be called again from offset 0."""

    def check(self) -> None:
        """Right before the write is made final: the bytes sent are the bytes hashed, the file unchanged.

        Raises:
            SnapshotError: they are not (nothing must be completed then).
        """

    def close(self) -> None:
        """Return every buffer to the pool."""


class _MemoryReading(Reading):
    """Caller memory: the views themselves, hashed once."""

    def __init__(self, source: ObjectSource) -> None:
        self._source = source
        self.sha256 = source.sha256()

    def part(self, offset: int, length: int) -> Payload:
        return Payload(self._source.slice(offset, length))

    def md5_hex(self, offset: int, length: int) -> str:
        return self._source.md5_hex(offset, length)


class _KeptReading(Reading):
    """A file that fits the pool: read once, part by part, into buffers that the parts are sent from."""

    def __init__(self, source: FileSource, part_size: int, pool: BufferPool, cancelled: threading.Event | None) -> None:
        self._source = source
        self._pool = pool
        self._cancelled = cancelled
        self._parts: dict[int, memoryview] = {}
        self._parts_lock = threading.Lock()  # done() runs on the threads that sent the parts
        self._handed_back = False
        self._fallback: _RereadReading | None = None
        step = max(1, part_size)
        offsets = range(0, source.size, step)
        digest = hashlib.sha256()
        try:
            buffers = pool.take_all([min(step, source.size - offset) for offset in offsets], cancelled)
            self._parts = dict(zip(offsets, buffers, strict=True))
            for offset, buffer in self._parts.items():
                for start in range(0, buffer.nbytes, READ_CHUNK):
                    piece = buffer[start : start + READ_CHUNK]
                    source.read_into(piece, offset + start)
                    digest.update(piece)
            source.verify_unchanged()
            self.sha256 = digest.hexdigest()
            source.record_sha256(self.sha256)
        except BaseException:
            self.close()
            raise

    def part(self, offset: int, length: int) -> Payload:
        if self._fallback is not None:
            return self._fallback.part(offset, length)
        if length == 0:
            return Payload(())
        buffer = self._parts.get(offset)
        if buffer is None or buffer.nbytes != length:
            raise SnapshotError(f"{self._source.path}: no part buffer for bytes {offset}..{offset + length}")
        return Payload((buffer,))

    def done(self, body: Payload) -> None:
        if self._fallback is not None:
            self._fallback.done(body)
            return
        with self._parts_lock:
            found = next((o for o, b in self._parts.items() if body.views and body.views[0] is b), None)
            buffer = self._parts.pop(found) if found is not None else None
            self._handed_back = self._handed_back or buffer is not None
        if buffer is not None:
            self._pool.give(buffer)

    def md5_hex(self, offset: int, length: int) -> str:
        with self._parts_lock:
            buffer = self._parts.get(offset)
        if buffer is not None and buffer.nbytes == length:
            digest = hashlib.md5(usedforsecurity=False)
            digest.update(buffer)
            return digest.hexdigest()
        return self._source.md5_hex(offset, length)

    def restart(self) -> None:
        """Parts already handed back are gone: from now on the file is re-read and verified."""
        if self._fallback is not None:
            self._fallback.restart()
            return
        if not self._handed_back:
            return  # every buffer is still here
        self._release()
        self._fallback = _RereadReading(self._source, self._pool, self._cancelled, expected=self.sha256)

    def check(self) -> None:
        if self._fallback is not None:
            self._fallback.check()
        else:
            self._source.verify_unchanged()

    def _release(self) -> None:
        with self._parts_lock:
            parts, self._parts = self._parts, {}
        for buffer in parts.values():
            self._pool.give(buffer)

    def close(self) -> None:
        self._release()
        if self._fallback is not None:
            self._fallback.close()


class _RereadReading(Reading):
    """A file larger than the pool: hashed first, then re-read part by part and hashed again in order."""

    def __init__(
        self,
        source: FileSource,
        pool: BufferPool,
        cancelled: threading.Event | None,
        *,
        expected: str | None = None,
    ) -> None:
        self._source = source
        self._pool = pool
        self._cancelled = cancelled
        self.sha256 = expected or source.sha256()
        self._out: list[memoryview] = []
        self._lock = threading.Lock()
        self.restart()

    def restart(self) -> None:
        self._digest = hashlib.sha256()
        self._next = 0

    def part(self, offset: int, length: int) -> Payload:
        if length == 0 and offset == self._next:
            return Payload(())
        if offset != self._next:
            raise SnapshotError(
                f"{self._source.path}: parts of a file larger than the memory budget are read in order "
                f"(expected offset {self._next}, got {offset})"
            )
        buffer = self._pool.take(length, self._cancelled)
        try:
            for start in range(0, length, READ_CHUNK):
                piece = buffer[start : start + READ_CHUNK]
                self._source.read_into(piece, offset + start)
                self._digest.update(piece)
        except BaseException:
            self._pool.give(buffer)
            raise
        self._next = offset + length
        with self._lock:
            self._out.append(buffer)
        return Payload((buffer,))

    def done(self, body: Payload) -> None:
        with self._lock:
            for index, buffer in enumerate(self._out):
                if body.views and body.views[0] is buffer:
                    del self._out[index]
                    break
            else:
                return
        self._pool.give(buffer)

    def md5_hex(self, offset: int, length: int) -> str:
        return self._source.md5_hex(offset, length)

    def check(self) -> None:
        if self._next != self._source.size:
            raise SnapshotError(f"{self._source.path}: {self._next} of {self._source.size} bytes were read")
        if self._digest.hexdigest() != self.sha256:
            raise self._source._changed("its SHA-256 differs between the hash pass and the bytes sent")
        self._source.verify_unchanged()

    def close(self) -> None:
        with self._lock:
            out, self._out = self._out, []
        for buffer in out:
            self._pool.give(buffer)
