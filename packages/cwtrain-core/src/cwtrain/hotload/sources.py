"""The bytes of a snapshot object, as memory views that go to the store without copies.

An :class:`ObjectSource` is one file's bytes as flat, read-only memory views: the
encoder's buffers (``SnapshotFile.buffers``), or a read-only ``mmap`` of a file on disk,
so that the page cache is the buffer::

    source = ObjectSource.from_path("ckpt/model-00001-of-00002.safetensors")
    source.sha256()                        # one pass over the mapped pages
    store.upload_part(bucket, key, upload_id, 1, source.payload(0, 64 << 20))
    source.close()

Its SHA-256 is one pass over those views; :meth:`ObjectSource.payload` gives request
bodies (:class:`~cwtrain.infra.objectstore.Payload`) over slices of the same views, which
the store sends as they are (and, over plain HTTP, a mapped file's range with
``sendfile``: see :mod:`cwtrain.infra.s3_send`).

**Why map files instead of reading them.** Multipart metadata is fixed at
CreateMultipartUpload, so a file's SHA-256 must be known before its first part goes out.
Reading parts into buffers would force either a hash pre-pass that reads the file twice
(two copies out of the page cache) or holding the whole file in memory. With a read-only
mapping the hash pass reads each page once, the parts are sent from the same pages, and
no part buffer exists at all.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cwtrain.infra.objectstore import Payload

__all__ = ["ObjectSource"]

_HASH_CHUNK = 16 << 20


class ObjectSource:
    """The bytes of one object as flat, read-only memory views (nothing is copied).

    Build one with :meth:`from_path` (a read-only ``mmap``: the page cache is the buffer;
    the file must not change while it uploads) or :meth:`from_buffers`.
    """

    def __init__(
        self,
        name: str,
        views: Sequence[memoryview],
        *,
        closer: Callable[[], None] | None = None,
        fd: int | None = None,
    ) -> None:
        self.name = name
        self.views = tuple(views)
        self.size = sum(v.nbytes for v in self.views)
        self._closer = closer
        #: A descriptor of the mapped file (one view, file offset 0), for ``sendfile``.
        self.fd = fd if len(self.views) == 1 else None
        #: Whether the bytes are a file mapping (page cache) rather than caller memory.
        self.mapped = closer is not None
        self._sha256: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_buffers(cls, name: str, buffers: Sequence[Any]) -> ObjectSource:
        """A source over in-memory buffers (bytes-like objects), concatenated in order."""
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
        """A source over a file on disk, memory-mapped read-only."""
        path = Path(path)
        handle = path.open("rb")  # kept open for sendfile; closed by close() (or when collected)
        try:
            size = os.fstat(handle.fileno()).st_size
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except BaseException:
            handle.close()
            raise
        if mapped is None:
            handle.close()
            return cls(name or path.name, ())
        if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
            mapped.madvise(mmap.MADV_SEQUENTIAL)
        view = memoryview(mapped)

        def close() -> None:
            handle.close()
            view.release()
            try:
                mapped.close()
            except BufferError:  # a request still holds a slice; the map goes when it does
                pass

        return cls(name or path.name, (view,), closer=close, fd=handle.fileno())

    def sha256(self) -> str:
        """SHA-256 of the bytes, 64 lowercase hex digits (computed once; hashlib drops the GIL)."""
        with self._lock:
            if self._sha256 is None:
                digest = hashlib.sha256()
                for view in self.views:
                    for start in range(0, view.nbytes, _HASH_CHUNK):
                        digest.update(view[start : start + _HASH_CHUNK])
                self._sha256 = digest.hexdigest()
            return self._sha256

    def slice(self, offset: int, length: int) -> tuple[memoryview, ...]:
        """The views covering ``[offset, offset + length)``, without copying."""
        out: list[memoryview] = []
        position = 0
        end = offset + length
        for view in self.views:
            lo, hi = position, position + view.nbytes
            position = hi
            if hi <= offset:
                continue
            if lo >= end:
                break
            out.append(view[max(offset, lo) - lo : min(end, hi) - lo])
        return tuple(out)

    def payload(self, offset: int, length: int) -> Payload:
        """A request body for ``[offset, offset + length)`` (no copy; a file range where the bytes are mapped)."""
        return Payload(self.slice(offset, length), file=None if self.fd is None else (self.fd, offset))

    def md5_hex(self, offset: int, length: int) -> str:
        """MD5 of a byte range (to compare with a part's ETag)."""
        digest = hashlib.md5(usedforsecurity=False)
        for view in self.slice(offset, length):
            digest.update(view)
        return digest.hexdigest()

    def close(self) -> None:
        """Release the mapping, if any."""
        closer, self._closer = self._closer, None
        if closer is not None:
            closer()
