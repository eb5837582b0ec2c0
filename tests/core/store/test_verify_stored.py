"""Stored snapshots checked against their recorded SHA-256 and Adler-32s before a trigger (moto S3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakeapi import FakeAPI

from cwtrain.cli import main
from cwtrain.errors import SnapshotChecksumError
from cwtrain.hotload.codec.encode import DeltaEncoder
from cwtrain.hotload.format.tensors import TensorData
from cwtrain.hotload.loader import HotLoader
from cwtrain.hotload.store.prefix import SnapshotStore
from cwtrain.hotload.store.snapshot_verify import verify_stored_snapshot

PREFIX = "hotload"


def _tensors(seed: int) -> dict[str, TensorData]:
    rng = np.random.default_rng(seed)
    return {
        "a.weight": TensorData("F32", (8, 8), rng.standard_normal((8, 8)).astype(np.float32).tobytes()),
        "b.weight": TensorData("F32", (16,), rng.standard_normal(16).astype(np.float32).tobytes()),
    }


def _plain_full(root: Path) -> Path:
    """A FULL checkpoint as a framework writes it: one safetensors file, no checksums, no index."""
    root.mkdir()
    data = np.arange(32, dtype=np.float32).tobytes()
    header = json.dumps({"w": {"dtype": "F32", "shape": [32], "data_offsets": [0, len(data)]}}).encode()
    (root / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + data)
    (root / "config.json").write_text("{}")
    return root


def _checksummed_full(root: Path) -> Path:
    root.mkdir()
    with DeltaEncoder(workers=1) as encoder:
        snap = encoder.encode_full(_tensors(0))
    for file in [*snap.files, snap.index]:
        file.write_to(root / file.name)
    (root / "config.json").write_text("{}")
    return root


@pytest.fixture
def setup(s3_bucket: tuple[Any, str]) -> tuple[HotLoader, Any, str, FakeAPI]:
    s3, bucket = s3_bucket
    api = FakeAPI()
    api.add_gateway()
    api.add_deployment()
    api.deployments["dep-1"]["spec"]["hotLoad"]["bucket"] = bucket
    return HotLoader(api.client(), "dep-1", s3=s3, timeout=10, poll_interval=0.01), s3, bucket, api


def _flip(s3: Any, bucket: str, key: str, offset: int) -> None:
    """Invert one stored byte, keeping the object's metadata (as a bit rot or an overwrite would)."""
    obj = s3.get_object(Bucket=bucket, Key=key)
    data = bytearray(obj["Body"].read())
    data[offset] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(data), Metadata=obj["Metadata"])


def _posted(api: FakeAPI) -> list[Any]:
    return [c for c in api.calls if c[:2] == ("POST", "/hotLoads")]


def test_intact_snapshots_verify_and_a_missing_one_is_not_checked(
    setup: tuple[HotLoader, Any, str, FakeAPI], tmp_path: Path
) -> None:
    loader, _, _, _ = setup
    loader.upload(_checksummed_full(tmp_path / "full"), "run-v000000")
    loader.upload(_plain_full(tmp_path / "plain"), "plain-v000000")
    checked = verify_stored_snapshot(loader.store, "run-v000000")
    assert checked is not None and checked.objects == 3 and checked.tensors == 2 and checked.bytes > 0
    plain = verify_stored_snapshot(loader.store, "plain-v000000")
    assert plain is not None and plain.objects == 3 and plain.tensors == 0  # index, shard, config.json
    assert verify_stored_snapshot(loader.store, "never-uploaded") is None


def test_a_flipped_byte_in_a_plain_full_is_caught_by_its_sha256(
    setup: tuple[HotLoader, Any, str, FakeAPI], tmp_path: Path
) -> None:
    loader, s3, bucket, api = setup
    loader.upload(_plain_full(tmp_path / "plain"), "plain-v000001")
    key = f"{PREFIX}/plain-v000001/model.safetensors"
    _flip(s3, bucket, key, -2)
    with pytest.raises(SnapshotChecksumError) as caught:
        loader.trigger("plain-v000001", verify=True)
    assert f"s3://{bucket}/{key}: SHA-256" in str(caught.value) and "--no-verify" in str(caught.value)
    assert not _posted(api)  # refused before the hot-load was created
    assert loader.trigger("plain-v000001").identity == "plain-v000001"  # the library default does not read back


def test_a_flipped_tensor_byte_names_the_tensor_and_the_object(
    setup: tuple[HotLoader, Any, str, FakeAPI], tmp_path: Path
) -> None:
    loader, s3, bucket, _ = setup
    loader.upload(_checksummed_full(tmp_path / "full"), "run-v000002")
    key = f"{PREFIX}/run-v000002/model.safetensors"
    _flip(s3, bucket, key, -3)  # inside the last tensor's data
    with pytest.raises(SnapshotChecksumError) as caught:
        verify_stored_snapshot(loader.store, "run-v000002")
    message = str(caught.value)
    assert f"s3://{bucket}/{key}: SHA-256" in message and "Adler-32" in message and "'b.weight'" in message


def test_objects_without_a_recorded_sha256_and_deltas(
    setup: tuple[HotLoader, Any, str, FakeAPI], tmp_path: Path
) -> None:
    _, s3, bucket, _ = setup
    with DeltaEncoder(workers=1) as encoder:
        new = dict(_tensors(0))
        new["b.weight"] = TensorData("F32", (16,), np.ones(16, dtype=np.float32).tobytes())
        delta = encoder.encode(new, _tensors(0), version="run-v000004", base_version="run-v000003")
    store = SnapshotStore(s3, bucket, PREFIX)
    with store.open_upload("run-v000004") as upload:
        for file in delta.files:
            upload.add(file)
        upload.commit(delta.index)
    checked = verify_stored_snapshot(store, "run-v000004")
    assert checked is not None and checked.tensors == 0  # a delta's Adler-32s need its base
    s3.put_object(Bucket=bucket, Key=f"{PREFIX}/run-v000004/notes.txt", Body=b"added by hand")
    with pytest.raises(SnapshotChecksumError, match=r"notes\.txt has no cwtrain-sha256 metadata"):
        verify_stored_snapshot(store, "run-v000004")


def test_cli_trigger_verifies_unless_no_verify(
    setup: tuple[HotLoader, Any, str, FakeAPI],
    s3_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    loader, s3, bucket, api = setup
    import cwtrain.cli.hotload

    monkeypatch.setattr(cwtrain.cli.hotload, "client_from_args", lambda args: api.client())
    loader.upload(_plain_full(tmp_path / "plain"), "plain-v000005")
    _flip(s3, bucket, f"{PREFIX}/plain-v000005/model.safetensors", 100)
    argv = ["hotload", "trigger", "--deployment", "dep-1", "--identity", "plain-v000005", "--no-wait"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: snapshot 'plain-v000005' at s3://")
    assert len(captured.err.strip().splitlines()) == 1 and not _posted(api)
    assert main([*argv, "--no-verify"]) == 0
    assert json.loads(capsys.readouterr().out)["spec"]["identity"] == "plain-v000005"
