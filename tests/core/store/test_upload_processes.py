"""Publisher processes: killed with SIGKILL mid-upload, and two racing on one identity."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from _upload_util import MIB, open_uploads, sha256, stored, write_full_snapshot

from cwtrain.hotload.format.index import INDEX_NAME
from cwtrain.hotload.store import object_writer as objects
from cwtrain.hotload.store.snapshot_upload import UploadedFile, upload_snapshot
from cwtrain.infra.s3 import s3_client

PART = 5 * MIB

# A publisher: 5 MiB parts, one part at a time, reporting each confirmed part on stdout. Given
# a go-file, it says "waiting" once it is ready and starts when the file appears.
PUBLISHER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from cwtrain.errors import SnapshotConflictError
    from cwtrain.hotload.store import object_writer as objects
    from cwtrain.hotload.store.snapshot_upload import upload_snapshot
    from cwtrain.infra.s3 import s3_client

    objects.MIN_PART_SIZE = 5 << 20
    snap, bucket, identity, go, delay = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
    s3 = s3_client()

    def on_progress(n):
        print("progress", n, flush=True)
        time.sleep(delay)

    if go:
        print("waiting", flush=True)
    while go and not Path(go).exists():
        time.sleep(0.005)
    try:
        uri = upload_snapshot(snap, bucket=bucket, identity=identity, s3=s3, workers=1,
                              part_size=5 << 20, on_progress=on_progress)
    except SnapshotConflictError as exc:
        print("conflict", exc, flush=True)
        sys.exit(3)
    print("ok", uri, flush=True)
    """
)


def _publisher(snap: Path, bucket: str, identity: str, go: str = "", delay: float = 0.0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, str(snap), bucket, identity, go, str(delay)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.fault_row("kill-publisher")
def test_killed_publisher_leaves_no_index_and_rerun_completes(
    tmp_path: Path, s3_bucket: tuple[Any, str], s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, bucket = s3_bucket
    snap = write_full_snapshot(tmp_path / "snap", seed=11, big_bytes=30 * MIB)
    proc = _publisher(snap, bucket, "killed", delay=0.3)
    try:
        assert proc.stdout is not None
        confirmed = 0
        deadline = time.monotonic() + 60
        while confirmed < 3 and time.monotonic() < deadline:  # config.json, then two 5 MiB parts
            line = proc.stdout.readline()
            if not line:
                break
            confirmed += line.startswith("progress")
        assert confirmed == 3, proc.stderr.read() if proc.stderr else ""
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    s3 = s3_client()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert f"killed/{INDEX_NAME}" not in keys
    assert [u["Key"] for u in open_uploads(s3, bucket)] == ["killed/model-00001-of-00002.safetensors"]

    monkeypatch.setattr(objects, "MIN_PART_SIZE", PART)
    parts: list[str] = []
    s3.meta.events.register("before-call.s3.UploadPart", lambda params, **_: parts.append(params["url_path"]))
    seen: list[UploadedFile] = []
    upload_snapshot(snap, bucket=bucket, identity="killed", s3=s3, part_size=PART, on_file=seen.append)
    total_parts = -(-(snap / "model-00001-of-00002.safetensors").stat().st_size // PART)
    assert 0 < len(parts) <= total_parts - 2  # the parts stored before the kill were not sent again
    assert {f.name: f.outcome for f in seen}["config.json"] == "existing"
    got = stored(s3, bucket, "killed")
    local = {p.name: p.read_bytes() for p in snap.iterdir()}
    assert set(got) == set(local)
    for name, (data, metadata, _) in got.items():
        assert data == local[name] and metadata["cwtrain-sha256"] == sha256(data), name
    assert open_uploads(s3, bucket) == []


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.fault_row("race")
def test_two_racing_publishers_exactly_one_wins(
    tmp_path: Path, s3_bucket: tuple[Any, str], s3_env: dict[str, str]
) -> None:
    _, bucket = s3_bucket
    snaps = [write_full_snapshot(tmp_path / f"s{i}", seed=20 + i) for i in range(2)]
    go = tmp_path / "go"
    procs = [_publisher(snap, bucket, "raced", go=str(go)) for snap in snaps]
    for proc in procs:  # both are ready (imports done, client made) before either may start
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()  # nothing more comes until the go-file exists
        assert line == "waiting\n", line or proc.stderr.read()
    go.touch()
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        outputs.append((proc.returncode, out, err))
    codes = sorted(code for code, _, _ in outputs)
    assert codes == [0, 3], outputs
    winner = snaps[[code for code, _, _ in outputs].index(0)]
    loser_out = next(out for code, out, _ in outputs if code == 3)
    assert "raced" in loser_out and "new identity" in loser_out
    got = stored(s3_client(), bucket, "raced")
    local = {p.name: p.read_bytes() for p in winner.iterdir()}
    assert set(got) == set(local)
    for name, (data, metadata, _) in got.items():
        assert data == local[name] and metadata["cwtrain-sha256"] == sha256(data), name
    assert open_uploads(s3_client(), bucket) == []
