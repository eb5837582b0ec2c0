"""Tensor bytes as the snapshot modules see them: :class:`TensorData` and :class:`FileRegion`.

A checkpoint in memory is a ``Mapping[str, TensorData]``: each tensor's safetensors
dtype name, shape and raw little-endian bytes, either in any bytes-like (``bytes``,
``memoryview``, a C-contiguous numpy array) or as a :class:`FileRegion` of a file that
is read on demand with ``pread`` (never memory-mapped). :func:`to_tensor_data` turns a
mapping of numpy arrays, torch tensors or ``TensorData`` into that form (torch tensors
are copied to host memory once; torch is never imported here unless one is given)::

    tensors = to_tensor_data({"lm_head.weight": np.zeros((2, 2), np.float32)})
    tensors["lm_head.weight"].dtype, tensors["lm_head.weight"].nbytes   # "F32", 16
"""

from __future__ import annotations

from collections.abc import Buffer, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from cwtrain.errors import SnapshotError
from cwtrain.hotload.format.fileio import pread_exact
from cwtrain.hotload.format.safetensors import safetensors_dtype

__all__ = [
    "FileRegion",
    "TensorData",
    "U8Array",
    "as_tensor_data",
    "as_uint8",
    "payload_nbytes",
    "to_tensor_data",
]

U8Array = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class FileRegion:
    """Tensor bytes that live in a file, read on demand (never memory-mapped).

    The encoder streams a region with ``pread`` into reused buffers; :meth:`read`
    returns the whole region.
    """

    fd: int
    offset: int
    nbytes: int
    #: What the file is (its path), for error messages.
    source: str = field(default="file", compare=False)

    def read(self) -> bytearray:
        """The region's bytes.

        Raises:
            SnapshotError: the file ended early (it shrank while being read).
        """
        return pread_exact(self.fd, self.nbytes, self.offset, source=self.source)


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


def as_uint8(data: Buffer | FileRegion) -> U8Array:
    """A flat ``uint8`` view of a bytes-like object (no copy; a :class:`FileRegion` is read).

    Raises:
        ValueError: a numpy array that is not C-contiguous.
    """
    if isinstance(data, FileRegion):
        return np.frombuffer(data.read(), dtype=np.uint8)
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            raise ValueError("tensor data must be C-contiguous")
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def payload_nbytes(data: Buffer | FileRegion) -> int:
    """Length of a bytes-like or a file region."""
    if isinstance(data, FileRegion):
        return data.nbytes
    return memoryview(data).nbytes


def as_tensor_data(name: str, value: Any) -> TensorData:
    """One tensor as :class:`TensorData` (raw little-endian bytes and safetensors dtype).

    Raises:
        SnapshotError: not a numpy array, torch tensor or ``TensorData``, or a dtype
            safetensors cannot store.
    """
    if isinstance(value, TensorData):
        return value
    if hasattr(value, "detach") and hasattr(value, "dtype"):  # a torch tensor
        code = safetensors_dtype(str(value.dtype))
        if code is None:
            raise SnapshotError(f"tensor {name!r}: dtype {value.dtype} has no safetensors name")
        shape = tuple(int(d) for d in value.shape)
        import torch

        flat = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        return TensorData(code, shape, flat.numpy())
    if isinstance(value, np.ndarray):
        code = safetensors_dtype(value.dtype.name)
        if code is None:
            raise SnapshotError(f"tensor {name!r}: numpy dtype {value.dtype} has no safetensors name")
        array = np.ascontiguousarray(value)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        return TensorData(code, tuple(int(d) for d in value.shape), array.reshape(-1).view(np.uint8))
    raise SnapshotError(f"tensor {name!r}: {type(value).__name__} is not a numpy array, torch tensor or TensorData")


def to_tensor_data(tensors: Mapping[str, Any]) -> dict[str, TensorData]:
    """Every tensor of a checkpoint as :class:`TensorData`, in the mapping's order.

    Raises:
        SnapshotError: the mapping is empty, or a tensor :func:`as_tensor_data` refuses.
    """
    if not tensors:
        raise SnapshotError("no tensors to publish")
    return {str(name): as_tensor_data(str(name), value) for name, value in tensors.items()}
