"""Tensor bytes as the snapshot modules see them: :class:`TensorData` and :class:`FileRegion`.

A checkpoint in memory is a ``Mapping[str, TensorData]``: each tensor's safetensors
dtype name, shape and raw little-endian bytes, either in any bytes-like (``bytes``,
``memoryview``, a C-contiguous numpy array) or as a :class:`FileRegion` of a file that
is read on demand with ``pread`` (never memory-mapped). :func:`to_tensor_data` turns a
mapping of numpy arrays, torch tensors or ``TensorData`` into that form (torch tensors
are copied to host memory once; torch is never imported here unless one is given)::

    tensors = to_tensor_data({"lm_head.weight": np.zeros((2, 2), np.float32)})
    tensors["lm_head.weight"].dtype, tensors["lm_head.weight"].nbytes   # "F32", 16

numpy has no bfloat16: BF16 weights go over as ``TensorData("BF16", shape, raw_bytes)``
(or as ``torch.bfloat16`` tensors). :func:`check_published_tensors` is what publishing
arrays checks before anything is encoded (dtypes against the served ones, ``config.json``).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Buffer, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from cwtrain.errors import SnapshotError
from cwtrain.hotload.safetensors import safetensors_dtype

__all__ = ["DtypeWarning", "FileRegion", "TensorData", "as_tensor_data", "check_published_tensors", "to_tensor_data"]


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


class DtypeWarning(UserWarning):
    """Tensors of a FULL snapshot in another dtype than the one ``config.json`` says the model is served in.

    A warning, not an error: some checkpoints keep a few tensors wider on purpose.
    ``warnings.simplefilter("error", DtypeWarning)`` makes it one.
    """


#: The floating-point dtypes compared with ``config.json``'s ``torch_dtype`` (8-bit and
#: narrower ones are quantized weights, which keep their own dtype by design).
_WIDE_FLOATS = frozenset({"F16", "BF16", "F32", "F64"})
_HOTLOAD_DIR = os.path.dirname(os.path.abspath(__file__))


def _dtype_and_shape(value: Any) -> tuple[str | None, tuple[int, ...]]:
    """A tensor's safetensors dtype and shape, without copying its bytes anywhere."""
    if isinstance(value, TensorData):
        return value.dtype, tuple(value.shape)
    dtype = getattr(value, "dtype", None)
    name = getattr(dtype, "name", None) if isinstance(value, np.ndarray) else str(dtype)
    return safetensors_dtype(str(name)), tuple(int(d) for d in getattr(value, "shape", ()))


def _listed(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_published_tensors(
    tensors: Mapping[str, Any],
    *,
    base: Mapping[str, Any] | None,
    extra_files: Mapping[str, bytes] | None,
    delta: bool,
) -> None:
    """What publishing in-memory tensors checks first (``HotLoader.publish``, ``SnapshotStore.upload_tensors``).

    The served dtype is the one to publish in (snapshot-format.md 3.1: a snapshot's names,
    dtypes and shapes equal the served model's). It is known exactly where ``base`` is
    given (the weights replicas serve), and declared by ``config.json``'s ``torch_dtype``
    for a FULL snapshot:

    - a delta (``delta``, against ``base``): a tensor whose dtype differs from the served
      one is an error naming both (an XOR delta cannot change a dtype, and the usual cause
      is numpy's float32 standing in for BF16);
    - a FULL snapshot needs ``config.json`` in ``extra_files`` (a JSON object), like a
      FULL directory; with ``base`` its names, dtypes and shapes must equal the served
      ones (an error otherwise);
    - a FULL snapshot's F16/BF16/F32/F64 tensors in another dtype than ``config.json``'s
      ``torch_dtype`` (or ``dtype``) give one :class:`DtypeWarning` naming the served
      dtype; not with a ``quantization_config`` (mixed dtypes by design), nor without a
      declared dtype.

    Raises:
        SnapshotError: as above.
    """
    if delta and base is not None:
        changed = []
        for name, value in tensors.items():
            if name in base:
                mine, served = _dtype_and_shape(value)[0], _dtype_and_shape(base[name])[0]
                if mine is not None and served is not None and mine != served:
                    changed.append(f"{name!r} is {mine}, served as {served}")
        if changed:
            raise SnapshotError(
                f"the delta's tensors must keep the served dtypes: {'; '.join(changed[:3])}"
                + (f" (and {len(changed) - 3} more)" if len(changed) > 3 else "")
                + "; convert them (numpy has no bfloat16: pass TensorData('BF16', shape, raw_bytes) or "
                "torch.bfloat16 tensors)"
            )
        return
    if delta:
        return
    raw = (extra_files or {}).get("config.json")
    if raw is None:
        raise SnapshotError(
            "a FULL snapshot needs the model's config.json: pass extra_files={'config.json': <its bytes>} "
            "(the served model's own, with its torch_dtype)"
        )
    try:
        config = json.loads(bytes(raw))
    except (ValueError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"config.json of the FULL snapshot is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise SnapshotError(f"config.json of the FULL snapshot must be a JSON object, not {type(config).__name__}")
    if base is not None:
        problems = [f"{name!r} is missing" for name in base if name not in tensors]
        problems += [f"{name!r} is not served" for name in tensors if name not in base]
        for name, value in tensors.items():
            if name in base:
                ours, served_as = _dtype_and_shape(value), _dtype_and_shape(base[name])
                if ours[0] is not None and served_as[0] is not None and ours != served_as:
                    problems.append(
                        f"{name!r} is {ours[0]} {list(ours[1])}, served as {served_as[0]} {list(served_as[1])}"
                    )
        if problems:
            raise SnapshotError(
                f"a FULL snapshot must match the served weights (base=) in names, dtypes and shapes: "
                f"{'; '.join(problems[:3])}" + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
            )
    declared = config.get("torch_dtype", config.get("dtype"))
    served = safetensors_dtype(declared) if isinstance(declared, str) else None
    if served is None or "quantization_config" in config:
        return
    others = [
        name for name, value in tensors.items() if (d := _dtype_and_shape(value)[0]) in _WIDE_FLOATS and d != served
    ]
    if others:
        found = sorted({str(_dtype_and_shape(tensors[n])[0]) for n in others})
        warnings.warn(
            DtypeWarning(
                f"{len(others)} of {len(tensors)} tensors are {'/'.join(found)} ({_listed(others)}) but config.json "
                f"declares torch_dtype {declared!r}: the model is served in {served}. Publish {served} tensors "
                f"(numpy has no bfloat16: TensorData('BF16', shape, raw_bytes) or torch.bfloat16)"
            ),
            skip_file_prefixes=(_HOTLOAD_DIR,),
        )
