"""The codec for torch tensors where they live (GPU or CPU).

Needs torch (from a cwtrain checkout: ``pip install "./packages/cwtrain-core[torch]"``);
imported only when used; without torch, importing this module raises an ``ImportError``
that names that line.

::

    from cwtrain.hotload.codec.device import TorchDeltaEncoder

    with TorchDeltaEncoder() as encoder:
        snap = encoder.encode(model_state, served_state, version="run-v000003", base_version="run-v000002")

``new`` and ``base`` map names to tensors on the same device (``base`` may also hold
:class:`~cwtrain.hotload.format.index.TensorData`, copied to the device batch by batch).
Per batch of at most half the ``memory_budget`` (two batches are in flight: the
next one runs on the device while the previous one compresses): XOR and change
detection run on the device (:func:`xor_changed`: one XOR kernel and one reduction per
tensor, on ``int64`` views), one host synchronisation reads the "changed" flags (and,
off the CPU, the Adler-32 sums, computed on the device by :func:`device_adler32`); only
the XOR of changed tensors is copied, once, into a reused host buffer (pinned when CUDA
is available); then zstd runs in the numpy encoder's thread pool. The output is
byte-identical to :class:`~cwtrain.hotload.codec.encode.DeltaEncoder` on the same bytes. On
CPU tensors the same code runs (the Adler-32 of the new bytes is then taken on the host
unless ``device_checksums = True``, which runs the device algorithm on the CPU), which
is how CI tests it; ``scripts/gpu-check.sh`` runs the ``gpu`` tests and
``bench/gpu.py`` where a CUDA device exists.

**Device Adler-32.** Adler-32 is ``A = 1 + sum b_i`` and ``B = n + sum (n - i) b_i``
(mod 65521). The bytes are viewed as rows of 4096; ``b ^ 0x80`` read as int8 is
``b - 128``, so one int8 matrix product (``torch._int_mm``, tensor cores on a GPU)
against a constant ``[4096, 8]`` matrix of ones, ``j % 128`` and ``j // 128`` gives each
row's sums in int32; each row's position weight is applied to that small result in
int64. Every input byte is read once, block by block (32 MiB: the XOR with 0x80 lands
in scratch the product reads back, from L2 on a GPU); nothing tensor-sized is widened
to 32 bits.

Helpers: :func:`safetensors_dtype` (torch dtype → safetensors name),
:func:`tensor_data` (a CPU :class:`TensorData` view of a tensor), :func:`device_adler32`,
:func:`xor_changed`.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Buffer, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

try:
    import torch
except ModuleNotFoundError as _missing:  # say what to install, not just the module name
    if _missing.name != "torch":
        raise
    raise ModuleNotFoundError(
        "cwtrain.hotload.codec.device needs torch; install it from a cwtrain checkout: "
        'pip install "./packages/cwtrain-core[torch]"',
        name="torch",
    ) from None

from cwtrain.closing import Closing
from cwtrain.errors import SnapshotError
from cwtrain.hotload.codec.encode import DeltaEncoder, EncodedSnapshot, ShardSink, TensorResult
from cwtrain.hotload.format.checksum import adler32
from cwtrain.hotload.format.index import DEFAULT_SHARD_BYTES
from cwtrain.hotload.format.safetensors import FRAMEWORK_DTYPES
from cwtrain.hotload.format.tensors import TensorData, U8Array

__all__ = [
    "TORCH_DTYPES",
    "TorchDeltaEncoder",
    "device_adler32",
    "safetensors_dtype",
    "tensor_bytes",
    "tensor_data",
    "xor_changed",
]

#: torch dtype → safetensors dtype name (from the one table, :data:`~cwtrain.hotload.format.safetensors.FRAMEWORK_DTYPES`).
TORCH_DTYPES: dict[torch.dtype, str] = {
    getattr(torch, name): code
    for name, code in FRAMEWORK_DTYPES.items()
    if isinstance(getattr(torch, name, None), torch.dtype)
}

log = logging.getLogger(__name__)

_MOD = 65521
#: Bytes per row of the Adler-32 matrix product (a multiple of 128, at most 16384: every
#: int32 row sum stays below 2**31 and every weight fits int8).
_ADLER_ROW = 4096
#: Bytes per block of the Adler-32 (each block: one XOR into scratch, one int8 matrix product).
_ADLER_BLOCK = 32 << 20
#: cuBLAS's int8 product needs more than 16 rows; fewer go through the small exact path.
_MIN_ROWS = 17


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
    """Adler-32 of a flat ``uint8`` tensor, computed on its device (one host sync).

    Each input byte is read once (XOR with 0x80 into a block of scratch, which the
    product then reads, from cache on a GPU): no tensor-sized 32-bit copy is made.
    """
    return _adler_finish(data.numel(), _adler_sums(data).cpu().tolist())


def xor_changed(new: torch.Tensor, old: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``new ^ old`` of two flat ``uint8`` tensors on one device, and whether any bit is set.

    One XOR kernel and one reduction, on ``int64`` views (8x fewer elements) when the
    length and both offsets allow it. The flag stays on the device (a ``bool`` scalar), so
    a batch costs one host synchronisation.
    """
    if new.numel() == 0:
        return new.clone(), torch.zeros((), dtype=torch.bool, device=new.device)
    if new.numel() % 8 == 0 and new.storage_offset() % 8 == 0 and old.storage_offset() % 8 == 0:
        wide = torch.bitwise_xor(new.view(torch.int64), old.view(torch.int64))
        return wide.view(torch.uint8), wide.any()
    xor = torch.bitwise_xor(new, old)
    return xor, xor.any()


