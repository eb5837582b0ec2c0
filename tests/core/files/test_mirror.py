"""WeightMirror in host memory and on disk (crash recovery), DeltaReport."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest
from codec_helpers import save_checkpoint

from cwtrain.errors import MirrorError, SnapshotChecksumError, SnapshotError
from cwtrain.hotload.codec.encode import DeltaEncoder
from cwtrain.hotload.files import mirror as mirror_module
from cwtrain.hotload.files.checkpoint import load_full_dir
from cwtrain.hotload.files.mirror import DeltaReport, WeightMirror
from cwtrain.hotload.files.write import write_delta, write_full_snapshot
from cwtrain.hotload.format.tensors import TensorData


def _weights(version: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {
        "embed": rng.standard_normal((16, 8)).astype(np.float16),
        "layer.0.w": rng.standard_normal((8, 8)).astype(np.float32),
        "layer.1.w": rng.standard_normal((8, 8)).astype(np.float32),
        "norm": np.ones(8, np.float32),
    }
    for step in range(1, version + 1):
        out[["layer.0.w", "layer.1.w", "norm"][step % 3]].reshape(-1)[step] += step
    return out


@pytest.fixture
def chain(tmp_path: Path) -> dict[str, Path]:
    dirs = {"v0": save_checkpoint(tmp_path / "ckpt0", _weights(0))}
    for v in (1, 2, 3):
        dirs[f"c{v}"] = save_checkpoint(tmp_path / f"ckpt{v}", _weights(v))
        write_delta(
            dirs[f"c{v - 1}" if v > 1 else "v0"],
            dirs[f"c{v}"],
            tmp_path / f"weight_v{v:06d}",
            version=f"{v:06d}",
            base_version=f"{v - 1:06d}",
        )
        dirs[f"d{v}"] = tmp_path / f"weight_v{v:06d}"
    return dirs


def _raw(tensors: object) -> dict[str, bytes]:
    from cwtrain.hotload.format.tensors import as_uint8

    return {n: as_uint8(t.data).tobytes() for n, t in tensors.items()}  # type: ignore[attr-defined]


@pytest.mark.parametrize("on_disk", [False, True])
def test_apply_chain_and_write_full(tmp_path: Path, chain: dict[str, Path], on_disk: bool) -> None:
    root = tmp_path / "mirror" if on_disk else None
    mirror = WeightMirror.create(chain["v0"], root, version="000000")
    assert mirror.on_disk == on_disk and mirror.version == "000000"
    for v in (1, 2, 3):
        report = mirror.apply_delta(chain[f"d{v}"])
        assert isinstance(report, DeltaReport)
        assert report.version == f"{v:06d}" and report.base_version == f"{v - 1:06d}"
        assert report.tensors_changed == report.tensors_verified == 1
    assert _raw(mirror.tensors) == _raw(load_full_dir(chain["c3"]))
    expected = {n: f"{zlib.adler32(np.ascontiguousarray(a).tobytes()):08x}" for n, a in _weights(3).items()}
    assert mirror.checksums == expected
    out = mirror.write_full_snapshot(tmp_path / "cut")
    reference = write_full_snapshot(chain["c3"], tmp_path / "reference")
    for name in ("model.safetensors", "model.safetensors.index.json", "config.json"):
        assert (out / name).read_bytes() == (reference / name).read_bytes()
    # what a FULL published from the mirror's tensors carries beside them (HotLoader.publish(extra_files=))
    assert mirror.files == {"config.json": (reference / "config.json").read_bytes()}
    manifest = mirror.manifest("run-v000003", deployment_id="dep", run_id="run", version="000003")
    assert list(manifest) == sorted(manifest) and manifest["tensors"] == dict(sorted(expected.items()))
    assert manifest["checksum_format"] == "adler32" and manifest["identity"] == "run-v000003"
    if on_disk:
        mirror.close()
        reopened = WeightMirror(root)
        assert reopened.version == "000003" and _raw(reopened.tensors) == _raw(load_full_dir(chain["c3"]))
        reopened.close()


@pytest.mark.parametrize("on_disk", [False, True])
def test_wrong_base_version_and_bad_checksum_change_nothing(
    tmp_path: Path, chain: dict[str, Path], on_disk: bool
) -> None:
    mirror = WeightMirror.create(chain["v0"], tmp_path / "m" if on_disk else None, version="000000")
    before = _raw(mirror.tensors)
    with pytest.raises(MirrorError, match="000001"):
        mirror.apply_delta(chain["d2"])
    shard = chain["d1"] / "model-00000-of-00001.safetensors"
    data = bytearray(shard.read_bytes())
    position = data.index(b'"layer.1.w":"') + 13  # the tensor step 1 changed: corrupt its Adler-32
    data[position : position + 8] = b"00000000"
    shard.write_bytes(bytes(data))
    with pytest.raises(SnapshotChecksumError, match=r"'layer\.1\.w'"):
        mirror.apply_delta(chain["d1"])
    assert mirror.version == "000000" and _raw(mirror.tensors) == before
    if on_disk:
        assert not (tmp_path / "m" / "journal").exists()


def test_interrupted_disk_apply_is_recovered(
    tmp_path: Path, chain: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "m"
    mirror = WeightMirror.create(chain["v0"], root, version="000000")
    mirror.apply_delta(chain["d1"])
    # build a two-tensor delta so the crash can land between writes
    two = save_checkpoint(
        tmp_path / "two", {**_weights(1), "embed": _weights(1)["embed"] + 1, "norm": _weights(1)["norm"] * 3}
    )
    write_delta(chain["c1"], two, tmp_path / "d2", version="000002", base_version="000001")
    real = mirror_module._pwrite_all
    calls = []

    def crash_after_one(fd: int, data: memoryview, offset: int) -> None:
        if calls:
            raise KeyboardInterrupt("power cut")
        calls.append(offset)
        real(fd, data, offset)

    monkeypatch.setattr(mirror_module, "_pwrite_all", crash_after_one)
    with pytest.raises(KeyboardInterrupt):
        mirror.apply_delta(tmp_path / "d2")
    mirror.close()
    assert (root / "journal").is_dir() and json.loads((root / "state.json").read_text())["version"] == "000001"
    monkeypatch.setattr(mirror_module, "_pwrite_all", real)
    recovered = WeightMirror(root)
    assert recovered.version == "000002" and not (root / "journal").exists()
    assert _raw(recovered.tensors) == _raw(load_full_dir(two))
    recovered.close()


def test_uncommitted_apply_is_rolled_back(tmp_path: Path, chain: dict[str, Path]) -> None:
    root = tmp_path / "m"
    WeightMirror.create(chain["v0"], root, version="000000").close()
    (root / ".journal.partial").mkdir()
    (root / ".journal.partial" / "model.safetensors.index.json").write_text("{")
    mirror = WeightMirror(root)
    assert mirror.version == "000000" and not (root / ".journal.partial").exists()
    assert _raw(mirror.tensors) == _raw(load_full_dir(chain["v0"]))
    mirror.close()


def test_open_refuses_non_mirror(tmp_path: Path) -> None:
    with pytest.raises(MirrorError, match="no weight mirror"):
        WeightMirror(tmp_path)


def test_memory_mirror_from_tensors_and_encoded_delta(tmp_path: Path) -> None:
    base = {n: TensorData("F32" if a.dtype == np.float32 else "F16", a.shape, a) for n, a in _weights(0).items()}
    mirror = WeightMirror.create(base, version="0")
    base["norm"].data[0] = 42  # type: ignore[index]  # the mirror holds its own copy
    assert _raw(mirror.tensors)["norm"] == np.ascontiguousarray(_weights(0)["norm"]).tobytes()
    new = {n: TensorData(t.dtype, t.shape, a) for (n, t), a in zip(mirror.tensors.items(), _weights(2).values())}
    with DeltaEncoder(workers=1) as encoder:
        snap = encoder.encode(new, mirror.tensors, version="2", base_version="0")
    report = mirror.apply_encoded(snap)
    assert report.version == "2" and _raw(mirror.tensors) == _raw(new)
    mirror.advance("3")
    assert mirror.version == "3"
    assert mirror.write_full_snapshot(tmp_path / "cut") == tmp_path / "cut"
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["model.safetensors", "model.safetensors.index.json"]
    seeded = WeightMirror.create(base, tmp_path / "disk", files={"config.json": b"{}"})
    seeded.write_full_snapshot(tmp_path / "cut2")
    assert seeded.files == {"config.json": b"{}"} and mirror.files == {}
    assert (tmp_path / "cut2" / "config.json").read_bytes() == b"{}"
    assert _raw(load_full_dir(tmp_path / "cut2")) == _raw(seeded.tensors)
    seeded.close()
    with pytest.raises(SnapshotError, match="not a delta"):
        mirror.apply({"metadata": {}, "weight_map": {}}, {})


def test_side_files_are_everything_at_the_top_but_weights_indexes_and_hidden_files(tmp_path: Path) -> None:
    from cwtrain.hotload import side_files

    kept = {
        "config.json": b"{}",
        "generation_config.json": b"{}",
        "tokenizer.json": b"{}",
        "tokenizer.model": b"sp",
        "merges.txt": b"a b",
        "vocab.txt": b"x",
        "chat_template.jinja": b"{{ m }}",
    }
    dropped = [
        "model-00001-of-00002.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        ".gitattributes",
    ]
    for name, data in kept.items():
        (tmp_path / name).write_bytes(data)
    for name in dropped:
        (tmp_path / name).write_bytes(b"weights")
    (tmp_path / "original").mkdir()
    (tmp_path / "original" / "params.json").write_bytes(b"{}")
    assert side_files(tmp_path) == dict(sorted(kept.items()))
