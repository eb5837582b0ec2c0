"""How boto3 sends cwtrain's request bodies without copies (used by :mod:`cwtrain.infra.s3` only).

:class:`~cwtrain.infra.s3.Boto3ObjectStore` does this for every client it wraps::

    install_zero_copy(client)          # once per client (idempotent)
    client.upload_part(..., Body=request_body(payload))

A :class:`~cwtrain.infra.objectstore.Payload` is memory views: the encoder's buffers, or
the buffers a file was read into and hashed from (:mod:`cwtrain.hotload.store.object_source`).
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

**Deadlines** (:func:`install_deadlines`, :func:`call_deadline`): a call made inside
``with call_deadline(budget):`` is bounded by what the budget has left. Its ``before-send``
hook refuses to send once the deadline has passed and sets the request's read timeout to
at most what is left (botocore reads ``request.context["read_timeout"]`` since 1.43.72;
older versions keep the client's read timeout for a request already sent); its
``needs-retry`` hook, first in line, stops the SDK's retries of a failed request once less
than :data:`~cwtrain.infra.objectstore.MIN_ATTEMPT_SECONDS` are left, so neither a retry nor
its back-off runs past the deadline. Both raise
:class:`~cwtrain.infra.objectstore.ObjectStoreDeadlineError`. The deadline is per thread,
set by the store around each call, so one client serves bounded and unbounded calls at once.

Everything here leans on botocore internals (the ``before-send`` and ``needs-retry``
events, the request context); nothing outside :mod:`cwtrain.infra.s3` imports it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from cwtrain.infra.objectstore import (
    MIN_ATTEMPT_SECONDS,
    Body,
    Deadline,
    ObjectStoreDeadlineError,
    Payload,
    deadline_passed,
)

__all__ = ["S3Client", "call_deadline", "install_deadlines", "install_zero_copy", "request_body"]


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


# ------------------------------------------------------------------------ deadlines

_calls = threading.local()


@contextmanager
def call_deadline(deadline: Deadline | None) -> Iterator[None]:
    """Bound the store calls this thread makes inside the block by ``deadline`` (``None``: unbounded)."""
    previous = getattr(_calls, "deadline", None)
    _calls.deadline = deadline
    try:
        yield
    finally:
        _calls.deadline = previous


def _transport_failure(response: Any, caught: Any) -> bool:
    """Whether a failed attempt is one the SDK would retry (no answer, a 5xx, a throttle)."""
    if caught is not None:
        from botocore.exceptions import ConnectionError as SDKConnectionError
        from botocore.exceptions import HTTPClientError

        return isinstance(caught, (SDKConnectionError, HTTPClientError))
    status = getattr(response[0], "status_code", 0) if isinstance(response, tuple) and response else 0
    return status >= 500 or status == 429


def install_deadlines(client: S3Client) -> None:
    """Let :func:`call_deadline` bound ``client``'s calls (idempotent; a no-op without botocore events)."""
    events = getattr(getattr(client, "meta", None), "events", None)
    if events is None:
        return
    configured = float(getattr(client.meta.config, "read_timeout", 60) or 60)

    def bound_request(request: Any, **_: Any) -> None:
        deadline = getattr(_calls, "deadline", None)
        if deadline is None:
            return
        left = deadline.remaining
        if left <= 0:
            raise deadline_passed(deadline)
        context = getattr(request, "context", None)
        if isinstance(context, dict):
            context["read_timeout"] = max(0.001, min(configured, left))

    def stop_retrying(response: Any = None, caught_exception: Any = None, **_: Any) -> None:
        deadline = getattr(_calls, "deadline", None)
        if deadline is None:
            return
        if isinstance(caught_exception, ObjectStoreDeadlineError):
            raise caught_exception
        if deadline.remaining < MIN_ATTEMPT_SECONDS and _transport_failure(response, caught_exception):
            raise deadline_passed(deadline) from caught_exception

    events.register("before-send.s3", bound_request, unique_id="cwtrain-deadline-send")
    events.register_first("needs-retry.s3", stop_retrying, unique_id="cwtrain-deadline-retry")
