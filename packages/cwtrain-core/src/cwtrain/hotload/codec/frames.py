"""zstd frames of delta payloads: checked before decoding, decoded in bounded memory.

The lowest layer of :mod:`cwtrain.hotload.codec.decode` (which re-exports these names)::

    zstd_frame_size(payload)                       # length of the one frame at its start (block walk)
    value = stream_payload(payload, old, expected=0x097901fd, sink=write)   # XOR, Adler-32, chunk by chunk
    new = apply_payload(old, payload, expected)    # the same into a new array
    xor = decode_frame(payload, nbytes)            # the XOR bytes alone

A payload is a bytes-like or a :class:`~cwtrain.hotload.format.tensors.FileRegion` (read with
``pread``, never memory-mapped: a file that shrinks is a ``SnapshotError``, not a
``SIGBUS``). Before anything is decompressed, the frame's block headers are walked: a
bad magic, a dictionary, a reserved bit or block type, a truncated frame, trailing
bytes, a content size other than the tensor's (or absent), a declared size its blocks
cannot hold, or a window over :data:`MAX_WINDOW_BYTES` (128 MiB) is refused. The frame
is then decompressed 1 MiB at a time into reused buffers; memory is the decoder's
window plus two chunks per thread, held against a :class:`MemoryBudget`
(``CWTRAIN_HOTLOAD_MEMORY_BUDGET``, default 1 GiB, as the encoder's), and work is
bounded by the size the frame declares. Whatever the bytes, only
:class:`~cwtrain.errors.SnapshotError` (or ``SnapshotChecksumError``) escapes
(``decode_frame``: ``ValueError``).
"""

from __future__ import annotations

import threading
from collections.abc import Buffer, Callable
from typing import Any, NamedTuple

import numpy as np
import zstandard

from cwtrain.errors import SnapshotChecksumError, SnapshotError
from cwtrain.hotload.codec.common import MemoryBudget
from cwtrain.hotload.format.checksum import adler32
from cwtrain.hotload.format.fileio import pread_exact, pread_into
from cwtrain.hotload.format.tensors import FileRegion, U8Array, as_uint8, payload_nbytes

__all__ = [
    "MAX_WINDOW_BYTES",
    "apply_payload",
    "decode_frame",
    "frame_header",
    "stream_payload",
    "zstd_frame_size",
]

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: Decompressed bytes per step (and the size of each reused buffer).
_CHUNK = 1 << 20
#: The most one zstd block can produce (Block_Maximum_Size).
_BLOCK_MAX = 128 << 10
#: Largest decoder window accepted (zstd's own default limit for streaming, 2**27).
MAX_WINDOW_BYTES = 1 << 27
#: Memory of one decode besides its window: the XOR and base chunks.
_JOB_BYTES = 2 * _CHUNK


# ----------------------------------------------------------------------------- frames


class _Frame(NamedTuple):
    """What the block walk learnt of a frame."""

    length: int  # bytes of the frame
    content_size: int  # Frame_Content_Size (-1: absent)
    window: int  # decoder window it needs
    bound: int  # the most bytes its blocks can produce


class _Reader:
    """Random reads of a payload (memory or file region) for the block walk, 64 KiB windows from files."""

    def __init__(self, data: Buffer | FileRegion) -> None:
        self.size = payload_nbytes(data)
        self._region = data if isinstance(data, FileRegion) else None
        self._view = None if isinstance(data, FileRegion) else memoryview(data).cast("B")
        self._window_start = 0
        self._window = b""

    def read(self, position: int, count: int) -> bytes:
        if self._view is not None:
            return bytes(self._view[position : position + count])
        end = self._window_start + len(self._window)
        if not (self._window_start <= position and position + count <= end):
            assert self._region is not None
            length = min(max(count, 64 << 10), self.size - position)
            self._window = _pread(self._region, position, length)
            self._window_start = position
        start = position - self._window_start
        return self._window[start : start + count]


def _pread(region: FileRegion, position: int, count: int) -> bytes:
    """``count`` bytes at ``position`` of a region (fewer only at its end)."""
    count = max(0, min(count, region.nbytes - position))
    return bytes(pread_exact(region.fd, count, region.offset + position, source=region.source))


def frame_header(head: bytes) -> tuple[int, int, int]:
    """The frame header at the start of ``head`` (its first 18 bytes suffice).

    Returns:
        ``(header length, Frame_Content_Size or -1 when absent, window size)``.

    Raises:
        ValueError: not a zstd frame, a reserved bit, a dictionary frame, or a truncated header.
    """
    if len(head) < 6 or head[:4] != _ZSTD_MAGIC:
        raise ValueError("not a zstd frame (bad magic)")
    descriptor = head[4]
    if descriptor & 0x08:
        raise ValueError("reserved bit set in the frame header")
    if descriptor & 3:
        raise ValueError("frame needs a dictionary")
    single = (descriptor >> 5) & 1
    fcs_size = (single, 2, 4, 8)[descriptor >> 6]
    position = 5 + (0 if single else 1) + fcs_size
    if position > len(head):
        raise ValueError("truncated zstd frame")
    window = 0
    if not single:
        exponent, mantissa = head[5] >> 3, head[5] & 7
        window = (1 << (10 + exponent)) + ((1 << (10 + exponent)) >> 3) * mantissa
    content = -1
    if fcs_size:
        content = int.from_bytes(head[position - fcs_size : position], "little") + (256 if fcs_size == 2 else 0)
    return position, content, content if single else window


