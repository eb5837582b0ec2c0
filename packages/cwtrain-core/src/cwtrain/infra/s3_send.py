"""How boto3 sends cwtrain's request bodies without copies (used by :mod:`cwtrain.infra.s3` only).

:class:`~cwtrain.infra.s3.Boto3ObjectStore` does this for every client it wraps::

    install_zero_copy(client)          # once per client (idempotent)
    client.upload_part(..., Body=request_body(payload))

A :class:`~cwtrain.infra.objectstore.Payload` is memory views: the encoder's buffers, or
the buffers a file was read into and hashed from (:mod:`cwtrain.hotload.publish.sources`).
:func:`request_body` hands it to botocore as a :class:`_BodyFile`, a file-like object
botocore validates and measures; the ``before-send`` hook that :func:`install_zero_copy`
registers then swaps it for the views themselves, which urllib3 passes to ``sendall`` as
they are instead of copying 16 KiB reads. Bodies that the SDK wraps (an ``aws-chunked``
checksum trailer, when one is asked for) are read through ``read`` and work unchanged,
only slower.

**Why not ``sendfile``.** Sending a file's range with ``sendfile`` would spare the copy
into the socket, but the kernel then sends whatever the page cache holds at that moment,
which is not necessarily what was hashed: a file rewritten in place between the hash and
the send would be published under a SHA-256 it does not have. Every body is therefore
memory the hash was computed over. (Reading into ``memfd`` buffers and sending those with
``sendfile`` keeps the guarantee, but measured on loopback it cost more, not less: 1.23
against 1.13 CPU-s/GB.)

**Measured** with ``bench/upload.py`` (moto on loopback; figures in the commit log): the
SHA-256 pass is about 0.56 CPU-s/GB (OpenSSL with SHA-NI: the floor), the ``pread`` copy
about 0.13, the loopback send of the buffers about 0.15-0.2; botocore costs about 4 ms of
CPU a request. Bodies go out as ``UNSIGNED-PAYLOAD``; a single PutObject carries the
``x-amz-checksum-sha256`` that cwtrain already computed (no second pass).

Everything here leans on botocore internals (the ``before-send`` event); nothing outside
:mod:`cwtrain.infra.s3` imports it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from cwtrain.infra.objectstore import Body, Payload

__all__ = ["S3Client", "install_zero_copy", "request_body"]


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
    so that urllib3 sends the views instead of copying 16 KiB reads.
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


class _Chunks:
    """What urllib3 sends: an iterable of chunks (``seek`` so botocore can rewind on retry)."""

    def __init__(self, chunks: tuple[memoryview, ...]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[memoryview]:
        return iter(self._chunks)

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0


def _swap_body(request: Any, **_: Any) -> None:
    body = getattr(request, "body", None)
    if isinstance(body, _BodyFile):
        request.body = _Chunks(body.payload.views)


def install_zero_copy(client: S3Client) -> None:
    """Let ``client`` send :class:`_BodyFile` bodies without copying (idempotent).

    A no-op for an object without botocore's event system (it then sends bodies through ``read``).
    """
    events = getattr(getattr(client, "meta", None), "events", None)
    if events is None:
        return
    for operation in ("PutObject", "UploadPart"):
        events.register(f"before-send.s3.{operation}", _swap_body, unique_id=f"cwtrain-zero-copy-{operation}")
