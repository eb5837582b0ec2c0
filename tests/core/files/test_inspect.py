"""inspect_snapshot: classification, every refusal of spec 3.1/5, the snapshot-info shape."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from codec_helpers import save_checkpoint

from cwtrain.errors import SnapshotError, SnapshotNotFoundError
from cwtrain.hotload.files.validate import SnapshotInfo, delta_index_for_upload, inspect_snapshot
from cwtrain.hotload.files.write import write_delta


def _weights(shift: float = 0.0) -> dict[str, np.ndarray]:
    return {"a.weight": np.arange(8, dtype=np.float32) + shift, "b.weight": np.ones(4, np.float16)}


@pytest.fixture
def full(tmp_path: Path) -> Path:
    return save_checkpoint(tmp_path / "full", _weights())


@pytest.fixture
def delta(tmp_path: Path, full: Path) -> Path:
    new = save_checkpoint(tmp_path / "new", _weights(1.0))
    write_delta(full, new, tmp_path / "weight_v000007", version="000007", base_version="000006")
    return tmp_path / "weight_v000007"


def test_full_with_generated_index(full: Path) -> None:
    (full / "sub").mkdir()
    info = inspect_snapshot(full)
    assert isinstance(info, SnapshotInfo) and info.type == "FULL" and info.index_generated
    assert info.generated_index is not None and info.generated_index.endswith(b"}\n")
    body = info.to_json()
    assert list(body) == [
        "path",
        "type",
        "files",
        "total_bytes",
        "empty_delta",
        "incremental",
        "index_metadata",
        "index_generated",
    ]
    assert body["files"] == [str(full / "config.json"), str(full / "model.safetensors")]
    size = sum((full / n).stat().st_size for n in ("config.json", "model.safetensors"))
    assert body["total_bytes"] == size + len(info.generated_index)
    assert body["incremental"] is None and body["empty_delta"] is False
    assert body["index_metadata"] == {"total_size": 40}
    json.dumps(body)
    assert delta_index_for_upload(info, "run-v000000") == info.generated_index


def test_full_with_index_uploads_it_as_is(tmp_path: Path) -> None:
    root = save_checkpoint(tmp_path / "c", _weights(), shards=2)
    info = inspect_snapshot(root)
    assert info.type == "FULL" and not info.index_generated and info.generated_index is None
    assert delta_index_for_upload(info, "x") == (root / "model.safetensors.index.json").read_bytes()


def test_delta_defaults_predecessor_from_base_version(delta: Path) -> None:
    info = inspect_snapshot(delta)
    assert info.type == "INCREMENTAL" and info.previous_identity == "weight_v000006"
    assert info.to_json()["incremental"] == {
        "previous_snapshot_identity": "weight_v000006",
        "compression_format": "ZSTD",
        "checksum_format": "ADLER32",
    }
    assert info.to_json()["index_metadata"]["version"] == "000007"
    raw = delta_index_for_upload(info, "run-v000007")
    meta = json.loads(raw)["metadata"]
    assert meta["version"] == "run-v000007" and meta["base_version"] == "weight_v000006"
    assert not raw.endswith(b"\n") and raw.startswith(b'{\n "metadata"')


def test_delta_with_explicit_and_mapped_predecessor(delta: Path) -> None:
    assert inspect_snapshot(delta, previous_identity="run-v000006").previous_identity == "run-v000006"
    info = inspect_snapshot(delta, identity_for_version=lambda v: f"grpo-v{int(v or 0):06d}")
    assert info.previous_identity == "grpo-v000006"


def test_predecessor_for_full_is_refused(full: Path) -> None:
    with pytest.raises(SnapshotError, match="FULL") as refused:
        inspect_snapshot(full, previous_identity="x")
    # the message names both ways out (issue 27: the README's example hit it with no hint)
    assert "publish it without one" in str(refused.value) and "publish_diff" in str(refused.value)
    assert "--base" in str(refused.value)


def test_invalid_predecessor_identity(delta: Path) -> None:
    with pytest.raises(SnapshotError, match="invalid previous identity"):
        inspect_snapshot(delta, previous_identity="a/b")
    with pytest.raises(SnapshotError, match="invalid identity"):
        delta_index_for_upload(inspect_snapshot(delta), "_manifests")


def test_missing_base_version_asks_for_previous_identity(delta: Path) -> None:
    path = delta / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    del index["metadata"]["base_version"]
    path.write_text(json.dumps(index))
    with pytest.raises(SnapshotError, match="--previous-identity"):
        inspect_snapshot(delta)
    assert inspect_snapshot(delta, previous_identity="p").previous_identity == "p"


def test_empty_delta(tmp_path: Path, full: Path) -> None:
    same = save_checkpoint(tmp_path / "same", _weights())
    write_delta(full, same, tmp_path / "empty", version="2", base_version="1")
    with pytest.raises(SnapshotError, match="empty delta"):
        inspect_snapshot(tmp_path / "empty")
    info = inspect_snapshot(tmp_path / "empty", allow_empty_delta=True)
    assert info.empty_delta and info.to_json()["empty_delta"] is True
    with pytest.raises(SnapshotError, match="never uploaded"):
        delta_index_for_upload(info, "run-v000002")


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("delta_encoding", "overwrite", "overwrite"),
        ("checksum_format", "xxh3-128", "adler32"),
        ("compression_format", "lz4", "zstd"),
    ],
)
def test_unsupported_delta_metadata(delta: Path, key: str, value: str, match: str) -> None:
    path = delta / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    index["metadata"][key] = value
    path.write_text(json.dumps(index))
    with pytest.raises(SnapshotError, match=match) as info:
        inspect_snapshot(delta)
    assert str(path) in str(info.value)


def test_delta_payload_checks(delta: Path) -> None:
    shard = delta / "model-00000-of-00001.safetensors"
    data = bytearray(shard.read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    data[8 + header_len] ^= 0xFF  # break the first frame's magic
    shard.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match=r"'a\.weight': payload is not a zstd frame"):
        inspect_snapshot(delta)


def test_missing_config_json(full: Path) -> None:
    (full / "config.json").unlink()
    with pytest.raises(SnapshotError, match=r"config\.json"):
        inspect_snapshot(full)


def test_missing_index_and_missing_shard(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text("{}")
    with pytest.raises(SnapshotNotFoundError, match=r"model\.safetensors\.index\.json"):
        inspect_snapshot(tmp_path / "d")
    with pytest.raises(SnapshotNotFoundError):
        inspect_snapshot(tmp_path / "nope")
    root = save_checkpoint(tmp_path / "c", _weights(), shards=2)
    (root / "model-00001-of-00002.safetensors").unlink()
    with pytest.raises(SnapshotNotFoundError, match=r"model-00001-of-00002\.safetensors"):
        inspect_snapshot(root)


def test_empty_weight_map_and_unmapped_tensor(tmp_path: Path) -> None:
    root = save_checkpoint(tmp_path / "c", {**_weights(), "c.weight": np.zeros(2, np.int8)}, shards=2)
    path = root / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    index["weight_map"].pop("c.weight")
    path.write_text(json.dumps(index))
    with pytest.raises(SnapshotError, match=r"'c\.weight' is not mapped"):
        inspect_snapshot(root)
    path.write_text(json.dumps({"metadata": {}, "weight_map": {}}))
    with pytest.raises(SnapshotError, match="weight_map is empty"):
        inspect_snapshot(root)


def test_lora_adapter_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "adapter"
    root.mkdir()
    (root / "adapter_config.json").write_text("{}")
    (root / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(SnapshotError, match="merge it"):
        inspect_snapshot(root)


def test_garbage_header(full: Path) -> None:
    (full / "model.safetensors").write_bytes(b"\x10\0\0\0\0\0\0\0not json at all!")
    with pytest.raises(SnapshotError, match="invalid safetensors header") as info:
        inspect_snapshot(full)
    assert "model.safetensors" in str(info.value)
