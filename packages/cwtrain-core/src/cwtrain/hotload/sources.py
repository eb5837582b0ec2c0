"""The bytes of a snapshot object, and request bodies that send them without copies.

An :class:`ObjectSource` is one file's bytes as flat, read-only memory views: the
encoder's buffers (``SnapshotFile.buffers``), or a read-only ``mmap`` of a file on disk,
so that the page cache is the buffer. Its SHA-256 is one pass over those views.

:class:`Payload` is a request body over a slice of those views. botocore sees a
file-like object (it validates and measures it); :func:`install_zero_copy` registers a
``before-send`` hook that hands urllib3 the views themselves, which go to ``sendall``
as they are, instead of being copied out in 16 KiB reads. Over plain HTTP (loopback,
the LOTA cache) a body over a mapped file goes out as a
:class:`~cwtrain.infra.s3.FileRange` instead, which the client's connections send with
``sendfile`` straight from the page cache (HTTPS keeps ``sendall`` of the views). Clients
that wrap bodies (SDK checksums in an ``aws-chunked`` trailer) read the payload through
``read`` and work unchanged, only slower.

**Why map files instead of reading them.** Multipart metadata is fixed at
CreateMultipartUpload, so a file's SHA-256 must be known before its first part goes out.
Reading parts into buffers would force either a hash pre-pass that reads the file twice
(two copies out of the page cache) or holding the whole file in memory. With a read-only
mapping the hash pass reads each page once, the parts are sent from the same pages, and
no part buffer exists at all. Measured with ``bench/upload.py`` (256 MiB, moto on
loopback, 2-core VM, one run; see the commit log for the figures of each change): the
SHA-256 pass is about 0.7 CPU-s/GB of the total (OpenSSL with SHA-NI, ~1.4 GB/s on one
core: the floor); the loopback send is charged to the sender (the receiver's TCP work
runs in its context), ``sendfile`` at least saves the copy out of user memory; botocore
costs about 4 ms of CPU a request (the test server closes every connection). No request
carries Content-MD5 or an SDK checksum, and bodies go out as ``UNSIGNED-PAYLOAD``.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cwtrain.infra.s3 import FileRange

__all__ = ["ObjectSource", "Payload", "install_zero_copy"]

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
        """A request body for ``[offset, offset + length)`` (no copy; ``sendfile`` where it can)."""
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


class Payload:
    """A request body over memory views: file-like for botocore, sent as the views themselves.

    botocore validates and measures it as a file (``read``/``seek``/``tell``/``len``); the
    ``before-send`` hook of :func:`install_zero_copy` swaps it for :class:`_Chunks` so that
    urllib3 passes each view to ``sendall`` instead of copying 16 KiB reads.
    """

    def __init__(self, views: Sequence[memoryview], *, file: tuple[int, int] | None = None) -> None:
        self.views = tuple(views)
        self._size = sum(v.nbytes for v in self.views)
        self._pos = 0
        #: ``(fd, offset)`` when the views are that file's bytes from ``offset`` on.
        self.file = file

    def __len__(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, min(self._size, base + offset))
        return self._pos

    def read(self, amt: int | None = -1) -> bytes:
        """Copy out up to ``amt`` bytes (used only by checksum or signing wrappers)."""
        end = self._size if amt is None or amt < 0 else min(self._size, self._pos + amt)
        pieces = []
        position = 0
        for view in self.views:
            lo, hi = position, position + view.nbytes
            position = hi
            if hi <= self._pos or lo >= end:
                continue
            pieces.append(view[max(self._pos, lo) - lo : min(end, hi) - lo].tobytes())
        self._pos = end
        return b"".join(pieces)


class _Chunks:
    """What urllib3 sends: an iterable of chunks (``seek`` so botocore can rewind on retry)."""

    def __init__(self, chunks: tuple[memoryview | FileRange, ...]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[memoryview | FileRange]:
        return iter(self._chunks)

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0


def _swap_body(request: Any, **_: Any) -> None:
    body = getattr(request, "body", None)
    if isinstance(body, Payload):
        from cwtrain.infra.s3 import FileRange  # loaded already, by install_zero_copy

        url = str(getattr(request, "url", ""))
        if body.file is not None and body.views and url.startswith("http://"):
            fd, offset = body.file
            request.body = _Chunks((FileRange(fd, offset, body.views),))
        else:
            request.body = _Chunks(body.views)


def install_zero_copy(s3: Any) -> None:
    """Let ``s3`` send :class:`Payload` bodies without copying (idempotent).

    Over plain HTTP, a body over a mapped file goes out with ``sendfile`` on the
    connections ``s3`` opens after :func:`cwtrain.infra.s3.install_sendfile` (which
    :func:`~cwtrain.infra.s3_client` calls before the first request).
    """
    from cwtrain.infra.s3 import install_sendfile

    events = s3.meta.events
    for operation in ("PutObject", "UploadPart"):
        events.register(f"before-send.s3.{operation}", _swap_body, unique_id=f"cwtrain-zero-copy-{operation}")
    install_sendfile(s3)