def _walk(reader: _Reader) -> _Frame:
    size = reader.size
    head = reader.read(0, min(size, 18))
    position, content, window = frame_header(head)
    descriptor = head[4]
    block_max = min(_BLOCK_MAX, max(window, 1))
    bound = 0
    while True:
        if position + 3 > size:
            raise ValueError("truncated zstd frame")
        block = int.from_bytes(reader.read(position, 3), "little")
        position += 3
        kind, block_size = (block >> 1) & 3, block >> 3
        if kind == 3:
            raise ValueError("reserved zstd block type")
        if kind == 0:
            position += block_size
            bound += block_size
        elif kind == 1:
            position += 1
            bound += block_size
        else:
            position += block_size
            bound += block_max
        if position > size:
            raise ValueError("truncated zstd frame")
        if block & 1:
            break
    if descriptor & 0x04:
        position += 4
        if position > size:
            raise ValueError("truncated zstd frame")
    return _Frame(position, content, window, bound)


def zstd_frame_size(frame: Buffer) -> int:
    """Length of the one zstd frame at the start of ``frame``, by walking its block headers.

    Raises:
        ValueError: not a zstd frame, a dictionary frame, a reserved block type, or a
            frame that runs past the end (truncated).
    """
    return _walk(_Reader(frame)).length


def _check_frame(payload: Buffer | FileRegion, nbytes: int | None) -> _Frame:
    """The frame of a payload, refused unless it is exactly one frame of ``nbytes`` that fits the limits.

    ``nbytes`` ``None``: any declared size (it must be present), bounded by what the blocks can hold.
    """
    reader = _Reader(payload)
    frame = _walk(reader)
    if frame.length != reader.size:
        raise ValueError(f"{reader.size - frame.length} bytes after the zstd frame (expected exactly one frame)")
    if nbytes is not None and frame.content_size != nbytes:
        shown = "absent" if frame.content_size < 0 else str(frame.content_size)
        raise ValueError(f"frame content size is {shown}, the tensor has {nbytes} bytes")
    if frame.content_size < 0:
        raise ValueError("frame has no content size")
    if frame.content_size > frame.bound:
        raise ValueError(
            f"frame declares {frame.content_size} bytes but its blocks hold at most {frame.bound} (corrupt frame)"
        )
    if frame.window > MAX_WINDOW_BYTES:
        raise ValueError(f"frame needs a {frame.window}-byte window, more than {MAX_WINDOW_BYTES} allowed")
    return frame


class _RegionSource:
    """A file region as the ``read(size)`` source zstd's stream reader wants (pread, exact length)."""

    def __init__(self, region: FileRegion) -> None:
        self._region = region
        self._position = 0

    def read(self, size: int = -1) -> bytes:
        remaining = self._region.nbytes - self._position
        count = remaining if size < 0 else min(size, remaining)
        data = _pread(self._region, self._position, count)
        self._position += len(data)
        return data


class _Scratch(threading.local):
    """Per-thread reused chunk buffers (fresh memory page-faults at about 1 GB/s)."""

    def __init__(self) -> None:
        self.xor = np.empty(_CHUNK, np.uint8)
        self.old = np.empty(_CHUNK, np.uint8)
        self.one = bytearray(1)


_SCRATCH = _Scratch()


def _read_old(old: U8Array | FileRegion, position: int, count: int) -> U8Array:
    if isinstance(old, FileRegion):
        view = _SCRATCH.old[:count]
        pread_into(old.fd, view, old.offset + position, source=old.source)
        return view
    return old[position : position + count]


def stream_payload(
    payload: Buffer | FileRegion,
    old: Buffer | FileRegion | None,
    *,
    nbytes: int | None = None,
    expected: int | None = None,
    where: str = "tensor",
    sink: Callable[[int, U8Array], None] | None = None,
    budget: MemoryBudget | None = None,
) -> int:
    """Decode one delta payload chunk by chunk: XOR with ``old``, Adler-32, hand each chunk on.

    The payload must be exactly one zstd frame whose content size is the tensor's size
    (``old``'s, or ``nbytes``; with neither, the size the frame declares, which its
    blocks must be able to hold). Memory: the decoder's window plus two 1 MiB buffers
    per thread, held against ``budget``.

    Args:
        payload: the frame bytes.
        old: the base tensor's bytes; ``None`` checks the frame alone (the chunks are the XOR).
        nbytes: the tensor size when ``old`` is ``None``.
        expected: the Adler-32 the result must have (checked after the last chunk).
        where: how errors name the tensor.
        sink: called with ``(offset, chunk)`` for each chunk of the result (the chunk
            is a reused buffer: copy or write it before returning).
        budget: the memory budget to hold the decoder's memory against.

    Returns:
        Adler-32 of the result (of the XOR bytes when ``old`` is ``None``).

    Raises:
        SnapshotError: not exactly one frame of the tensor's size, a corrupt frame, or
            a file that ended early.
        SnapshotChecksumError: the result's Adler-32 is not ``expected``.
    """
    size = payload_nbytes(old) if old is not None else nbytes
    value, _ = _decode(payload, old, size, where=where, sink=sink, budget=budget, keep=False)
    _check_adler(value, expected, where)
    return value


