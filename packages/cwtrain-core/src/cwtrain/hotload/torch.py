"""The codec for torch tensors where they live (GPU or CPU).

Needs torch (``pip install "cwtrain[torch]"``); imported only when used.

::

    from cwtrain.hotload.torch import TorchDeltaEncoder

    with TorchDeltaEncoder() as encoder:
        snap = encoder.encode(model_state, served_state, version="run-v000003", base_version="run-v000002")

``new`` and ``base`` map names to tensors on the same device (``base`` may also hold
:class:`~cwtrain.hotload.format.TensorData`, copied to the device batch by batch).
Per batch of at most half the ``memory_budget`` (two batches are in flight: the
next one runs on the device while the previous one compresses): XOR and change
detection run on the device, one host synchronisation reads the "changed" flags (and, off the CPU, the
Adler-32s, computed on the device); only the XOR of changed tensors is copied, once,
into a reused host buffer (pinned when CUDA is available); then zstd runs in the
numpy encoder's thread pool. The output is byte-identical to
:class:`~cwtrain.hotload.codec.DeltaEncoder` on the same bytes. On CPU tensors the
same code runs (the Adler-32 of the new bytes is then taken on the host), which is how
CI tests it.

Helpers: :func:`safetensors_dtype` (torch dtype → safetensors name),
:func:`tensor_data` (a CPU :class:`TensorData` view of a tensor), :func:`device_adler32`.
"""

from __future__ import annotations

import time
from collections.abc import Buffer, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from cwtrain.errors import SnapshotError
from cwtrain.hotload.codec import DeltaEncoder, EncodedSnapshot, ShardSink, TensorResult
from cwtrain.hotload.decode import U8Array
from cwtrain.hotload.format import DEFAULT_SHARD_BYTES, adler32
from cwtrain.hotload.safetensors import FRAMEWORK_DTYPES
from cwtrain.hotload.tensors import TensorData

__all__ = [
    "TORCH_DTYPES",
    "TorchDeltaEncoder",
    "device_adler32",
    "safetensors_dtype",
    "tensor_bytes",
    "tensor_data",
]

#: torch dtype → safetensors dtype name (from the one table, :data:`~cwtrain.hotload.safetensors.FRAMEWORK_DTYPES`).
TORCH_DTYPES: dict[torch.dtype, str] = {
    getattr(torch, name): code
    for name, code in FRAMEWORK_DTYPES.items()
    if isinstance(getattr(torch, name, None), torch.dtype)
}

_MOD = 65521
_ADLER_BLOCK = 1 << 23  # int32 products j * b stay below 2**31


def safetensors_dtype(dtype: torch.dtype) -> str:
    """The safetensors name of a torch dtype.

    Raises:
        SnapshotError: a dtype safetensors cannot store.
    """
    name = TORCH_DTYPES.get(dtype)
    if name is None:
        raise SnapshotError(f"torch dtype {dtype} has no safetensors equivalent")
    return name


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bytes as a flat ``uint8`` tensor on its device (contiguous copy if needed)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def tensor_data(tensor: torch.Tensor) -> TensorData:
    """A :class:`TensorData` of the tensor's bytes on the host (a view when already on the CPU)."""
    raw = tensor_bytes(tensor)
    if raw.device.type != "cpu":
        raw = raw.cpu()
    return TensorData(safetensors_dtype(tensor.dtype), tuple(tensor.shape), raw.numpy())


def device_adler32(data: torch.Tensor) -> int:
    """Adler-32 of a flat ``uint8`` tensor, computed on its device (one host sync)."""
    return _adler_finish(data.numel(), _adler_parts(data).cpu().tolist())


