"""The torch path gives the numpy path's exact bytes; device Adler-32; GPU runs where a GPU exists."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cwtrain.errors import SnapshotError  # noqa: E402
from cwtrain.hotload.codec import DeltaEncoder  # noqa: E402
from cwtrain.hotload.decode import apply_delta  # noqa: E402
from cwtrain.hotload.torch import (  # noqa: E402
    TorchDeltaEncoder,
    device_adler32,
    safetensors_dtype,
    tensor_data,
)

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.complex64,
]


def _state(device: str, *, big: bool = False) -> tuple[dict, dict]:  # type: ignore[type-arg]
    g = torch.Generator().manual_seed(0)
    base = {}
    for i, dtype in enumerate(DTYPES):
        raw = torch.randint(
            0, 256, (3 * 5 * torch.empty((), dtype=dtype).element_size(),), generator=g, dtype=torch.uint8
        )
        base[f"t{i:02d}.{str(dtype).split('.')[-1]}"] = raw.view(dtype).reshape(3, 5)
    base["scalar"] = torch.tensor(1.5)
    base["empty"] = torch.zeros(0, 7)
    base["noncontiguous"] = torch.arange(12.0).reshape(3, 4).t()
    if big:
        base["big"] = torch.zeros((4 << 20) * 2 + 3, dtype=torch.bfloat16)
    new = {k: v.clone() for k, v in base.items()}
    for i, name in enumerate(sorted(new)):
        if i % 2 == 0 and new[name].numel() and new[name].is_contiguous():
            new[name].view(-1).view(torch.uint8)[0] ^= 0x41
    new["noncontiguous"] = base["noncontiguous"] + 1
    if big:
        new["big"][-1] = 2.0
    base = {k: v.to(device) for k, v in base.items()}
    new = {k: v.to(device) for k, v in new.items()}
    return base, new


def _numpy_path(new: dict, base: dict, **kw: str) -> object:  # type: ignore[type-arg]
    with DeltaEncoder(workers=2) as enc:
        return enc.encode(
            {k: tensor_data(v) for k, v in new.items()}, {k: tensor_data(v) for k, v in base.items()}, **kw
        )


def _same(a: object, b: object) -> None:
    assert [(f.name, f.sha256()) for f in a.files] == [(f.name, f.sha256()) for f in b.files]  # type: ignore[attr-defined]
    assert a.index.sha256() == b.index.sha256()  # type: ignore[attr-defined]
    assert a.checksums == b.checksums and a.changed == b.changed  # type: ignore[attr-defined]


@pytest.mark.parametrize(("budget", "device_checksums"), [(1 << 10, None), (1 << 30, None), (1 << 30, True)])
def test_cpu_tensors_match_numpy_path(budget: int, device_checksums: bool | None) -> None:
    base, new = _state("cpu")
    with TorchDeltaEncoder(workers=2, memory_budget=budget) as enc:
        enc.device_checksums = device_checksums  # True: the GPU's batched Adler-32 code, run on the CPU
        ours = enc.encode(new, base, version="v2", base_version="v1")
    _same(ours, _numpy_path(new, base, version="v2", base_version="v1"))
    index = json.loads(ours.index.tobytes())
    result = apply_delta({k: tensor_data(v) for k, v in base.items()}, index, {f.name: f.tobytes() for f in ours.files})
    assert {k: bytes(memoryview(t.data)) for k, t in result.items()} == {
        k: bytes(memoryview(tensor_data(v).data)) for k, v in new.items()
    }


def test_base_as_host_tensor_data() -> None:
    base, new = _state("cpu")
    host = {k: tensor_data(v) for k, v in base.items()}
    with TorchDeltaEncoder(workers=1) as enc:
        _same(enc.encode(new, host), _numpy_path(new, base))


def test_big_tensor_matches_numpy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import cwtrain.hotload.codec as codec_module

    monkeypatch.setattr(codec_module, "BIG_TENSOR_BYTES", 4 << 20)  # zstd's threaded path, cheaply
    base, new = _state("cpu", big=True)
    with TorchDeltaEncoder(workers=2) as enc:
        _same(enc.encode(new, base), _numpy_path(new, base))


def test_device_adler32_matches_zlib(monkeypatch: pytest.MonkeyPatch) -> None:
    import cwtrain.hotload.torch as torch_codec

    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, ((1 << 23) + 3,), generator=g, dtype=torch.uint8)
    assert device_adler32(data) == zlib.adler32(data.numpy().tobytes())  # two real blocks
    monkeypatch.setattr(torch_codec, "_ADLER_BLOCK", 1000)  # many blocks, cheaply
    for n in (0, 1, 999, 1000, 5552, 100_003):
        part = data[:n]
        assert device_adler32(part) == zlib.adler32(part.numpy().tobytes())
    ones = torch.full((70_001,), 255, dtype=torch.uint8)
    assert device_adler32(ones) == zlib.adler32(b"\xff" * 70_001)


def test_refusals() -> None:
    base, new = _state("cpu")
    with TorchDeltaEncoder(workers=1) as enc:
        with pytest.raises(SnapshotError, match="scalar"):
            enc.encode({**new, "scalar": new["scalar"].double()}, base)
        with pytest.raises(SnapshotError, match="tensor sets differ"):
            enc.encode({**new, "extra": torch.zeros(1)}, base)
    with pytest.raises(SnapshotError, match="no safetensors equivalent"):
        safetensors_dtype(torch.complex128)


def test_tensor_data_is_a_view_on_cpu() -> None:
    t = torch.arange(4, dtype=torch.float32)
    data = tensor_data(t)
    assert data.dtype == "F32" and data.shape == (4,)
    t[0] = 7
    assert np.frombuffer(memoryview(data.data), np.float32)[0] == 7


@pytest.mark.gpu
def test_gpu_matches_numpy_path() -> None:
    base, new = _state("cuda", big=True)
    with TorchDeltaEncoder(workers=4) as enc:
        ours = enc.encode(new, base, version="v2", base_version="v1")
    _same(ours, _numpy_path(new, base, version="v2", base_version="v1"))
    data = torch.randint(0, 256, ((1 << 24) + 5,), dtype=torch.uint8, device="cuda")
    assert device_adler32(data) == zlib.adler32(data.cpu().numpy().tobytes())
