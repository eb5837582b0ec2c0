"""Exact reads of open files: the one ``pread`` loop every reader of snapshot bytes uses.

Snapshot and checkpoint files are read with ``pread`` into caller-owned buffers, never
memory-mapped: a file that shrinks while it is read must be an error naming it, not a
``SIGBUS`` that kills the trainer. One rule, one loop, one message::

    pread_into(fd, memoryview(buffer), offset, source="ckpt/model.safetensors")
    data = pread_exact(fd, 4096, offset, source="ckpt/model.safetensors")

``OSError`` from the system call propagates; a read that ends before the buffer is full
raises :class:`~cwtrain.errors.SnapshotError`.
"""

from __future__ import annotations

import os
from collections.abc import Buffer

from cwtrain.errors import SnapshotError

__all__ = ["pread_exact", "pread_into"]


def pread_into(fd: int, buffer: Buffer, offset: int, *, source: str = "file") -> None:
    """Fill ``buffer`` with the bytes of ``fd`` at ``offset``.

    Args:
        fd: an open descriptor.
        buffer: a writable, C-contiguous bytes-like (a ``bytearray``, a numpy array, a view).
        offset: where to read from.
        source: what the file is, for the message (its path, or a tensor's name).

    Raises:
        SnapshotError: the file ended before ``buffer`` was full (it shrank or changed).
    """
    view = memoryview(buffer).cast("B")
    done = 0
    while done < view.nbytes:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise SnapshotError(
                f"{source}: the file ended at byte {offset + done} while reading {view.nbytes} bytes at offset "
                f"{offset} (did it shrink or change while being read?)"
            )
        done += got


def pread_exact(fd: int, count: int, offset: int, *, source: str = "file") -> bytearray:
    """``count`` bytes of ``fd`` at ``offset`` in a new buffer (see :func:`pread_into`)."""
    data = bytearray(count)
    pread_into(fd, data, offset, source=source)
    return data
