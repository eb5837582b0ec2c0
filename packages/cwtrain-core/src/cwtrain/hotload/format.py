"""The snapshot wire format: safetensors headers, index JSON, identities, chain rules.

Everything here is byte-exact to ``shared/spec/snapshot-format.md``; nothing here
touches the network or torch. The codec (:mod:`cwtrain.hotload.codec`) builds on it.

Data types that cross module lines:

- :class:`TensorData` ``(dtype, shape, data)``: one tensor's raw little-endian bytes
  (any bytes-like: ``bytes``, ``memoryview``, a contiguous numpy array) with its
  safetensors dtype name (``"BF16"``, ``"F32"``, ...). A checkpoint in memory is a
  ``Mapping[str, TensorData]``.
- :class:`SnapshotFile` ``(name, buffers)``: one finished file of a snapshot; its bytes
  are the concatenation of ``buffers`` (for a shard: the header, then one payload per
  tensor), so nothing is copied into one big buffer. ``.size`` is the total length.
- :class:`TensorEntry` and :class:`SafetensorsHeader`: a parsed safetensors header.

Safetensors (spec section 4)::

    header = read_header("model.safetensors")        # any valid header; SnapshotError otherwise
    blob = encode_header(entries, {"format": "pt"})  # cwtrain's exact bytes: u64 length + padded JSON

Index JSON (sections 3 and 5)::

    index = parse_index(raw, source="ckpt/model.safetensors.index.json")
    is_delta_index(index)                            # INCREMENTAL iff metadata has "delta_encoding"
    check_delta_metadata(index["metadata"], source=...)   # xor / zstd / adler32, or SnapshotError
    generated_index_bytes(header)                    # 3.2: the index of a lone model.safetensors
    upload_index_bytes(index, version=..., base_version=...)  # 5.2: the uploaded delta index
    serialize_index(index)                           # 5.2 serialisation (also FULL cuts)
    local_index_bytes(index)                         # the compact on-disk delta index

Identities (section 2): :func:`validate_identity`, :func:`version_identity`,
:func:`identity_for_base_version`, :func:`snapshot_prefix`. Chain rules (sections 6 and
10): :data:`MAX_CHAIN_DELTAS`, :func:`full_every_from_env`, :func:`is_chain_cut`.
Checksums: :func:`adler32` (python-isal when installed, else :mod:`zlib`; same values),
:func:`adler32_hex`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zlib
from collections.abc import Buffer, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from cwtrain.config import env_int
from cwtrain.errors import ConfigError, SnapshotError, SnapshotNotFoundError

__all__ = [
    "CHECKSUM_FORMAT",
    "COMPRESSION_FORMAT",
    "DEFAULT_FULL_EVERY",
    "DEFAULT_SHARD_BYTES",
    "DELTA_ENCODING",
    "DTYPE_BITS",
    "FileRegion",
    "INDEX_NAME",
    "MAX_CHAIN_DELTAS",
    "MAX_FULL_EVERY",
    "MAX_HEADER_BYTES",
    "RESERVED_IDENTITIES",
    "SHARD_NAME_RE",
    "SINGLE_FILE_NAME",
    "SafetensorsHeader",
    "SnapshotFile",
    "TensorData",
    "TensorEntry",
    "adler32",
    "adler32_hex",
    "check_delta_metadata",
    "check_full_every",
    "dtype_nbytes",
    "encode_header",
    "full_every_from_env",
    "generated_index_bytes",
    "header_of_bytes",
    "identity_for_base_version",
    "index_metadata",
    "is_chain_cut",
    "is_delta_index",
    "local_index_bytes",
    "parse_header",
    "parse_index",
    "read_header",
    "read_header_from",
    "read_index_file",
    "serialize_index",
    "shard_name",
    "snapshot_prefix",
    "upload_index_bytes",
    "validate_identity",
    "version_identity",
]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_FILE_NAME = "model.safetensors"
DELTA_ENCODING = "xor"
COMPRESSION_FORMAT = "zstd"
CHECKSUM_FORMAT = "adler32"
#: cwtrain closes a delta shard before its payload would pass this many bytes.
DEFAULT_SHARD_BYTES = 2 << 30
#: Largest safetensors header accepted when reading (the safetensors library's limit).
MAX_HEADER_BYTES = 100_000_000
#: A cold replica replays at most this many deltas after the chain's FULL root.
MAX_CHAIN_DELTAS = 63
DEFAULT_FULL_EVERY = 20
MAX_FULL_EVERY = 64
RESERVED_IDENTITIES = frozenset({"initial", "_manifests", "_preflight"})

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

_DELTA_KEYS = ("version", "base_version", "delta_encoding", "compression_format", "checksum_format")

# ---------------------------------------------------------------------------- checksums

try:
    from isal.isal_zlib import adler32 as _adler32_impl
except ImportError:  # pragma: no cover - python-isal is optional
    _adler32_impl = zlib.adler32


def adler32(data: Buffer, value: int = 1) -> int:
    """Adler-32 (zlib's, initial value 1) of ``data``, continuing from ``value``."""
    return int(_adler32_impl(data, value)) & 0xFFFFFFFF


def adler32_hex(data: Buffer) -> str:
    """Adler-32 of ``data`` as 8 lowercase hex digits (the shard ``__metadata__`` form)."""
    return f"{adler32(data):08x}"


# ----------------------------------------------------------------------------- tensors


@dataclass(frozen=True)
class FileRegion:
    """Tensor bytes that live in a file, read on demand (never memory-mapped).

    The encoder streams a region with ``pread`` into reused buffers; :meth:`read`
    returns the whole region.
    """

    fd: int
    offset: int
    nbytes: int

    def read(self) -> bytearray:
        """The region's bytes."""
        data = bytearray(self.nbytes)
        view = memoryview(data)
        done = 0
        while done < self.nbytes:
            got = os.preadv(self.fd, [view[done:]], self.offset + done)
            if got <= 0:
                raise SnapshotError(f"file ended early while reading {self.nbytes} bytes at offset {self.offset}")
            done += got
        return data


class TensorData(NamedTuple):
    """One tensor: safetensors dtype name, shape and raw little-endian bytes.

    ``data`` is any bytes-like (``bytes``, ``memoryview``, a C-contiguous numpy array)
    or a :class:`FileRegion` (checkpoint directories and the on-disk mirror).
    """

    dtype: str
    shape: tuple[int, ...]
    data: Buffer | FileRegion

    @property
    def nbytes(self) -> int:
        """Length of ``data`` in bytes."""
        data = self.data
        if isinstance(data, FileRegion):
            return data.nbytes
        size = getattr(data, "nbytes", None)
        if isinstance(size, int):
            return size
        return memoryview(data).nbytes


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


@dataclass(frozen=True)
class SnapshotFile:
    """A finished snapshot file held in memory: ``name`` plus the buffers it concatenates."""

    name: str
    buffers: tuple[Buffer, ...]

    @property
    def size(self) -> int:
        """Total byte length of the file."""
        return sum(memoryview(b).nbytes for b in self.buffers)

    @classmethod
    def from_bytes(cls, name: str, data: Buffer) -> SnapshotFile:
        """A file made of one buffer."""
        return cls(name, (data,))

    def iter_views(self) -> Iterator[memoryview]:
        """The buffers as flat byte views, in order."""
        for buffer in self.buffers:
            view = memoryview(buffer)
            yield view if view.format == "B" and view.ndim == 1 else view.cast("B")

    def tobytes(self) -> bytes:
        """The whole file as one ``bytes`` (copies; for small files and tests)."""
        return b"".join(bytes(v) for v in self.iter_views())

    def sha256(self) -> str:
        """SHA-256 of the file's bytes, 64 lowercase hex digits."""
        digest = hashlib.sha256()
        for view in self.iter_views():
            digest.update(view)
        return digest.hexdigest()

    def write_to(self, path: str | Path) -> None:
        """Write the file's bytes to ``path`` (replacing it)."""
        with open(path, "wb") as out:
            for view in self.iter_views():
                out.write(view)


# ------------------------------------------------------------------------ safetensors


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


# ------------------------------------------------------------------------------- index


def parse_index(raw: Buffer, *, source: str) -> dict[str, Any]:
    """Parse and validate an index JSON (``{"metadata": {...}, "weight_map": {...}}``).

    ``metadata`` absent or ``null`` becomes ``{}``; other keys are kept in order. The
    ``weight_map`` may be empty here (an empty delta); callers decide whether that is
    allowed. Values must be immediate ``*.safetensors`` file names.

    Raises:
        SnapshotError: not a JSON object, a non-object ``metadata`` or ``weight_map``,
            or a weight-map value that is not a ``.safetensors`` file name.
    """
    try:
        obj = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SnapshotError(f"{source}: invalid index JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise SnapshotError(f"{source}: the index must be a JSON object")
    metadata = obj.get("metadata")
    if metadata is None:
        obj["metadata"] = {}
    elif not isinstance(metadata, dict):
        raise SnapshotError(f"{source}: index metadata must be an object, not {type(metadata).__name__}")
    weight_map = obj.get("weight_map")
    if not isinstance(weight_map, dict):
        raise SnapshotError(f"{source}: index needs a weight_map object")
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard.endswith(".safetensors") or "/" in shard or shard.startswith("."):
            raise SnapshotError(f"{source}: tensor {tensor!r} maps to {shard!r}, not an immediate *.safetensors file")
    return obj


def read_index_file(path: str | Path) -> dict[str, Any]:
    """Read and parse an index file (:func:`parse_index`)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SnapshotNotFoundError(f"{path}: no such index file") from None
    return parse_index(raw, source=str(path))


def index_metadata(index: Mapping[str, Any]) -> dict[str, Any]:
    """The index's ``metadata`` object (``{}`` when absent or null)."""
    metadata = index.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def is_delta_index(index: Mapping[str, Any]) -> bool:
    """INCREMENTAL iff the metadata has the key ``delta_encoding`` (section 3.1)."""
    return "delta_encoding" in index_metadata(index)


def check_delta_metadata(metadata: Mapping[str, Any], *, source: str) -> None:
    """Refuse delta metadata the engine cannot apply (section 5.2).

    Raises:
        SnapshotError: ``delta_encoding`` other than ``xor``, ``compression_format``
            other than ``zstd``, or ``checksum_format`` other than ``adler32``.
    """
    encoding = metadata.get("delta_encoding")
    if not isinstance(encoding, str) or encoding.lower() != DELTA_ENCODING:
        raise SnapshotError(
            f"{source}: delta_encoding {encoding!r} is not supported; write XOR deltas "
            "(--update-weight-delta-encoding xor)"
        )
    compression = metadata.get("compression_format")
    if compression is not None and (not isinstance(compression, str) or compression.lower() != COMPRESSION_FORMAT):
        raise SnapshotError(f"{source}: compression_format {compression!r} is not supported; use zstd")
    checksum = metadata.get("checksum_format")
    if not isinstance(checksum, str) or checksum.lower().replace("-", "") != CHECKSUM_FORMAT:
        raise SnapshotError(
            f"{source}: checksum_format {checksum!r} is not supported; pass `--update-weight-delta-checksum adler32`"
        )


def generated_index_bytes(header: SafetensorsHeader, shard: str = SINGLE_FILE_NAME) -> bytes:
    """The generated index of a lone ``model.safetensors`` (section 3.2).

    Raises:
        SnapshotError: the header has no tensors.
    """
    if not header.tensors:
        raise SnapshotError(f"{shard}: no tensors in the safetensors header")
    obj = {
        "metadata": {"total_size": sum(t.nbytes for t in header.tensors.values())},
        "weight_map": {name: shard for name in header.tensors},
    }
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


def serialize_index(index: Mapping[str, Any]) -> bytes:
    """Section 5.2 serialisation: ASCII escapes, key order kept, 1-space indent, no newline."""
    return json.dumps(index, indent=1, separators=(",", ": "), ensure_ascii=True).encode("ascii")


def local_index_bytes(index: Mapping[str, Any]) -> bytes:
    """The compact one-line on-disk index form (cwtrain, slime and miles)."""
    return json.dumps(index, ensure_ascii=True).encode("ascii")


def upload_index_bytes(index: Mapping[str, Any], *, version: str, base_version: str) -> bytes:
    """The uploaded delta index (section 5.2): metadata rewritten, all else untouched.

    ``version`` and ``base_version`` become the snapshot and predecessor identities;
    the encoding keys are set to ``xor``/``zstd``/``adler32``; other metadata keys
    stay in place and missing ones are appended in the order of the spec.
    """
    values = {
        "version": version,
        "base_version": base_version,
        "delta_encoding": DELTA_ENCODING,
        "compression_format": COMPRESSION_FORMAT,
        "checksum_format": CHECKSUM_FORMAT,
    }
    metadata = dict(index_metadata(index))
    for key in _DELTA_KEYS:
        metadata[key] = values[key]  # existing keys keep their place, new ones append
    out = {key: (metadata if key == "metadata" else value) for key, value in index.items()}
    out.setdefault("metadata", metadata)
    return serialize_index(out)


# -------------------------------------------------------------------------- identities


def validate_identity(identity: str, *, what: str = "identity", allow_reserved: bool = False) -> str:
    """Check a snapshot identity (section 2) and return it.

    1-128 characters, one path segment (no ``/``, not ``.`` or ``..``), and not one
    of the reserved names (``initial``, ``_manifests``, ``_preflight``) unless
    ``allow_reserved``.

    Raises:
        SnapshotError: the identity is invalid, with the rule it breaks.
    """
    if not isinstance(identity, str) or not 1 <= len(identity) <= 128:
        raise SnapshotError(f"invalid {what} {identity!r}: must be 1-128 characters")
    if "/" in identity or identity in (".", ".."):
        raise SnapshotError(f"invalid {what} {identity!r}: must be one path segment (no '/', not '.' or '..')")
    if not allow_reserved and identity in RESERVED_IDENTITIES:
        raise SnapshotError(f"invalid {what} {identity!r}: reserved name; choose another identity")
    return identity


def version_identity(run_id: str, version: int) -> str:
    """``<run_id>-v{version:06d}`` (six digits or more)."""
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    return f"{run_id}-v{version:06d}"


def identity_for_base_version(base_version: str | None) -> str:
    """Default predecessor identity of a delta from its index ``base_version`` (section 2).

    All digits → ``weight_v{int:06d}``; another value is used as is.

    Raises:
        SnapshotError: ``base_version`` is absent (pass ``--previous-identity``).
    """
    if base_version is None or base_version == "":
        raise SnapshotError(
            "the delta index has no metadata.base_version; pass --previous-identity to name its predecessor"
        )
    text = str(base_version)
    if text.isdigit() and text.isascii():
        return f"weight_v{int(text):06d}"
    return text


def snapshot_prefix(path_prefix: str, identity: str) -> str:
    """The object-key prefix of a snapshot: ``P/<identity>``, or ``<identity>`` when ``P`` is empty."""
    prefix = (path_prefix or "").strip("/")
    return f"{prefix}/{identity}" if prefix else identity


def shard_name(index: int, count: int) -> str:
    """``model-{index:05d}-of-{count:05d}.safetensors`` (0-based ``index``)."""
    return f"model-{index:05d}-of-{count:05d}.safetensors"


SHARD_NAME_RE = re.compile(r"^model-(\d{5,})-of-(\d{5,})\.safetensors$")

# -------------------------------------------------------------------------- chain rules


def full_every_from_env(environ: Mapping[str, str] | None = None, default: int = DEFAULT_FULL_EVERY) -> int:
    """``CWTRAIN_HOTLOAD_FULL_EVERY``: 0-64, default 20.

    Raises:
        ConfigError: not an integer in 0..64.
    """
    return env_int("CWTRAIN_HOTLOAD_FULL_EVERY", default, environ, minimum=0, maximum=MAX_FULL_EVERY)


def check_full_every(full_every: int) -> int:
    """Validate a cadence value given explicitly."""
    if isinstance(full_every, bool) or not isinstance(full_every, int) or not 0 <= full_every <= MAX_FULL_EVERY:
        raise ConfigError(f"full_every={full_every!r} must be an integer in 0..{MAX_FULL_EVERY}")
    return full_every


def is_chain_cut(version: int, full_every: int, deltas_in_chain: int) -> bool:
    """Whether version ``version`` must be published FULL.

    True when ``full_every > 0`` and ``version % full_every == 0``, and in any case
    when one more delta would make the chain longer than :data:`MAX_CHAIN_DELTAS`.

    Args:
        version: the version number about to be published.
        full_every: the cadence (0 = never by count).
        deltas_in_chain: deltas published since the chain's FULL root.
    """
    check_full_every(full_every)
    if full_every > 0 and version % full_every == 0:
        return True
    return deltas_in_chain + 1 > MAX_CHAIN_DELTAS
