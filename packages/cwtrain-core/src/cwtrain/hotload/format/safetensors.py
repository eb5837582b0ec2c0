"""The safetensors container (snapshot-format.md section 4): dtypes, headers, read and write.

Nothing here touches the network or torch; it is the lowest layer of the snapshot
modules::

    header = read_header("model.safetensors")        # any valid header; SnapshotError otherwise
    header = read_header_at(fd, size, source="x")    # the same through pread of an open file
    blob = encode_header(entries, {"format": "pt"})  # cwtrain's exact bytes: u64 length + padded JSON
    DTYPE_BITS["BF16"], dtype_nbytes("BF16", (2, 3)) # 16, 12
    safetensors_dtype("bfloat16")                    # "BF16" (torch / numpy dtype names)

:data:`DTYPE_BITS` and :data:`FRAMEWORK_DTYPES` are the one dtype table of cwtrain:
the codec, the torch path and the local engines derive theirs from them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Buffer, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from cwtrain.errors import SnapshotError, SnapshotNotFoundError
from cwtrain.hotload.format.fileio import pread_exact

__all__ = [
    "check_weight_map",
    "DTYPE_BITS",
    "FRAMEWORK_DTYPES",
    "MAX_HEADER_BYTES",
    "SafetensorsHeader",
    "TensorEntry",
    "dtype_nbytes",
    "encode_header",
    "header_of_bytes",
    "parse_header",
    "read_header",
    "read_header_at",
    "read_header_from",
    "safetensors_dtype",
]

#: Largest safetensors header accepted when reading (the safetensors library's limit).
MAX_HEADER_BYTES = 100_000_000
#: Largest tensor element count accepted (2**64: no file holds more; it also stops a
#: header with huge dimensions from costing a huge multiplication).
_MAX_ELEMENTS = 1 << 64


#: Every safetensors dtype and its size in bits (sub-byte types pack; a tensor's
#: total bit count must be a whole number of bytes).
DTYPE_BITS: Mapping[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "I64": 64,
    "U64": 64,
    "F64": 64,
}

#: torch / numpy dtype names (``str(torch.bfloat16)`` without ``torch.``, ``numpy.dtype.name``)
#: and the safetensors name each is stored as.
FRAMEWORK_DTYPES: Mapping[str, str] = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e8m0fnu": "F8_E8M0",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "complex64": "C64",
    "int64": "I64",
    "uint64": "U64",
    "float64": "F64",
}


def safetensors_dtype(name: str) -> str | None:
    """The safetensors name of a torch or numpy dtype name (``"bfloat16"`` → ``"BF16"``), else ``None``."""
    return FRAMEWORK_DTYPES.get(name.removeprefix("torch."))


def dtype_nbytes(dtype: str, shape: Sequence[int], *, where: str = "tensor") -> int:
    """Byte size of a tensor of ``dtype`` and ``shape``.

    Raises:
        SnapshotError: unknown dtype, negative or non-integer dimension, more than
            2**64 elements, or a bit count that is not a whole number of bytes.
    """
    size = _size_of(dtype, shape)
    if isinstance(size, str):
        raise SnapshotError(f"{where}: {size}")
    return size


def _size_of(dtype: str, shape: Sequence[Any]) -> int | str:
    """The byte size, or the problem in words."""
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        return f"unknown safetensors dtype {_shown(dtype)} (known: {', '.join(DTYPE_BITS)})"
    count = 1
    for dim in shape:
        if type(dim) is not int or dim < 0:
            return f"invalid shape {_shown(shape)}"
        count *= dim
        if count > _MAX_ELEMENTS:
            return f"shape {_shown(shape)} has more than 2**64 elements"
    total = count * bits
    if total % 8:
        return f"{dtype} shape {_shown(shape)} is not a whole number of bytes"
    return total // 8


def _shown(value: Any, limit: int = 120) -> str:
    """``repr`` of a value from a file, cut to ``limit`` characters (a header may hold anything)."""
    text = repr(list(value) if isinstance(value, (list, tuple)) and len(value) <= 64 else value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class TensorEntry(NamedTuple):
    """One tensor of a safetensors header; offsets are relative to the data section.

    A named tuple: headers of a million tensors are parsed in about a second.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        """``end - begin``."""
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    """A parsed safetensors header.

    Attributes:
        tensors: entries in header order.
        metadata: ``__metadata__`` (``None`` when absent).
        data_start: file offset of the data section (``8 + H``).
    """

    tensors: Mapping[str, TensorEntry]
    metadata: Mapping[str, str] | None
    data_start: int

    @property
    def data_size(self) -> int:
        """Length of the data section (the largest ``end``)."""
        return max((t.end for t in self.tensors.values()), default=0)

    @property
    def file_size(self) -> int:
        """Exact size of a valid file with this header."""
        return self.data_start + self.data_size


