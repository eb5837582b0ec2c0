"""Checksums of the format: Adler-32 of bytes and of a tensor, and a shard's checksum metadata.

::

    adler32(data)                 # zlib's Adler-32 (python-isal when installed, same values)
    adler32_hex(data)             # "097901fd": the form shards and manifests store (section 3.3)
    tensor_adler32(tensor.data)   # of a tensor's bytes in memory or in a file region, 1 MiB at a time
    checksum_metadata(existing, {"w": "097901fd"}, source="model.safetensors")
"""

from __future__ import annotations

import zlib
from collections.abc import Buffer, Mapping

from cwtrain.errors import SnapshotError
from cwtrain.hotload.format.fileio import pread_into
from cwtrain.hotload.format.tensors import FileRegion, U8Array, as_uint8

__all__ = ["CHUNK_BYTES", "adler32", "adler32_hex", "checksum_metadata", "is_checksum", "tensor_adler32"]

#: Bytes of a file region read at a time when its checksum is computed.
CHUNK_BYTES = 1 << 20

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


def is_checksum(text: str) -> bool:
    """Whether ``text`` has the form of a shard checksum: 8 lowercase hex digits."""
    return len(text) == 8 and all(c in "0123456789abcdef" for c in text)


def checksum_metadata(
    existing: Mapping[str, str] | None, checksums: Mapping[str, str], *, source: str
) -> dict[str, str]:
    """A shard's ``__metadata__`` with one Adler-32 per tensor (section 3.3).

    Existing entries come first; a tensor's existing checksum is updated in place, the
    others are appended in the order of ``checksums``.

    Raises:
        SnapshotError: a tensor is named like an existing entry that is not a checksum
            (a tensor ``format`` beside ``"format": "pt"``): its checksum would replace
            that entry, and readers could not tell the two apart.
    """
    metadata = dict(existing or {})
    clashes = [name for name in checksums if name in metadata and not is_checksum(metadata[name])]
    if clashes:
        shown = ", ".join(f"{name!r} (= {metadata[name][:40]!r})" for name in clashes[:3])
        raise SnapshotError(
            f"{source}: tensor names clash with the shard's __metadata__ entries {shown}; a checksum "
            "would overwrite them: rename the tensors or drop those entries"
        )
    metadata.update(checksums)
    return metadata


def tensor_adler32(data: Buffer | FileRegion, scratch: U8Array | None = None) -> int:
    """Adler-32 of a tensor's bytes; a :class:`FileRegion` is read 1 MiB at a time.

    Args:
        data: the bytes, in memory or in a file region.
        scratch: a reusable buffer of at least :data:`CHUNK_BYTES` for file regions
            (default: one allocated for the call).
    """
    if not isinstance(data, FileRegion):
        return adler32(as_uint8(data))
    import numpy as np

    buffer = scratch if scratch is not None and scratch.nbytes >= CHUNK_BYTES else np.empty(CHUNK_BYTES, np.uint8)
    value = 1
    for position in range(0, data.nbytes, CHUNK_BYTES):
        chunk = buffer[: min(CHUNK_BYTES, data.nbytes - position)]
        pread_into(data.fd, chunk, data.offset + position, source=data.source)
        value = adler32(chunk, value)
    return value
