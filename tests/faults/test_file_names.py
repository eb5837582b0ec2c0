"""A checkpoint directory holding a file whose name is not UTF-8: one clear line, never "internal error".

Linux file names are bytes; Python hands a name that is not UTF-8 over as lone surrogates,
which can be neither an object key nor an index entry. Every place that lists a snapshot or
checkpoint directory (inspect, upload, the mirror, apply's side files), a shard named by an
index through a JSON escape, and the CLI name the directory and the name's bytes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from cwtrain.cli import main
from cwtrain.errors import SnapshotError, UsageError
from cwtrain.hotload.files.checkpoint import open_snapshot_dir
from cwtrain.hotload.files.mirror import WeightMirror
from cwtrain.hotload.files.validate import inspect_snapshot
from cwtrain.hotload.files.write import write_applied_snapshot, write_delta
from cwtrain.hotload.format.index import INDEX_NAME
from cwtrain.hotload.store.object_source import ObjectSource
from cwtrain.hotload.store.snapshot_upload import SnapshotUpload, upload_snapshot

pytestmark = [pytest.mark.faults, pytest.mark.fault_row("undecodable-name")]

BAD = b"\xff\xfe-notes.txt"
SHARD = "model-00001-of-00001.safetensors"
NAMED = "the file name b'\\xff\\xfe-notes.txt' is not valid UTF-8"


def _checkpoint(root: Path, *, seed: int, bad_name: bool = True) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    tensors = {"a.weight": rng.standard_normal(64).astype(np.float32), "b.weight": np.ones(8, np.float32)}
    save_file(tensors, str(root / SHARD), metadata={"format": "pt"})
    (root / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": dict.fromkeys(tensors, SHARD)}))
    (root / "config.json").write_text("{}")
    if bad_name:
        with open(os.path.join(os.fsencode(root), BAD), "wb") as handle:
            handle.write(b"notes")
    return root


def test_inspect_names_the_directory_and_the_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = _checkpoint(tmp_path / "ckpt", seed=1)
    with pytest.raises(SnapshotError, match=f"{ckpt}: {NAMED}".replace("\\", "\\\\")):
        inspect_snapshot(ckpt)
    assert main(["hotload", "inspect", str(ckpt)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: {ckpt}: {NAMED}; snapshot file names become object keys and index " + (
        "entries, which are UTF-8: rename the file or move it out of the directory\n"
    )


def test_upload_refuses_before_anything_is_sent(
    tmp_path: Path, s3_bucket: tuple[Any, str], s3_env: dict[str, str]
) -> None:
    s3, bucket = s3_bucket
    ckpt = _checkpoint(tmp_path / "ckpt", seed=2)
    with pytest.raises(SnapshotError, match=NAMED.replace("\\", "\\\\")):
        upload_snapshot(ckpt, bucket=bucket, identity="names", s3=s3)
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    upload = SnapshotUpload(s3, bucket=bucket, identity="names2")  # a source named by the caller
    with upload, pytest.raises(UsageError, match="is not valid UTF-8"):
        upload.add(ObjectSource.from_buffers(os.fsdecode(BAD), [b"x"]))


def test_apply_and_the_mirror_refuse_to_copy_it(tmp_path: Path) -> None:
    base = _checkpoint(tmp_path / "base", seed=3)
    clean = _checkpoint(tmp_path / "new", seed=4, bad_name=False)
    write_delta(_checkpoint(tmp_path / "base-clean", seed=3, bad_name=False), clean, tmp_path / "delta",
                version="1", base_version="0")  # fmt: skip
    with pytest.raises(SnapshotError, match=NAMED.replace("\\", "\\\\")):
        write_applied_snapshot(base, tmp_path / "delta", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "base-clean", "delta", "new"]  # no partial output
    with pytest.raises(SnapshotError, match=NAMED.replace("\\", "\\\\")):
        WeightMirror.create(base, root=None, version="0")
    with pytest.raises(SnapshotError, match=NAMED.replace("\\", "\\\\")):
        WeightMirror.create(base, tmp_path / "mirror", version="0")


def test_an_index_naming_a_shard_through_a_lone_surrogate_escape(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "ckpt", seed=5, bad_name=False)
    (ckpt / INDEX_NAME).write_text('{"metadata": {}, "weight_map": {"a.weight": "\\udcff.safetensors"}}')
    with pytest.raises(SnapshotError, match=r"'\\udcff\.safetensors'"):  # the index check names it
        open_snapshot_dir(ckpt)


@pytest.mark.skipif(sys.platform != "linux", reason="file names are bytes on Linux")
def test_the_cli_net_for_a_name_no_check_saw(capsys: pytest.CaptureFixture[str]) -> None:
    from cwtrain.cli.errors import fail

    error = UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed")
    assert fail(error, debug=False) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: a file or directory name is not valid UTF-8") and "internal error" not in err
