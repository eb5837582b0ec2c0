"""Publishing from in-memory tensors: convert, encode, stream into the upload.

Used by :meth:`cwtrain.hotload.loader.HotLoader.publish` when it is given a mapping of
name → tensor instead of a directory. Tensors may be
:class:`~cwtrain.hotload.format.TensorData`, numpy arrays or torch tensors (copied to
host memory once; torch is never imported here). The codec encodes a FULL snapshot
with checksums, or an XOR delta against ``base``; its files go straight into
:class:`~cwtrain.hotload.upload.SnapshotUpload` (index last), never to disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from cwtrain.errors import SnapshotError
from cwtrain.hotload.format import SnapshotFile, TensorData
from cwtrain.infra.enums import SnapshotType

if TYPE_CHECKING:
    from cwtrain.hotload.loader import HotLoader

__all__ = ["as_tensor_data", "to_tensor_data", "upload_tensors"]

_NUMPY_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}


def as_tensor_data(name: str, value: Any) -> TensorData:
    """One tensor as :class:`TensorData` (raw little-endian bytes and safetensors dtype)."""
    if isinstance(value, TensorData):
        return value
    if hasattr(value, "detach") and hasattr(value, "dtype"):  # a torch tensor
        dtype_name = str(value.dtype).removeprefix("torch.")
        code = _NUMPY_DTYPES.get(dtype_name)
        if code is None:
            raise SnapshotError(f"tensor {name!r}: dtype {value.dtype} has no safetensors name")
        shape = tuple(int(d) for d in value.shape)
        import torch

        flat = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        return TensorData(code, shape, flat.numpy())
    if isinstance(value, np.ndarray):
        code = _NUMPY_DTYPES.get(value.dtype.name)
        if code is None:
            raise SnapshotError(f"tensor {name!r}: numpy dtype {value.dtype} has no safetensors name")
        array = np.ascontiguousarray(value)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        return TensorData(code, tuple(int(d) for d in value.shape), array.reshape(-1).view(np.uint8))
    raise SnapshotError(f"tensor {name!r}: {type(value).__name__} is not a numpy array, torch tensor or TensorData")


def to_tensor_data(tensors: Mapping[str, Any]) -> dict[str, TensorData]:
    """Every tensor of a checkpoint as :class:`TensorData`, in the mapping's order."""
    if not tensors:
        raise SnapshotError("no tensors to publish")
    return {str(name): as_tensor_data(str(name), value) for name, value in tensors.items()}


def upload_tensors(
    loader: HotLoader,
    tensors: Mapping[str, Any],
    identity: str,
    previous_identity: str | None,
    base: Mapping[str, Any] | None,
    workers: int,
    extra_files: Mapping[str, bytes] | None = None,
) -> SnapshotType:
    """Encode ``tensors`` and upload them under ``identity``; returns the snapshot type.

    FULL when ``previous_identity`` is ``None``; else a delta against ``base``.

    Raises:
        SnapshotError: a delta without ``base``, an empty delta (nothing changed, so
            nothing to publish), a chain too long, or tensors the codec refuses.
    """
    from cwtrain.hotload.codec import DeltaEncoder
    from cwtrain.hotload.upload import SnapshotUpload

    new = to_tensor_data(tensors)
    kind = SnapshotType.INCREMENTAL if previous_identity else SnapshotType.FULL
    with DeltaEncoder() as encoder:
        if previous_identity:
            if base is None:
                raise SnapshotError(
                    f"publishing {identity!r} as a delta on {previous_identity!r} needs base= (the weights replicas "
                    "serve now); without it, publish FULL (no previous_identity)"
                )
            loader._check_chain(identity, previous_identity)
            snap = encoder.encode(new, to_tensor_data(base), version=identity, base_version=previous_identity)
            if snap.empty:
                raise SnapshotError(
                    f"no tensor changed between {previous_identity!r} and {identity!r}: an empty delta is never "
                    "published; keep serving the previous identity"
                )
        else:
            snap = encoder.encode_full(new)
        with SnapshotUpload(
            loader.s3, bucket=loader._bucket, identity=identity, path_prefix=loader._prefix, workers=workers
        ) as upload:
            for name, data in (extra_files or {}).items():
                upload.add(SnapshotFile.from_bytes(name, data))
            for file in snap.files:
                upload.add(file)
            upload.commit(snap.index)
    return kind
