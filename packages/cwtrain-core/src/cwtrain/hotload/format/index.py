"""The snapshot wire format: index JSON, shard names, snapshot files and checksums.

Everything here is byte-exact to ``shared/spec/snapshot-format.md``; nothing here
touches the network or torch. The neighbours: :mod:`cwtrain.hotload.format.safetensors`
(the container: dtypes and headers), :mod:`cwtrain.hotload.format.tensors` (tensor bytes,
:class:`~cwtrain.hotload.format.tensors.TensorData`), :mod:`cwtrain.hotload.format.identity`
(identities and key prefixes) and :mod:`cwtrain.hotload.format.chain` (chain rules and the
FULL cadence). The codec (:mod:`cwtrain.hotload.codec.encode`) builds on all of them.

:class:`SnapshotFile` ``(name, buffers)`` is one finished file of a snapshot; its bytes
are the concatenation of ``buffers`` (for a shard: the header, then one payload per
tensor), so nothing is copied into one big buffer. ``.size`` is the total length.

Index JSON (sections 3 and 5)::

    index = parse_index(raw, source="ckpt/model.safetensors.index.json")
    is_delta_index(index)                            # INCREMENTAL iff metadata has "delta_encoding"
    check_delta_metadata(index["metadata"], source=...)   # xor / zstd / adler32, or SnapshotError
    generated_index_bytes(header)                    # 3.2: the index of a lone model.safetensors
    upload_index_bytes(index, version=..., base_version=...)  # 5.2: the uploaded delta index
    serialize_index(index)                           # 5.2 serialisation (also FULL cuts)
    local_index_bytes(index)                         # the compact on-disk delta index

Shard names: :func:`shard_name` (deltas, 0-based) and :func:`full_shard_name` (FULL
snapshots, HuggingFace's 1-based names). Checksums live in :mod:`cwtrain.hotload.format.checksum`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Buffer, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from cwtrain.errors import SnapshotError, SnapshotNotFoundError
from cwtrain.hotload.format.safetensors import SafetensorsHeader, read_header

__all__ = [
    "CHECKSUM_FORMAT",
    "COMPRESSION_FORMAT",
    "DEFAULT_SHARD_BYTES",
    "DELTA_ENCODING",
    "INDEX_NAME",
    "SHARD_NAME_RE",
    "SINGLE_FILE_NAME",
    "SnapshotFile",
    "DirectoryIndex",
    "check_delta_metadata",
    "full_shard_name",
    "generated_index",
    "generated_index_bytes",
    "index_metadata",
    "is_delta_index",
    "local_index_bytes",
    "parse_index",
    "read_directory_index",
    "read_index_file",
    "serialize_index",
    "shard_name",
    "upload_index_bytes",
]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_FILE_NAME = "model.safetensors"
DELTA_ENCODING = "xor"
COMPRESSION_FORMAT = "zstd"
CHECKSUM_FORMAT = "adler32"
#: cwtrain closes a delta shard before its payload would pass this many bytes.
DEFAULT_SHARD_BYTES = 2 << 30


_DELTA_KEYS = ("version", "base_version", "delta_encoding", "compression_format", "checksum_format")

# ------------------------------------------------------------------------------- files


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
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SnapshotError(f"{source}: invalid index JSON ({str(exc)[:200]})") from None
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
        if (
            not isinstance(shard, str)
            or not shard.endswith(".safetensors")
            or "/" in shard
            or "\0" in shard
            or shard.startswith(".")
            or not shard.isprintable()
            or not _encodable(shard)
        ):
            shown = repr(shard)[:80]
            raise SnapshotError(
                f"{source}: tensor {tensor[:80]!r} maps to {shown}, not an immediate *.safetensors file"
            )
    return obj


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_index_file(path: str | Path) -> dict[str, Any]:
    """Read and parse an index file (:func:`parse_index`)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SnapshotNotFoundError(f"{path}: no such index file") from None
    return parse_index(raw, source=str(path))


class DirectoryIndex(NamedTuple):
    """The index of a snapshot directory: its file's, or the one generated for a lone ``model.safetensors``.

    Attributes:
        parsed: the parsed index.
        header: the lone file's header when the index was generated (``None`` when the
            directory has an index file); :func:`generated_index_bytes` gives the bytes.
    """

    parsed: dict[str, Any]
    header: SafetensorsHeader | None = None


def read_directory_index(root: str | Path) -> DirectoryIndex:
    """The index of the snapshot directory ``root`` (sections 3.1 and 3.2).

    Raises:
        SnapshotNotFoundError: neither ``model.safetensors.index.json`` nor a lone
            ``model.safetensors``.
        SnapshotError: the index, or the lone file's header, is invalid.
    """
    root = Path(root)
    index_path, single = root / INDEX_NAME, root / SINGLE_FILE_NAME
    if index_path.is_file():
        return DirectoryIndex(parse_index(index_path.read_bytes(), source=str(index_path)))
    if single.is_file():
        header = read_header(single)
        return DirectoryIndex(generated_index(header), header)
    raise SnapshotNotFoundError(f"{root}: no {INDEX_NAME} (and no lone {SINGLE_FILE_NAME})")


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


def generated_index(header: SafetensorsHeader, shard: str = SINGLE_FILE_NAME) -> dict[str, Any]:
    """The index a lone ``model.safetensors`` gets (section 3.2), as :func:`parse_index` would read its bytes.

    Built from the header directly, without a JSON round trip (a header of a million
    tensors costs a second less).

    Raises:
        SnapshotError: the header has no tensors.
    """
    if not header.tensors:
        raise SnapshotError(f"{shard}: no tensors in the safetensors header")
    return {
        "metadata": {"total_size": sum(t.nbytes for t in header.tensors.values())},
        "weight_map": dict.fromkeys(sorted(header.tensors), shard),
    }


def generated_index_bytes(header: SafetensorsHeader, shard: str = SINGLE_FILE_NAME) -> bytes:
    """The bytes of :func:`generated_index` (section 3.2: sorted keys, two-space indent, newline).

    Raises:
        SnapshotError: the header has no tensors.
    """
    text = json.dumps(generated_index(header, shard), indent=2, sort_keys=True, ensure_ascii=True)
    return (text + "\n").encode("ascii")


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


# ------------------------------------------------------------------------- shard names


def shard_name(index: int, count: int) -> str:
    """A delta shard's name: ``model-{index:05d}-of-{count:05d}.safetensors``, 0-based ``index`` (section 5.1)."""
    return f"model-{index:05d}-of-{count:05d}.safetensors"


def full_shard_name(index: int, count: int) -> str:
    """A FULL snapshot's shard name, HuggingFace style: ``model-{index + 1:05d}-of-{count:05d}.safetensors``.

    ``index`` is 0-based; the name is 1-based, as HuggingFace and NeMo-RL exports write it.
    """
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


SHARD_NAME_RE = re.compile(r"^model-(\d{5,})-of-(\d{5,})\.safetensors$")
