"""How boto3 sends cwtrain's request bodies without copies (used by :mod:`cwtrain.infra.s3` only).

:class:`~cwtrain.infra.s3.Boto3ObjectStore` does this for every client it wraps::

    install_zero_copy(client)          # once per client (idempotent); s3_client() already ran install_sendfile
    client.upload_part(..., Body=request_body(payload))

A :class:`~cwtrain.infra.objectstore.Payload` is memory views: the encoder's buffers, or
the buffers a file was read into and hashed in (:mod:`cwtrain.hotload.sources`).
:func:`request_body` hands it to botocore as a :class:`_BodyFile`, a file-like object
botocore validates and measures; the ``before-send`` hook that :func:`install_zero_copy`
registers then swaps it for the views themselves, which urllib3 passes to ``sendall`` as
they are instead of copying 16 KiB reads. Bodies that the SDK wraps (an ``aws-chunked``
checksum trailer, when one is asked for) are read through ``read`` and work unchanged,
only slower.

**sendfile, from the hashed bytes only.** Over plain HTTP (a loopback store, the LOTA
cache) a payload that is also the bytes of a file (``Payload.file``: cwtrain's read
buffers are ``memfd`` files, see :mod:`cwtrain.hotload.buffers`) goes out as a
:class:`_FileRange`, which the connections of a client prepared by
:func:`install_sendfile` send with ``sendfile``: no copy into the socket (about 0.2
CPU-s/GB on loopback). The file is the buffer the bytes were read into and hashed in,
never the user's checkpoint file: a file rewritten between the hash and the send would
otherwise be published under a SHA-256 it does not have. A ``sendfile`` that ends short
raises ``OSError`` (the connection is dropped) rather than leaving the store waiting for
the rest of the body. HTTPS keeps ``sendall`` of the views; a connection opened before
the client was prepared iterates the range's views.

**Measured** with ``bench/upload.py`` (moto on loopback, 2-core VM; figures in the commit
log): per published GB, the SHA-256 is about 0.56-0.62 CPU-s (OpenSSL with SHA-NI: the
floor), the ``pread`` into reused buffers about 0.1, the copy into the socket about 0.2
(spared by ``sendfile``); botocore costs about 4 ms of CPU a request. Bodies go out as
``UNSIGNED-PAYLOAD``; a single PutObject carries the ``x-amz-checksum-sha256`` cwtrain
already computed (no second pass).

Everything here leans on botocore internals (the ``before-send`` event, its urllib3
connection-pool classes); nothing outside :mod:`cwtrain.infra.s3` imports it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Protocol

from cwtrain.infra.objectstore import Body, Payload

__all__ = ["S3Client", "install_sendfile", "install_zero_copy", "request_body"]


class S3Client(Protocol):
    """A boto3 S3 client, as cwtrain's signatures name it (boto3 itself ships no types).

    Re-exported by :mod:`cwtrain.infra.s3`, where the ``s3=`` parameters get it from.
    """

    @property
    def meta(self) -> Any: ...

    def head_object(self, **kwargs: Any) -> Any: ...


def request_body(body: Body) -> Any:
    """What botocore is given: bytes as they are, a payload as a file-like :class:`_BodyFile`."""
    return _BodyFile(body) if isinstance(body, Payload) else body


class _BodyFile:
    """A :class:`Payload` as the file botocore validates and measures (``read``/``seek``/``tell``/``len``).

    The ``before-send`` hook of :func:`install_zero_copy` swaps it for :class:`_Chunks`
    so that urllib3 sends the views (or a file range) instead of copying 16 KiB reads.
    """

    def __init__(self, payload: Payload) -> None:
        self.payload = payload
        self._size = payload.size
        self._pos = 0

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
        for view in self.payload.views:
            lo, hi = position, position + view.nbytes
            position = hi
            if hi <= self._pos or lo >= end:
                continue
            pieces.append(view[max(self._pos, lo) - lo : min(end, hi) - lo].tobytes())
        self._pos = end
        return b"".join(pieces)


class _FileRange:
    """A request-body chunk that is ``views`` = the bytes of file ``fd`` from ``offset`` on.

    Plain-HTTP connections of a client prepared by :func:`install_sendfile` send it with
    ``sendfile``; any other connection iterates it and sends the views.
    """

    def __init__(self, fd: int, offset: int, views: tuple[memoryview, ...]) -> None:
        self.fd = fd
        self.offset = offset
        self.views = views
        self.count = sum(v.nbytes for v in views)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[memoryview]:
        return iter(self.views)


class _Chunks:
    """What urllib3 sends: an iterable of chunks (``seek`` so botocore can rewind on retry)."""

    def __init__(self, chunks: tuple[memoryview | _FileRange, ...]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[memoryview | _FileRange]:
        return iter(self._chunks)

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0


def _swap_body(request: Any, **_: Any) -> None:
    body = getattr(request, "body", None)
    if isinstance(body, _BodyFile):
        payload = body.payload
        url = str(getattr(request, "url", ""))
        if payload.file is not None and payload.views and url.startswith("http://"):
            fd, offset = payload.file
            request.body = _Chunks((_FileRange(fd, offset, payload.views),))
        else:
            request.body = _Chunks(payload.views)


def install_zero_copy(client: S3Client) -> None:
    """Let ``client`` send :class:`_BodyFile` bodies without copying (idempotent).

    A no-op for an object without botocore's event system (it then sends bodies through ``read``).
    """
    events = getattr(getattr(client, "meta", None), "events", None)
    if events is None:
        return
    for operation in ("PutObject", "UploadPart"):
        events.register(f"before-send.s3.{operation}", _swap_body, unique_id=f"cwtrain-zero-copy-{operation}")
    install_sendfile(client)


class _RangeFile:
    """A file object for ``socket.sendfile`` over a shared descriptor (``pread``: no shared offset)."""

    mode = "rb"

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pos = 0

    def fileno(self) -> int:
        return self._fd

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos
        return pos

    def read(self, amt: int) -> bytes:
        """Used by ``socket.sendfile`` only where ``os.sendfile`` cannot be."""
        data = os.pread(self._fd, amt, self._pos)
        self._pos += len(data)
        return data


_sendfile_pool: Any = None


def _sendfile_pool_class() -> Any:
    """botocore's plain-HTTP connection pool, with connections that ``sendfile`` a :class:`_FileRange`."""
    global _sendfile_pool
    if _sendfile_pool is None:
        from botocore.awsrequest import AWSHTTPConnection, AWSHTTPConnectionPool

        class SendfileConnection(AWSHTTPConnection):  # type: ignore[misc]
            def send(self, data: Any) -> Any:
                if not isinstance(data, _FileRange) or self.sock is None:
                    return super().send(data)
                if self._response_received:  # the store answered before the body (Expect: 100-continue)
                    return None
                sent = self.sock.sendfile(_RangeFile(data.fd), data.offset, data.count)
                if sent != data.count:  # never leave the store waiting for the rest of the body
                    raise OSError(f"sendfile sent {sent} of {data.count} bytes")
                return None

        class SendfilePool(AWSHTTPConnectionPool):  # type: ignore[misc]
            ConnectionCls = SendfileConnection

        _sendfile_pool = SendfilePool
    return _sendfile_pool


def install_sendfile(client: S3Client) -> None:
    """Let the plain-HTTP connections ``client`` opens from now on send :class:`_FileRange` chunks with ``sendfile``.

    Idempotent; a no-op for a client whose HTTP session is not botocore's urllib3 one.
    """
    from botocore.awsrequest import AWSHTTPConnectionPool

    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    classes = getattr(session, "_pool_classes_by_scheme", None)
    if isinstance(classes, dict) and classes.get("http") is AWSHTTPConnectionPool:
        classes["http"] = _sendfile_pool_class()
