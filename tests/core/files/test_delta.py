"""Directory level: write_delta, write_full_snapshot, checkpoint_checksums on real safetensors files."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
from codec_helpers import save_checkpoint
from safetensors.numpy import load_file, save_file

from cwtrain.errors import SnapshotError, SnapshotNotFoundError
from cwtrain.hotload.files.checkpoint import apply_delta_dir, load_full_dir
from cwtrain.hotload.files.write import checkpoint_checksums, staged_directory, write_delta, write_full_snapshot
from cwtrain.hotload.format.safetensors import read_header


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "model.embed_tokens.weight": rng.standard_normal((64, 32)).astype(np.float16),
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((32, 48)).astype(np.float32),
        "model.norm.weight": np.ones(32, np.float32),
        "lm_head.weight": rng.standard_normal((64, 32)).astype(np.float16),
        "step": np.array(3, np.int64),
        "empty": np.zeros((0, 4), np.float32),
    }


def _step(weights: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    out = {k: v.copy() for k, v in weights.items()}
    for name in names:
        out[name].reshape(-1)[:3] += 1
    return out


def _bytes(tensors: dict) -> dict[str, bytes]:  # type: ignore[type-arg]
    return {n: bytes(memoryview(t.data).cast("B")) for n, t in tensors.items()}


@pytest.mark.parametrize("shards", [1, 3])
def test_write_delta_and_apply_reproduces_new(tmp_path: Path, shards: int) -> None:
    base = save_checkpoint(tmp_path / "v1", _weights(), shards=shards)
    new = save_checkpoint(tmp_path / "v2", _step(_weights(), ["lm_head.weight", "step"]), shards=shards)
    stats = write_delta(base, new, tmp_path / "d", version="000002", base_version="000001")
    assert (stats.tensors, stats.tensors_changed, stats.shards, stats.empty) == (6, 2, 1, False)
    assert 0 < stats.payload_bytes < stats.bytes_changed
    index = json.loads((tmp_path / "d" / "model.safetensors.index.json").read_text())
    assert index["metadata"] == {
        "version": "000002",
        "base_version": "000001",
        "delta_encoding": "xor",
        "compression_format": "zstd",
        "checksum_format": "adler32",
    }
    assert index["weight_map"] == dict.fromkeys(["lm_head.weight", "step"], "model-00000-of-00001.safetensors")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [
        "model-00000-of-00001.safetensors",
        "model.safetensors.index.json",
    ]
    result = apply_delta_dir(base, tmp_path / "d", base_version="000001")
    assert _bytes(result) == _bytes(load_full_dir(new))


def test_small_shard_limit_splits(tmp_path: Path) -> None:
    weights = _weights()
    base = save_checkpoint(tmp_path / "v1", weights)
    new_w = {
        k: (np.random.default_rng(1).standard_normal(v.shape).astype(v.dtype) if v.size > 1 else v)
        for k, v in weights.items()
    }
    new = save_checkpoint(tmp_path / "v2", new_w)
    stats = write_delta(base, new, tmp_path / "d", version="2", base_version="1", shard_bytes=2000)
    files = sorted(p.name for p in (tmp_path / "d").iterdir() if p.name.endswith(".safetensors"))
    assert stats.shards == len(files) >= 3
    assert files == [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
    names = []
    for name in files:
        header = read_header(tmp_path / "d" / name)
        assert header.data_size <= 2000 or len(header.tensors) == 1
        names += list(header.tensors)
    assert names == sorted(names)
    assert _bytes(apply_delta_dir(base, tmp_path / "d")) == _bytes(load_full_dir(new))


def test_empty_delta_is_index_only(tmp_path: Path) -> None:
    base = save_checkpoint(tmp_path / "v1", _weights())
    new = save_checkpoint(tmp_path / "v2", _weights())
    stats = write_delta(base, new, tmp_path / "d", version="2", base_version="1")
    assert stats.empty and stats.shards == 0 and stats.payload_bytes == 0
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["model.safetensors.index.json"]
    assert json.loads((tmp_path / "d" / "model.safetensors.index.json").read_text())["weight_map"] == {}


def _assert_refused(tmp_path: Path, base: Path, new: Path, *match: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(SnapshotError) as info:
        write_delta(base, new, out, version="2", base_version="1")
    for text in match:
        assert text in str(info.value)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_refuses_different_tensor_sets(tmp_path: Path) -> None:
    weights = _weights()
    base = save_checkpoint(tmp_path / "v1", weights)
    weights["extra.bias"] = np.zeros(3, np.float32)
    new = save_checkpoint(tmp_path / "v2", weights)
    _assert_refused(tmp_path, base, new, "extra.bias", "FULL")


def test_refuses_dtype_change(tmp_path: Path) -> None:
    weights = _weights()
    base = save_checkpoint(tmp_path / "v1", weights)
    weights["model.norm.weight"] = weights["model.norm.weight"].astype(np.float64)
    _assert_refused(tmp_path, base, save_checkpoint(tmp_path / "v2", weights), "model.norm.weight", "F64")


def test_refuses_shape_change(tmp_path: Path) -> None:
    weights = _weights()
    base = save_checkpoint(tmp_path / "v1", weights)
    weights["lm_head.weight"] = weights["lm_head.weight"].reshape(32, 64)
    _assert_refused(tmp_path, base, save_checkpoint(tmp_path / "v2", weights), "lm_head.weight", "[32, 64]")


def test_refuses_missing_index(tmp_path: Path) -> None:
    base = save_checkpoint(tmp_path / "v1", _weights())
    (tmp_path / "v2").mkdir()
    with pytest.raises(SnapshotNotFoundError, match=r"model\.safetensors\.index\.json"):
        write_delta(base, tmp_path / "v2", tmp_path / "out", version="2", base_version="1")
    assert not (tmp_path / "out").exists()


def test_refuses_missing_shard(tmp_path: Path) -> None:
    base = save_checkpoint(tmp_path / "v1", _weights(), shards=2)
    new = save_checkpoint(tmp_path / "v2", _weights(), shards=2)
    (new / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(SnapshotNotFoundError, match=r"model-00002-of-00002\.safetensors"):
        write_delta(base, new, tmp_path / "out", version="2", base_version="1")
    assert not (tmp_path / "out").exists()


def test_refuses_garbage_header(tmp_path: Path) -> None:
    base = save_checkpoint(tmp_path / "v1", _weights())
    new = save_checkpoint(tmp_path / "v2", _weights())
    (new / "model.safetensors").write_bytes(b"\xff" * 64)
    _assert_refused(tmp_path, base, new, str(new / "model.safetensors"), "exceeds")


def test_refuses_unmapped_shard_tensor(tmp_path: Path) -> None:
    base = save_checkpoint(tmp_path / "v1", _weights(), shards=2)
    new = save_checkpoint(tmp_path / "v2", _weights(), shards=2)
    index = json.loads((new / "model.safetensors.index.json").read_text())
    index["weight_map"].pop("step")
    (new / "model.safetensors.index.json").write_text(json.dumps(index))
    _assert_refused(tmp_path, base, new, "'step'", "not mapped")


def test_refuses_lora_adapter(tmp_path: Path) -> None:
    base = save_checkpoint(tmp_path / "v1", _weights())
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    save_file({"lora_A": np.zeros(2, np.float32)}, str(adapter / "adapter_model.safetensors"))
    _assert_refused(tmp_path, base, adapter, "LoRA", "merge")


def test_refuses_non_empty_output(tmp_path: Path) -> None:
    base = save_checkpoint(tmp_path / "v1", _weights())
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(SnapshotError, match="not empty"):
        write_delta(base, base, tmp_path / "out", version="2", base_version="1")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_checkpoint_checksums_match_zlib(tmp_path: Path) -> None:
    weights = _weights()
    root = save_checkpoint(tmp_path / "v1", weights, shards=2)
    sums = checkpoint_checksums(root)
    assert sums == {n: f"{zlib.adler32(np.ascontiguousarray(a).tobytes()):08x}" for n, a in sorted(weights.items())}


def test_write_full_snapshot_rewrites_headers_only(tmp_path: Path) -> None:
    weights = _weights()
    src = save_checkpoint(tmp_path / "src", weights, shards=2, metadata={"format": "pt", "step": "0badc0de"})
    (src / "tokenizer.json").write_text("{}")
    (src / "stray.safetensors").write_bytes(b"not referenced")
    dest = write_full_snapshot(src, tmp_path / "full")
    assert sorted(p.name for p in dest.iterdir()) == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
    ]
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        before, after = read_header(src / shard), read_header(dest / shard)
        assert list(after.tensors) == list(before.tensors)
        assert [(t.begin, t.end) for t in after.tensors.values()] == [(t.begin, t.end) for t in before.tensors.values()]
        meta = after.metadata or {}
        existing = list(before.metadata or {})
        assert list(meta)[: len(existing)] == existing and meta["format"] == "pt"  # existing entries first
        assert list(meta)[len(existing) :] == [n for n in after.tensors if n not in existing]
        if "step" in after.tensors:  # an existing (stale) checksum of a tensor is updated in place
            assert meta["step"] == f"{zlib.adler32(weights['step'].tobytes()):08x}"
        src_bytes = (src / shard).read_bytes()[before.data_start :]
        assert (dest / shard).read_bytes()[after.data_start :] == src_bytes
    raw = (dest / "model.safetensors.index.json").read_bytes()
    index = json.loads(raw)
    assert list(index["metadata"]) == ["total_size", "checksum_format"] and not raw.endswith(b"\n")
    assert raw.startswith(b'{\n "metadata": {\n  "total_size"')
    loaded = load_full_dir(dest)
    assert {n: bytes(memoryview(t.data)) for n, t in loaded.items()} == {
        n: np.ascontiguousarray(a).tobytes() for n, a in weights.items()
    }


def test_write_full_snapshot_with_dropped_tensors_repacks(tmp_path: Path) -> None:
    weights = _weights()
    src = save_checkpoint(tmp_path / "src", weights)
    dest = write_full_snapshot(src, tmp_path / "full", names=["lm_head.weight", "model.norm.weight"])
    header = read_header(dest / "model.safetensors")
    assert sorted(header.tensors) == ["lm_head.weight", "model.norm.weight"]
    index = json.loads((dest / "model.safetensors.index.json").read_text())
    expected_size = weights["lm_head.weight"].nbytes + weights["model.norm.weight"].nbytes
    assert index["metadata"] == {"total_size": expected_size, "checksum_format": "adler32"}
    loaded = load_file(str(dest / "model.safetensors"))
    assert np.array_equal(loaded["lm_head.weight"], weights["lm_head.weight"])
    with pytest.raises(SnapshotError, match="nope"):
        write_full_snapshot(src, tmp_path / "f2", names=["nope"])
    assert not (tmp_path / "f2").exists()


def test_write_full_snapshot_uses_given_checksums(tmp_path: Path) -> None:
    src = save_checkpoint(tmp_path / "src", {"a": np.zeros(2, np.float32)})
    dest = write_full_snapshot(src, tmp_path / "full", {"a": "12345678"})
    assert (read_header(dest / "model.safetensors").metadata or {})["a"] == "12345678"


def test_an_interrupt_just_after_the_staging_directory_is_made_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C or SIGTERM can land between making the hidden staging directory and the code that
    removes it on failure (a loaded machine makes that window real): nothing may stay behind."""
    made: list[str] = []
    real_mkdir = os.mkdir

    def mkdir_then_interrupted(path: str | os.PathLike[str], mode: int = 0o777, **kwargs: object) -> None:
        real_mkdir(path, mode)
        if str(path).endswith(".partial"):
            made.append(str(path))
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "mkdir", mkdir_then_interrupted)
    with pytest.raises(KeyboardInterrupt), staged_directory(tmp_path / "out"):
        raise AssertionError("the block never runs")
    assert made and list(tmp_path.iterdir()) == []