def _adler_parts(data: torch.Tensor) -> torch.Tensor:
    """Per-block ``[sum b, sum j*b]`` on the device (``int64``, shape ``[blocks, 2]``)."""
    n = data.numel()
    sums = []
    for start in range(0, n, _ADLER_BLOCK):
        block = data[start : start + _ADLER_BLOCK].to(torch.int32)
        weights = torch.arange(block.numel(), device=data.device, dtype=torch.int32)
        sums.append(torch.stack([block.sum(dtype=torch.int64), (block * weights).sum(dtype=torch.int64)]))
    if not sums:
        return torch.zeros((0, 2), dtype=torch.int64, device=data.device)
    return torch.stack(sums)


def _adler_finish(n: int, parts: Sequence[Sequence[int]]) -> int:
    a = 1
    b = n
    for position, (s1, s2) in enumerate(parts):
        a += s1
        b += (n - position * _ADLER_BLOCK) * s1 - s2
    return ((b % _MOD) << 16) | (a % _MOD)


class TorchDeltaEncoder:
    """XOR deltas of torch tensors, byte-identical to the numpy :class:`DeltaEncoder`.

    Args:
        encoder: the numpy encoder whose pool and frame rule are used (default: a new one
            built from the other arguments, closed with this object).
        workers: compression threads.
        memory_budget: bytes of tensors XORed per batch (device temporaries and host buffer).
        shard_bytes: shard payload limit.
    """

    def __init__(
        self,
        encoder: DeltaEncoder | None = None,
        *,
        workers: int | None = None,
        memory_budget: int | None = None,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
    ) -> None:
        #: Adler-32 of the new bytes on the tensors' device (None: on the device unless it is the CPU).
        self.device_checksums: bool | None = None
        self._owned = encoder is None
        self.encoder = encoder or DeltaEncoder(workers=workers, memory_budget=memory_budget, shard_bytes=shard_bytes)
        self._host = [torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8)]

    def __enter__(self) -> TorchDeltaEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the numpy encoder if this object created it; drop the host buffer."""
        if self._owned:
            self.encoder.close()
        self._host = [torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8)]

    def _host_buffer(self, slot: int, n: int) -> torch.Tensor:
        if self._host[slot].numel() < n:
            self._host[slot] = torch.empty(n, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        return self._host[slot][:n]

    def encode(
        self,
        new: Mapping[str, torch.Tensor],
        base: Mapping[str, torch.Tensor | TensorData],
        *,
        version: str | None = None,
        base_version: str | None = None,
        sink: ShardSink | None = None,
    ) -> EncodedSnapshot:
        """Encode the delta from ``base`` to ``new`` (see the module docstring).

        Raises:
            SnapshotError: tensor sets, dtypes or shapes differ (publish FULL instead).
        """
        start = time.perf_counter()
        names = _check(new, base)
        results = self._results(names, new, base)
        return self.encoder.assemble(results, start=start, version=version, base_version=base_version, sink=sink)

    def _batches(self, names: Sequence[str], new: Mapping[str, torch.Tensor]) -> Iterator[list[str]]:
        """Groups of tensors of at most half the budget each (two batches are in flight)."""
        limit = max(1, self.encoder.memory_budget // 2)
        batch: list[str] = []
        size = 0
        for name in names:
            nbytes = new[name].numel() * new[name].element_size()
            if batch and size + nbytes > limit:
                yield batch
                batch, size = [], 0
            batch.append(name)
            size += nbytes
        if batch:
            yield batch

    def _results(
        self, names: Sequence[str], new: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor | TensorData]
    ) -> Iterator[TensorResult]:
        # Batch k+1 runs on the device while batch k compresses on the CPU; host buffers alternate.
        pending: list[_Launched] | None = None
        try:
            for position, batch in enumerate(self._batches(names, new)):
                launched = self._launch(batch, new, base, slot=position % 2)
                if pending is not None:
                    yield from _collect(pending)
                pending = launched
            if pending is not None:
                yield from _collect(pending)
                pending = None
        finally:
            leftover: list[_Launched] = pending or []
            for item in leftover:
                if item.future is not None:
                    item.future.cancel()

    def _launch(
        self,
        batch: list[str],
        new: Mapping[str, torch.Tensor],
        base: Mapping[str, torch.Tensor | TensorData],
        *,
        slot: int,
    ) -> list[_Launched]:
        xors: list[torch.Tensor] = []
        flags: list[torch.Tensor] = []
        adlers: list[int] = [1] * len(batch)
        parts: list[tuple[int, torch.Tensor]] = []
        for position, name in enumerate(batch):
            current = tensor_bytes(new[name])
            old = _base_bytes(base[name], current.device)
            xor = torch.bitwise_xor(current, old)
            xors.append(xor)
            flags.append(xor.any() if xor.numel() else torch.zeros((), dtype=torch.bool, device=xor.device))
            on_device = self.device_checksums if self.device_checksums is not None else current.device.type != "cpu"
            if on_device:
                parts.append((position, _adler_parts(current)))
            else:
                adlers[position] = adler32(current.numpy())
        # one host synchronisation per batch: the change flags and the device Adler-32 sums
        changed = torch.stack(flags).cpu().tolist() if flags else []
        if parts:
            host_parts = torch.cat([p.to("cpu") for _, p in parts]).tolist()
            start = 0
            for position, part in parts:
                count = part.shape[0]
                nbytes = new[batch[position]].numel() * new[batch[position]].element_size()
                adlers[position] = _adler_finish(nbytes, host_parts[start : start + count])
                start += count
        total = sum(x.numel() for x, c in zip(xors, changed) if c)
        host = self._host_buffer(slot, total)
        views: dict[int, U8Array] = {}
        offset = 0
        for position, (xor, flag) in enumerate(zip(xors, changed)):
            if not flag:
                continue
            part = host[offset : offset + xor.numel()]
            part.copy_(xor, non_blocking=True)
            views[position] = part.numpy()
            offset += xor.numel()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        del xors
        out = []
        for position, name in enumerate(batch):
            nbytes = new[name].numel() * new[name].element_size()
            future = None
            if position in views:
                future = self.encoder.pool.submit(self.encoder.compress_xor, views[position])
            out.append(_Launched(name, nbytes, adlers[position], future))
        return out


@dataclass
class _Launched:
    name: str
    nbytes: int
    adler: int
    future: Future[list[Buffer]] | None


def _collect(launched: list[_Launched]) -> Iterator[TensorResult]:
    for item in launched:
        pieces = item.future.result() if item.future is not None else None
        yield TensorResult(item.name, item.nbytes, item.adler, pieces)


def _base_bytes(value: torch.Tensor | TensorData, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        raw = tensor_bytes(value)
        return raw if raw.device == device else raw.to(device)
    from cwtrain.hotload.decode import as_uint8

    array = as_uint8(value.data)
    if not array.flags.writeable:
        array = np.array(array)
    return torch.from_numpy(array).to(device)


def _check(new: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor | TensorData]) -> list[str]:
    missing = sorted(set(base) - set(new))
    extra = sorted(set(new) - set(base))
    if missing or extra:
        raise SnapshotError(
            f"tensor sets differ (new only: {', '.join(extra[:5]) or '-'}; base only: {', '.join(missing[:5]) or '-'}); "
            "publish a FULL snapshot instead"
        )
    names = sorted(new)
    for name in names:
        a, b = new[name], base[name]
        dtype = safetensors_dtype(a.dtype)
        if isinstance(b, torch.Tensor):
            b_dtype, b_shape = safetensors_dtype(b.dtype), tuple(b.shape)
        else:
            b_dtype, b_shape = b.dtype, tuple(b.shape)
        if (dtype, tuple(a.shape)) != (b_dtype, b_shape):
            raise SnapshotError(
                f"tensor {name!r} changed from {b_dtype} {list(b_shape)} to {dtype} {list(a.shape)}; "
                "a delta cannot change dtypes or shapes: publish a FULL snapshot instead"
            )
        if a.device.type != "cpu" and isinstance(b, torch.Tensor) and b.device != a.device:
            raise SnapshotError(f"tensor {name!r}: new is on {a.device}, base on {b.device}; keep both on one device")
    return names