def _bad(source: str, problem: str) -> SnapshotError:
    return SnapshotError(f"{source}: invalid safetensors header: {problem}")


def parse_header(raw: Buffer, *, source: str, data_size: int | None = None) -> SafetensorsHeader:
    """Parse the JSON part of a safetensors header (the ``H`` bytes after the length).

    Linear in the header size (a million tensors take about a second); nothing but a
    :class:`~cwtrain.errors.SnapshotError` escapes, whatever the bytes.

    Args:
        raw: the ``H`` header bytes.
        source: the file name used in errors.
        data_size: the actual data-section length, when known; it must equal the
            largest ``end``.

    Raises:
        SnapshotError: the header is not valid safetensors.
    """
    try:
        obj = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _bad(source, f"not UTF-8 JSON ({_shown(str(exc))})") from None
    if type(obj) is not dict:
        raise _bad(source, "not a JSON object")
    metadata: dict[str, str] | None = None
    tensors: dict[str, TensorEntry] = {}
    for name, value in obj.items():
        if name == "__metadata__":
            if value is None:
                continue
            if type(value) is not dict or not all(type(v) is str for v in value.values()):
                raise _bad(source, "__metadata__ must map strings to strings")
            metadata = value
            continue
        if type(value) is not dict:
            raise _bad(source, f"tensor {_shown(name)} entry is not an object")
        dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
        if type(dtype) is not str or type(shape) is not list:
            raise _bad(source, f"tensor {_shown(name)} needs a dtype string and a shape list")
        if (
            type(offsets) is not list
            or len(offsets) != 2
            or type(offsets[0]) is not int
            or type(offsets[1]) is not int
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise _bad(source, f"tensor {_shown(name)} has invalid data_offsets {_shown(offsets)}")
        dims = tuple(shape)
        size = _size_of(dtype, dims)
        if isinstance(size, str):
            raise _bad(source, f"tensor {_shown(name)}: {size}")
        begin, end = offsets
        if end - begin != size:
            raise _bad(
                source,
                f"tensor {_shown(name)}: data_offsets {_shown(offsets)} hold {end - begin} bytes, "
                f"{dtype} {_shown(dims)} needs {size}",
            )
        tensors[name] = TensorEntry(name, dtype, dims, begin, end)
    position = 0
    for begin, end, name in sorted((t.begin, t.end, t.name) for t in tensors.values()):
        if begin != position:
            raise _bad(source, f"tensor {_shown(name)} starts at {begin}, expected {position} (gap or overlap)")
        position = end
    if data_size is not None and data_size != position:
        raise _bad(source, f"data section is {data_size} bytes but the tensors cover {position} (truncated or padded)")
    return SafetensorsHeader(tensors, metadata, 0)


def _header_length(prefix: bytes, source: str, available: int | None) -> int:
    if len(prefix) < 8:
        raise _bad(source, "file shorter than 8 bytes")
    length = int.from_bytes(prefix[:8], "little")
    if length > MAX_HEADER_BYTES:
        raise _bad(source, f"header length {length} exceeds {MAX_HEADER_BYTES}")
    if available is not None and length > available - 8:
        raise _bad(source, f"header length {length} runs past the end of the file")
    return length


def read_header_from(stream: BinaryIO, *, source: str, file_size: int | None = None) -> SafetensorsHeader:
    """Read and parse a safetensors header from an open binary stream at offset 0.

    Raises:
        SnapshotError: the header is not valid safetensors (or, with ``file_size``,
            the data section does not match it).
    """
    prefix = stream.read(8)
    length = _header_length(prefix, source, file_size)
    raw = stream.read(length)
    if len(raw) != length:
        raise _bad(source, "truncated header")
    data_size = None if file_size is None else file_size - 8 - length
    parsed = parse_header(raw, source=source, data_size=data_size)
    return SafetensorsHeader(parsed.tensors, parsed.metadata, 8 + length)


def read_header(path: str | Path) -> SafetensorsHeader:
    """Read and validate the header of a safetensors file (the file size must match it).

    Raises:
        SnapshotNotFoundError: the file does not exist.
        SnapshotError: the header is invalid or the file is truncated.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise SnapshotNotFoundError(f"{path}: no such file") from None
    try:
        return read_header_at(fd, os.fstat(fd).st_size, source=str(path))
    finally:
        os.close(fd)


def read_header_at(fd: int, file_size: int, *, source: str, offset: int = 0) -> SafetensorsHeader:
    """Read and validate the header of the safetensors file at ``offset`` of an open descriptor.

    ``file_size`` is the file's length from ``offset``; the data section must match the
    header exactly. Read with ``pread`` (never a memory mapping, so a file that shrinks
    is an error, not a ``SIGBUS``).

    Raises:
        SnapshotError: the header is invalid, or the file is shorter than it says.
    """
    prefix = bytes(pread_exact(fd, min(8, max(0, file_size)), offset, source=source))
    length = _header_length(prefix, source, file_size)
    raw = bytes(pread_exact(fd, length, offset + 8, source=source))
    parsed = parse_header(raw, source=source, data_size=file_size - 8 - length)
    return SafetensorsHeader(parsed.tensors, parsed.metadata, 8 + length)


def header_of_bytes(blob: Buffer, *, source: str) -> SafetensorsHeader:
    """Parse the header of a whole safetensors file held in memory."""
    view = memoryview(blob).cast("B")
    length = _header_length(bytes(view[:8]), source, view.nbytes)
    parsed = parse_header(view[8 : 8 + length], source=source, data_size=view.nbytes - 8 - length)
    return SafetensorsHeader(parsed.tensors, parsed.metadata, 8 + length)


def encode_header(entries: Sequence[TensorEntry], metadata: Mapping[str, str] | None = None) -> bytes:
    """cwtrain's exact header bytes: u64 LE length, then compact ASCII-escaped JSON.

    ``__metadata__`` comes first (omitted when ``None``), then the entries in the order
    given, each ``{"dtype", "shape", "data_offsets"}``; the JSON is padded with spaces
    to a multiple of 8 bytes.
    """
    obj: dict[str, Any] = {}
    if metadata is not None:
        obj["__metadata__"] = dict(metadata)
    for entry in entries:
        obj[entry.name] = {"dtype": entry.dtype, "shape": list(entry.shape), "data_offsets": [entry.begin, entry.end]}
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def check_weight_map(source: str, weight_map: Mapping[str, str], headers: Mapping[str, SafetensorsHeader]) -> None:
    """An index's ``weight_map`` and its shards' headers name the same tensors in the same shards.

    ``headers`` holds the header of every shard the map names. ``source`` (the snapshot's
    path or URI) starts each message.

    Raises:
        SnapshotError: a shard holds a tensor the map puts elsewhere (or nowhere), or the map
            puts a tensor in a shard whose header lacks it.
    """
    for shard, header in headers.items():
        for name in header.tensors:
            if weight_map.get(name) != shard:
                raise SnapshotError(f"{source}/{shard}: tensor {name!r} is not mapped to this shard by the index")
    for name, shard in weight_map.items():
        if name not in headers[shard].tensors:
            raise SnapshotError(f"{source}: tensor {name!r} is mapped to {shard} by the index but not in its header")