@functools.cache
def _adler_weights(row: int, device: torch.device) -> torch.Tensor:
    """The ``[row, 8]`` int8 right operand (column-major): columns 1, ``j % 128``, ``j // 128``, then zeros."""
    j = torch.arange(row, dtype=torch.int64)
    weights = torch.zeros((8, row), dtype=torch.int8)
    weights[0] = 1
    weights[1] = (j % 128).to(torch.int8)
    weights[2] = (j // 128).to(torch.int8)
    return weights.to(device).t()


def _adler_sums(data: torch.Tensor) -> torch.Tensor:
    """``[sum b_i, sum (n - i) b_i]`` modulo 65521 on the device (``int64``, shape ``[2]``).

    The bytes are rows of :data:`_ADLER_ROW`; per block of rows, ``b ^ 0x80`` read as
    int8 is ``b - 128``, and one int8 product against :func:`_adler_weights` gives every
    row's ``sum (b - 128)``, ``sum (j % 128)(b - 128)`` and ``sum (j // 128)(b - 128)``
    in int32. The constant offsets are added back on that ``[rows, 3]`` result, in int64,
    where each row's position weight ``(n - row * K) mod 65521`` is applied. The last
    bytes (fewer than a row, or a tensor of fewer than :data:`_MIN_ROWS` rows) are
    summed directly.
    """
    n = data.numel()
    device = data.device
    k = _ADLER_ROW
    rows = n // k if n // k >= _MIN_ROWS else 0
    sums = torch.zeros(2, dtype=torch.int64, device=device)
    if rows and not _int8_product_works(device):
        return _widening_sums(data)
    if rows:
        per_block = max(_MIN_ROWS, _ADLER_BLOCK // k)
        bounds = [*range(0, rows, per_block), rows]
        if len(bounds) > 2 and bounds[-1] - bounds[-2] < _MIN_ROWS:
            del bounds[-2]  # the last block joins the one before (cuBLAS's row minimum)
        scratch = torch.empty(max(b - a for a, b in itertools.pairwise(bounds)) * k, dtype=torch.uint8, device=device)
        products = torch.empty((rows, 8), dtype=torch.int32, device=device)
        weights = _adler_weights(k, device)
        for first, last in itertools.pairwise(bounds):
            block = scratch[: (last - first) * k]
            torch.bitwise_xor(data[first * k : last * k], 0x80, out=block)
            torch._int_mm(block.view(torch.int8).view(last - first, k), weights, out=products[first:last])
        parts = products[:, :3].to(torch.int64)
        groups = k // 128
        s_rows = parts[:, 0] + 128 * k
        t_rows = parts[:, 1] + 128 * parts[:, 2] + (128 * groups * 8128 + 128 * 128 * 128 * groups * (groups - 1) // 2)
        position = torch.remainder(n - k * torch.arange(rows, dtype=torch.int64, device=device), _MOD)
        sums[0] += s_rows.sum()
        sums[1] += torch.remainder((position * s_rows).sum() - t_rows.sum(), _MOD)
    if rows * k < n:
        tail = data[rows * k :].to(torch.int64)
        position = torch.remainder(n - torch.arange(rows * k, n, dtype=torch.int64, device=device), _MOD)
        sums[0] += tail.sum()
        sums[1] += (position * tail).sum()
    return torch.remainder(sums, _MOD)


@functools.cache
def _int8_product_works(device: torch.device) -> bool:
    """Whether ``torch._int_mm`` runs on ``device`` (checked once per device, on a tiny product)."""
    try:
        a = torch.ones((_MIN_ROWS, 128), dtype=torch.int8, device=device)
        product = torch._int_mm(a, _adler_weights(128, device))
        return int(product[0, 0]) == 128
    except RuntimeError as exc:
        log.warning("torch._int_mm is not available on %s (%s); device Adler-32 widens bytes instead", device, exc)
        return False


def _widening_sums(data: torch.Tensor) -> torch.Tensor:
    """What :func:`_adler_sums` returns, by widening 8 MiB blocks to int64 (for devices without the int8 product)."""
    n = data.numel()
    block = 1 << 23
    sums = torch.zeros(2, dtype=torch.int64, device=data.device)
    for start in range(0, n, block):
        values = data[start : start + block].to(torch.int64)
        position = torch.remainder(
            n - torch.arange(start, start + values.numel(), dtype=torch.int64, device=data.device), _MOD
        )
        sums[0] += values.sum()
        sums[1] += (position * values).sum()
    return torch.remainder(sums, _MOD)


def _adler_finish(n: int, sums: Sequence[int]) -> int:
    """Adler-32 from ``[sum b_i, sum (n - i) b_i]`` (any representatives modulo 65521)."""
    a = (1 + sums[0]) % _MOD
    b = (n + sums[1]) % _MOD
    return (b << 16) | a


class TorchDeltaEncoder(Closing):
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
        sums: list[tuple[int, torch.Tensor]] = []
        for position, name in enumerate(batch):
            current = tensor_bytes(new[name])
            xor, flag = xor_changed(current, _base_bytes(base[name], current.device))
            xors.append(xor)
            flags.append(flag)
            on_device = self.device_checksums if self.device_checksums is not None else current.device.type != "cpu"
            if on_device:
                sums.append((position, _adler_sums(current)))
            else:
                adlers[position] = adler32(current.numpy())
        # one host synchronisation per batch: the change flags and the device Adler-32 sums
        changed = torch.stack(flags).cpu().tolist() if flags else []
        if sums:
            host_sums = torch.stack([s for _, s in sums]).cpu().tolist()
            for (position, _), pair in zip(sums, host_sums, strict=True):
                nbytes = new[batch[position]].numel() * new[batch[position]].element_size()
                adlers[position] = _adler_finish(nbytes, pair)
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
    from cwtrain.hotload.format.tensors import as_uint8

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