def _check_adler(value: int, expected: int | None, where: str) -> None:
    if expected is not None and value != expected:
        raise SnapshotChecksumError(
            f"{where}: Adler-32 of the result is {value:08x}, expected {expected:08x} "
            "(wrong base weights or corrupt delta)"
        )


def _decode(
    payload: Buffer | FileRegion,
    old: Buffer | FileRegion | None,
    size: int | None,
    *,
    where: str,
    sink: Callable[[int, U8Array], None] | None = None,
    budget: MemoryBudget | None = None,
    keep: bool,
) -> tuple[int, U8Array | None]:
    """Check and stream-decode one frame; ``keep`` returns the result in a new array.

    The array is allocated only once the frame is known to hold exactly ``size`` bytes.
    """
    try:
        frame = _check_frame(payload, size)
    except ValueError as exc:
        raise SnapshotError(f"{where}: {exc}") from None
    total = frame.content_size
    base: U8Array | FileRegion | None = old if old is None or isinstance(old, FileRegion) else as_uint8(old)
    cost = min(frame.window, total) + _JOB_BYTES
    if budget is not None:
        budget.acquire(cost)
    try:
        into = np.empty(total, np.uint8) if keep else None
        return _inflate(payload, total, base, into, sink, where), into
    finally:
        if budget is not None:
            budget.release(cost)


def _inflate(
    payload: Buffer | FileRegion,
    total: int,
    old: U8Array | FileRegion | None,
    into: U8Array | None,
    sink: Callable[[int, U8Array], None] | None,
    where: str,
) -> int:
    source: Any = _RegionSource(payload) if isinstance(payload, FileRegion) else memoryview(payload).cast("B")
    scratch = _SCRATCH
    value = 1
    position = 0
    try:
        decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES)
        with decompressor.stream_reader(source, read_size=1 << 17, read_across_frames=False, closefd=False) as reader:
            while position < total:
                count = min(_CHUNK, total - position)
                target = into[position : position + count] if into is not None else scratch.xor[:count]
                got = reader.readinto(memoryview(target))
                if got <= 0:
                    raise ValueError(f"frame ended after {position} bytes, the tensor has {total}")
                chunk = target[:got]
                if old is not None:
                    np.bitwise_xor(chunk, _read_old(old, position, got), out=chunk)
                value = adler32(chunk, value)
                if sink is not None:
                    sink(position, chunk)
                position += got
            if reader.readinto(scratch.one):
                raise ValueError(f"frame holds more than the tensor's {total} bytes")
    except (ValueError, zstandard.ZstdError, MemoryError) as exc:
        problem = str(exc) if isinstance(exc, ValueError) else f"corrupt zstd frame: {exc or type(exc).__name__}"
        raise SnapshotError(f"{where}: {problem}") from None
    return value


def decode_frame(frame: Buffer, nbytes: int) -> U8Array:
    """Decompress one payload that must be exactly one zstd frame of ``nbytes`` content.

    Memory: the result (allocated only once the frame is checked) plus the decoder's window.

    Raises:
        ValueError: malformed, truncated, trailing bytes, or a content size other than
            ``nbytes`` (absent included).
    """
    try:
        _, out = _decode(frame, None, nbytes, where="frame", keep=True)
    except SnapshotError as exc:
        raise ValueError(str(exc).removeprefix("frame: ")) from None
    assert out is not None
    return out


def apply_payload(
    old: Buffer | FileRegion,
    payload: Buffer | FileRegion,
    expected: int,
    *,
    where: str = "tensor",
    budget: MemoryBudget | None = None,
) -> U8Array:
    """Decode one delta payload against the old tensor bytes and verify the result.

    The result is allocated once the frame is known to hold exactly the tensor's size;
    the decoder's memory is held against ``budget``.

    Returns:
        A new array with the new tensor bytes (``old`` is not modified).

    Raises:
        SnapshotError: the payload is not exactly one zstd frame of the tensor's size.
        SnapshotChecksumError: the result's Adler-32 is not ``expected``.
    """
    value, out = _decode(payload, old, payload_nbytes(old), where=where, budget=budget, keep=True)
    _check_adler(value, expected, where)
    assert out is not None
    return out
