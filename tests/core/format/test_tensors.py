"""In-memory tensors for HotLoader.publish: numpy arrays and torch tensors become TensorData bytes."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from cwtrain.errors import SnapshotError
from cwtrain.hotload.format.chain import deltas_after, resolve_type
from cwtrain.hotload.format.tensors import TensorData, as_tensor_data, to_tensor_data
from cwtrain.hotload.store.snapshot_checks import DtypeWarning, check_published_tensors
from cwtrain.infra.enums import SnapshotType
from cwtrain.infra.models import HotLoad


@pytest.mark.parametrize(
    ("dtype", "code"),
    [(np.float32, "F32"), (np.float16, "F16"), (np.int64, "I64"), (np.uint8, "U8"), (np.bool_, "BOOL")],
)
def test_numpy_arrays(dtype: type, code: str) -> None:
    array = np.arange(6).reshape(2, 3).astype(dtype)
    tensor = as_tensor_data("w", array)
    assert tensor.dtype == code and tensor.shape == (2, 3)
    assert bytes(memoryview(tensor.data)) == array.tobytes()


def test_non_contiguous_and_big_endian_arrays_are_little_endian_bytes() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4).T
    assert bytes(memoryview(as_tensor_data("t", array).data)) == np.ascontiguousarray(array).tobytes()
    big = np.arange(4, dtype=">i4")
    assert bytes(memoryview(as_tensor_data("b", big).data)) == np.arange(4, dtype="<i4").tobytes()


def test_torch_tensors_including_bf16() -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.tensor([[1.0, -2.5], [0.5, 3.0]], dtype=torch.bfloat16).t()
    data = as_tensor_data("w", tensor)
    assert data.dtype == "BF16" and data.shape == (2, 2)
    expected = tensor.contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
    assert bytes(memoryview(data.data)) == expected


def test_tensor_data_passes_through_and_bad_values_are_refused() -> None:
    original = TensorData("F32", (1,), b"\x00\x00\x80\x3f")
    assert as_tensor_data("x", original) is original
    with pytest.raises(SnapshotError, match="'x'"):
        as_tensor_data("x", [1.0, 2.0])
    with pytest.raises(SnapshotError, match="complex128"):
        as_tensor_data("x", np.zeros(2, dtype=np.complex128))
    # one dtype table for numpy and torch: complex64 is safetensors' C64
    assert as_tensor_data("x", np.zeros(2, dtype=np.complex64)).dtype == "C64"
    with pytest.raises(SnapshotError, match="no tensors"):
        to_tensor_data({})


def _hot(identity: str, kind: str, previous: str | None = None, state: str = "COMPLETED") -> HotLoad:
    spec = {"id": f"h-{identity}", "identity": identity, "type": f"SNAPSHOT_TYPE_{kind}"}
    if previous:
        spec["incrementalSnapshotMetadata"] = {"previousSnapshotIdentity": previous}
    return HotLoad.from_api({"spec": spec, "status": {"state": f"HOT_LOAD_STATE_{state}"}})


def test_chain_walk_skips_failed_and_prefers_completed() -> None:
    listing = [
        _hot("c", "INCREMENTAL", "b"),
        _hot("b", "INCREMENTAL", "zzz", state="FAILED"),  # a failed attempt does not count
        _hot("b", "INCREMENTAL", "a"),
        _hot("a", "FULL"),
    ]
    assert deltas_after(listing, "a") == 1
    assert deltas_after(listing, "c") == 3
    assert deltas_after(listing, "missing") is None


def test_resolve_type() -> None:
    assert resolve_type(None, None, None) == (SnapshotType.FULL, None)
    assert resolve_type(None, "p", None) == (SnapshotType.INCREMENTAL, "p")

    class Info:
        type = "INCREMENTAL"
        previous_identity = "prev"

    assert resolve_type(Info(), None, None) == (SnapshotType.INCREMENTAL, "prev")
    with pytest.raises(SnapshotError):
        resolve_type(Info(), "other", None)


def _config(**fields: object) -> dict[str, bytes]:
    return {"config.json": json.dumps({"model_type": "m", **fields}).encode()}


def test_check_published_tensors_rules() -> None:
    """Which served dtype a FULL is compared with, and when it is not (issue 27)."""
    f32 = np.zeros((2, 2), np.float32)
    bf16 = TensorData("BF16", (2, 2), bytes(8))
    fp8 = TensorData("F8_E4M3", (2, 2), bytes(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # no declared dtype, a quantized model, or tensors already in the declared dtype: nothing to say
        check_published_tensors({"w": f32}, base=None, extra_files=_config(), delta=False)
        check_published_tensors(
            {"w": f32}, base=None, extra_files=_config(torch_dtype="bfloat16", quantization_config={}), delta=False
        )
        check_published_tensors({"w": bf16, "q": fp8}, base=None, extra_files=_config(dtype="bfloat16"), delta=False)
        # integer tensors are not compared with a floating dtype
        ids = np.zeros(3, np.int64)
        check_published_tensors(
            {"w": bf16, "ids": ids}, base=None, extra_files=_config(torch_dtype="bfloat16"), delta=False
        )
        # a delta whose dtypes match the served ones
        check_published_tensors({"w": bf16}, base={"w": bf16}, extra_files=None, delta=True)
    with pytest.warns(DtypeWarning, match=r"1 of 2 tensors are F32 \('w'\).*'float16'.*served in F16"):
        check_published_tensors(
            {"w": f32, "n": TensorData("F16", (2,), bytes(4))},
            base=None,
            extra_files=_config(torch_dtype="float16"),
            delta=False,
        )
    with pytest.raises(SnapshotError, match="not JSON"):
        check_published_tensors({"w": f32}, base=None, extra_files={"config.json": b"{"}, delta=False)
    with pytest.raises(SnapshotError, match="'w' is F32, served as BF16"):
        check_published_tensors({"w": f32}, base={"w": bf16}, extra_files=None, delta=True)


def test_check_published_tensors_reads_torch_dtypes_without_copying() -> None:
    torch = pytest.importorskip("torch")
    bf16 = torch.zeros((2, 2), dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_published_tensors(
            {"w": bf16}, base={"w": TensorData("BF16", (2, 2), bytes(8))}, extra_files=None, delta=True
        )
    with pytest.raises(SnapshotError, match="'w' is F32, served as BF16"):
        check_published_tensors({"w": bf16.float()}, base={"w": bf16}, extra_files=None, delta=True)
