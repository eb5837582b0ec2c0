"""Helpers shared by the snapshot codec tests: checkpoints on disk and random tensors."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from hypothesis import strategies as st
from safetensors.numpy import save_file

from cwtrain.hotload.format.safetensors import DTYPE_BITS
from cwtrain.hotload.format.tensors import TensorData


def save_checkpoint(
    root: Path,
    tensors: Mapping[str, np.ndarray],
    *,
    shards: int = 1,
    metadata: Mapping[str, str] | None = None,
    config: bool = True,
) -> Path:
    """Write a HF-style checkpoint with the safetensors library (index when ``shards`` > 1)."""
    root.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    meta = dict(metadata or {"format": "pt"})
    if shards == 1:
        save_file({n: tensors[n] for n in names}, str(root / "model.safetensors"), metadata=meta)
    else:
        weight_map = {}
        for i in range(shards):
            part = names[i::shards]
            shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file({n: tensors[n] for n in part}, str(root / shard), metadata=meta)
            weight_map.update(dict.fromkeys(part, shard))
        total = sum(int(t.nbytes) for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    if config:
        (root / "config.json").write_text('{"model_type": "test"}')
    return root


def as_tensor_data(tensors: Mapping[str, np.ndarray], dtype: str = "F32") -> dict[str, TensorData]:
    """numpy arrays as TensorData (raw bytes, given safetensors dtype)."""
    return {n: TensorData(dtype, tuple(a.shape), np.ascontiguousarray(a)) for n, a in tensors.items()}


def nbytes_of(dtype: str, shape: tuple[int, ...]) -> int | None:
    count = 1
    for dim in shape:
        count *= dim
    bits = count * DTYPE_BITS[dtype]
    return None if bits % 8 else bits // 8


@st.composite
def tensor_pairs(draw: st.DrawFn, changed: bool | None = None) -> tuple[TensorData, TensorData]:
    """An (old, new) pair of one tensor of any dtype and shape (0-d and empty included)."""
    dtype = draw(st.sampled_from(sorted(DTYPE_BITS)))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
    size = nbytes_of(dtype, shape)
    if size is None:
        shape = (*shape, 0) if shape else (0,)
        size = 0
    old = draw(st.binary(min_size=size, max_size=size))
    if changed is False or size == 0:
        new = old
    else:
        mode = draw(st.sampled_from(["same", "flip", "random"])) if changed is None else "flip"
        if mode == "same":
            new = old
        elif mode == "flip":
            position = draw(st.integers(0, size - 1))
            bit = draw(st.integers(0, 7))
            data = bytearray(old)
            data[position] ^= 1 << bit
            new = bytes(data)
        else:
            new = draw(st.binary(min_size=size, max_size=size))
    return TensorData(dtype, shape, old), TensorData(dtype, shape, new)


@st.composite
def checkpoints(draw: st.DrawFn, min_size: int = 1) -> tuple[dict[str, TensorData], dict[str, TensorData]]:
    """Two versions of a small checkpoint with random tensors."""
    names = draw(
        st.lists(
            st.text(alphabet="abcxyz._0123é", min_size=1, max_size=12).filter(lambda s: s != "__metadata__"),
            min_size=min_size,
            max_size=6,
            unique=True,
        )
    )
    old: dict[str, TensorData] = {}
    new: dict[str, TensorData] = {}
    for name in names:
        a, b = draw(tensor_pairs())
        old[name], new[name] = a, b
    return old, new
