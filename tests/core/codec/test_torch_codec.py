"""The torch path gives the numpy path's exact bytes; device Adler-32; GPU runs where a GPU exists."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from cwtrain.errors import SnapshotError  # noqa: E402
from cwtrain.hotload.codec.decode import apply_delta  # noqa: E402
from cwtrain.hotload.codec.device import (  # noqa: E402
    TorchDeltaEncoder,
    device_adler32,
    safetensors_dtype,
    tensor_data,
    xor_changed,
)
from cwtrain.hotload.codec.encode import DeltaEncoder  # noqa: E402

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
    import cwtrain.hotload.codec.encode as codec_module

    monkeypatch.setattr(codec_module, "BIG_TENSOR_BYTES", 4 << 20)  # zstd's threaded path, cheaply
    base, new = _state("cpu", big=True)
    with TorchDeltaEncoder(workers=2) as enc:
        _same(enc.encode(new, base), _numpy_path(new, base))


def test_device_adler32_matches_zlib(monkeypatch: pytest.MonkeyPatch) -> None:
    import cwtrain.hotload.codec.device as torch_codec

    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, ((1 << 25) + 4099,), generator=g, dtype=torch.uint8)
    assert device_adler32(data) == zlib.adler32(data.numpy().tobytes())  # two blocks, a short row at the end
    row = torch_codec._ADLER_ROW
    monkeypatch.setattr(torch_codec, "_ADLER_BLOCK", 17 * row)  # many blocks, cheaply
    for n in (0, 1, 127, row - 1, row, 17 * row - 1, 17 * row, 18 * row + 5, 34 * row, 35 * row, 52 * row + 3):
        part = data[:n]
        assert device_adler32(part) == zlib.adler32(part.numpy().tobytes()), n
    for value in (0, 1, 128, 255):  # the extremes of every int32 row sum
        run = torch.full((40 * row + 11,), value, dtype=torch.uint8)
        assert device_adler32(run) == zlib.adler32(bytes([value]) * run.numel())


def test_device_adler32_without_the_int8_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device whose BLAS lacks ``_int_mm`` still gets exact checksums (bytes widened instead)."""
    import cwtrain.hotload.codec.device as torch_codec

    assert torch_codec._int8_product_works(torch.device("cpu"))

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("_int_mm_out_cuda not compiled for this platform")

    with monkeypatch.context() as patch:
        patch.setattr(torch, "_int_mm", refuse)
        assert torch_codec._int8_product_works.__wrapped__(torch.device("cpu")) is False  # the probe, uncached
    monkeypatch.setattr(torch_codec, "_int8_product_works", lambda device: False)
    g = torch.Generator().manual_seed(3)
    data = torch.randint(0, 256, ((1 << 23) + 70_001,), generator=g, dtype=torch.uint8)
    for n in (17 * 4096, 1 << 20, data.numel()):
        assert device_adler32(data[:n]) == zlib.adler32(data[:n].numpy().tobytes())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.one_of(st.integers(0, 3 << 20), st.integers(0, 40).map(lambda k: k * 4096), st.integers(0, 70_000)),
    offset=st.integers(0, 15),
    pattern=st.sampled_from(["random", "zeros", "ones", "high"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_device_adler32_property(n: int, offset: int, pattern: str, seed: int) -> None:
    """Any length (whole rows, short tails, fewer rows than cuBLAS's minimum), any start offset."""
    rng = np.random.default_rng(seed)
    raw = {
        "random": lambda: rng.integers(0, 256, n + offset, dtype=np.uint8),
        "zeros": lambda: np.zeros(n + offset, np.uint8),
        "ones": lambda: np.full(n + offset, 255, np.uint8),
        "high": lambda: rng.integers(128, 256, n + offset, dtype=np.uint8),
    }[pattern]()
    data = torch.from_numpy(raw)[offset:]
    assert device_adler32(data) == zlib.adler32(raw[offset:].tobytes())


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 1 << 16), new_offset=st.integers(0, 9), old_offset=st.integers(0, 9), seed=st.integers(0, 99))
def test_xor_changed_property(n: int, new_offset: int, old_offset: int, seed: int) -> None:
    """Equal to numpy's XOR and any(), on int64 views where aligned and byte-wise where not."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, n + new_offset, dtype=np.uint8)
    b = a.copy() if seed % 3 == 0 else rng.integers(0, 256, n + old_offset, dtype=np.uint8)
    new, old = torch.from_numpy(a)[new_offset:], torch.from_numpy(b)[len(b) - n :]
    xor, flag = xor_changed(new, old)
    expected = np.bitwise_xor(a[new_offset:], b[len(b) - n :])
    assert xor.dtype == torch.uint8 and xor.numel() == n
    assert np.array_equal(xor.numpy(), expected)
    assert bool(flag) == bool(expected.any())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_device_path_gives_the_numpy_codec_bytes(data: st.DataObject) -> None:
    """The device code (int64 XOR, int8-product Adler-32), run on CPU tensors, against the numpy codec."""
    new: dict[str, torch.Tensor] = {}
    base: dict[str, torch.Tensor] = {}
    for i in range(data.draw(st.integers(1, 4))):
        dtype = data.draw(st.sampled_from(DTYPES))
        itemsize = torch.empty((), dtype=dtype).element_size()
        count = data.draw(st.one_of(st.integers(0, 64), st.integers(0, (3 << 20) // itemsize)))
        seed = data.draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        raw = rng.integers(0, 256, count * itemsize, dtype=np.uint8)
        moved = raw.copy()
        if count and data.draw(st.booleans()):
            moved[rng.integers(0, raw.size, max(1, raw.size // 100))] ^= 0x10
        base[f"t{i}"] = torch.from_numpy(raw).view(dtype) if count else torch.empty(0, dtype=dtype)
        new[f"t{i}"] = torch.from_numpy(moved).view(dtype) if count else torch.empty(0, dtype=dtype)
    with TorchDeltaEncoder(workers=2, memory_budget=data.draw(st.sampled_from([1 << 20, 1 << 30]))) as enc:
        enc.device_checksums = True
        ours = enc.encode(new, base, version="v2", base_version="v1")
    _same(ours, _numpy_path(new, base, version="v2", base_version="v1"))


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
    data = torch.randint(0, 256, ((1 << 26) + 5,), dtype=torch.uint8, device="cuda")
    host = data.cpu().numpy()
    assert device_adler32(data) == zlib.adler32(host.tobytes())
    # whole rows, short tails, fewer rows than cuBLAS takes, unaligned starts
    for start, n in ((0, 0), (1, 4095), (0, 16 * 4096), (3, 17 * 4096), (8, (1 << 25) + 4097), (5, 1_000_003)):
        assert device_adler32(data[start : start + n]) == zlib.adler32(host[start : start + n].tobytes()), (start, n)
    other = data.clone()
    other[12345] ^= 1
    for start in (0, 3, 8):
        xor, flag = xor_changed(data[start:], other[start:])
        assert bool(flag) and int(xor.count_nonzero()) == 1
        assert not bool(xor_changed(data[start:], data[start:].clone())[1])
