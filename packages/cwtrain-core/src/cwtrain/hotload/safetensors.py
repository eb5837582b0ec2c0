"""The safetensors container (snapshot-format.md section 4): dtypes, headers, read and write.

Nothing here touches the network or torch; it is the lowest layer of the snapshot
modules::

    header = read_header("model.safetensors")        # any valid header; SnapshotError otherwise
    blob = encode_header(entries, {"format": "pt"})  # cwtrain's exact bytes: u64 length + padded JSON
    DTYPE_BITS["BF16"], dtype_nbytes("BF16", (2, 3)) # 16, 12
    safetensors_dtype("bfloat16")                    # "BF16" (torch / numpy dtype names)

:data:`DTYPE_BITS` and :data:`FRAMEWORK_DTYPES` are the one dtype table of cwtrain:
the codec, the torch path and the local engines derive theirs from them.
"""

from __future__ import annotations

import json
from collections.abc import Buffer, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from cwtrain.errors import SnapshotError, SnapshotNotFoundError

__all__ = [
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
    "read_header_from",
    "safetensors_dtype",
]

#: Largest safetensors header accepted when reading (the safetensors library's limit).
MAX_HEADER_BYTES = 100_000_000


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
        SnapshotError: unknown dtype, negative dimension, or a bit count that is not a
            whole number of bytes.
    """
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        raise SnapshotError(f"{where}: unknown safetensors dtype {dtype!r} (known: {', '.join(DTYPE_BITS)})")
    count = 1
    for dim in shape:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
            raise SnapshotError(f"{where}: invalid shape {list(shape)!r}")
        count *= dim
    total = count * bits
    if total % 8:
        raise SnapshotError(f"{where}: {dtype} shape {list(shape)} is not a whole number of bytes")
    return total // 8


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors header; offsets are relative to the data section."""

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
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad(source, f"not UTF-8 JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise _bad(source, "not a JSON object")
    metadata: dict[str, str] | None = None
    tensors: dict[str, TensorEntry] = {}
    for name, value in obj.items():
        if name == "__metadata__":
            if value is None:
                continue
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise _bad(source, "__metadata__ must map strings to strings")
            metadata = dict(value)
            continue
        where = f"{source}: tensor {name!r}"
        if not isinstance(value, dict):
            raise _bad(source, f"tensor {name!r} entry is not an object")
        dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
        if not isinstance(dtype, str) or not isinstance(shape, list):
            raise _bad(source, f"tensor {name!r} needs a dtype string and a shape list")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise _bad(source, f"tensor {name!r} has invalid data_offsets {offsets!r}")
        size = dtype_nbytes(dtype, shape, where=where)
        if offsets[1] - offsets[0] != size:
            raise _bad(
                source,
                f"tensor {name!r}: data_offsets {offsets} hold {offsets[1] - offsets[0]} bytes, "
                f"{dtype} {shape} needs {size}",
            )
        tensors[name] = TensorEntry(name, dtype, tuple(shape), offsets[0], offsets[1])
    position = 0
    for entry in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if entry.begin != position:
            raise _bad(source, f"tensor {entry.name!r} starts at {entry.begin}, expected {position} (gap or overlap)")
        position = entry.end
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
        with open(path, "rb") as stream:
            size = path.stat().st_size
            return read_header_from(stream, source=str(path), file_size=size)
    except FileNotFoundError:
        raise SnapshotNotFoundError(f"{path}: no such file") from None


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
