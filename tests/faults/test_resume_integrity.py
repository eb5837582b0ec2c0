"""A killed publisher, a rival with other bytes under the same identity, then the resume.

Publisher A (a real process, 5 MiB parts, one at a time, through the loopback proxy of
``tests/_s3_proxy.py``) is SIGKILLed when a chosen request of its multipart upload arrives
(that request never reaches the store). Publisher B then publishes other bytes under the
same identity: the same ``config.json`` (so B passes the first-file claim) and a large shard
equal to A's except in its last part (so the parts A left behind match B's first parts).
Then A is run again. For every kill point:

* every object stored under the identity holds exactly the bytes its ``cwtrain-sha256``
  names (read back and hashed);
* a publisher that reported success finds its own snapshot stored, whole, index included;
  the other one failed (a conflict, never a success over another's bytes);
* no unfinished multipart upload is left.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
from _s3_proxy import Request, S3Proxy
from safetensors.numpy import save_file

from cwtrain.errors import SnapshotError
from cwtrain.hotload.format.index import INDEX_NAME
from cwtrain.hotload.store import object_writer as objects
from cwtrain.hotload.store.snapshot_upload import upload_snapshot
from cwtrain.infra.s3 import s3_client

pytestmark = [pytest.mark.faults, pytest.mark.slow]

MIB = 1 << 20
PART = 5 * MIB
BIG = "model-00001-of-00002.safetensors"
SMALL = "model-00002-of-00002.safetensors"

# A publisher process: upload_snapshot with 5 MiB parts, one object and one part at a time.
PUBLISHER = textwrap.dedent(
    """
    import sys
    from cwtrain.hotload.store import object_writer as objects
    from cwtrain.hotload.store.snapshot_upload import upload_snapshot
    objects.MIN_PART_SIZE = 5 << 20
    print(upload_snapshot(sys.argv[1], bucket=sys.argv[2], identity=sys.argv[3], workers=1, part_size=5 << 20))
    """
)


def _snapshots(root: Path) -> tuple[Path, Path]:
    """A and B: one config.json, large shards equal but in their last 5 MiB part, other small shards."""
    rng = np.random.default_rng(26)
    big = rng.integers(0, 2**31, size=(18 * MIB) // 4, dtype=np.int64).astype(np.float32)  # 4 parts
    out = []
    for label, seed in (("a", 1), ("b", 2)):
        snap = root / label
        snap.mkdir(parents=True)
        mine = big.copy()
        if label == "b":
            mine[-1000:] += 1.0  # only the last part differs
        small = np.random.default_rng(seed).standard_normal(256).astype(np.float32)
        save_file({"model.embed.weight": mine}, str(snap / BIG))
        save_file({"lm_head.weight": small}, str(snap / SMALL))
        index = {
            "metadata": {"total_size": mine.nbytes + small.nbytes},
            "weight_map": {"model.embed.weight": BIG, "lm_head.weight": SMALL},
        }
        (snap / INDEX_NAME).write_text(json.dumps(index))
        (snap / "config.json").write_text(json.dumps({"model_type": "llama"}))
        out.append(snap)
    assert (out[0] / BIG).read_bytes()[: 3 * PART] == (out[1] / BIG).read_bytes()[: 3 * PART]
    return out[0], out[1]


def _part_number(request: Request) -> int:
    return int(parse_qs(urlsplit(request.path).query)["partNumber"][0])


#: Where A dies: (operation, which request of it, what the store holds by then).
KILL_POINTS = {
    "after-create": ("UploadPart", lambda r: r.key.endswith(BIG) and _part_number(r) == 1),
    "after-two-parts": ("UploadPart", lambda r: r.key.endswith(BIG) and _part_number(r) == 3),
    "before-complete": ("CompleteMultipartUpload", lambda r: r.key.endswith(BIG)),
    "after-complete": ("PutObject", lambda r: r.key.endswith(SMALL)),
}


@pytest.fixture
def proxy(s3_server: Any, s3_env: dict[str, str]) -> Iterator[S3Proxy]:
    with S3Proxy(s3_server.endpoint_url) as p:
        yield p


def _kill_publisher_at(proxy: S3Proxy, snap: Path, bucket: str, identity: str, point: str) -> None:
    operation, chosen = KILL_POINTS[point]
    killed = threading.Event()
    proc: list[subprocess.Popen[str]] = []

    def kill(request: Request) -> None:
        if not killed.is_set() and chosen(request):
            os.kill(proc[0].pid, signal.SIGKILL)
            killed.set()

    proxy.on(operation, kill)
    proxy.add_rule(lambda op, path, headers: (503, "SlowDown") if killed.is_set() else None)  # never stored
    env = {**os.environ, "CW_S3_ENDPOINT": proxy.endpoint_url}
    proc.append(
        subprocess.Popen(
            [sys.executable, "-c", PUBLISHER, str(snap), bucket, identity],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    )
    out, err = proc[0].communicate(timeout=120)
    assert proc[0].returncode == -signal.SIGKILL, (point, proc[0].returncode, out, err[-2000:])


def _publish(snap: Path, bucket: str, identity: str, store: Any) -> str:
    """``"ok"``, or the name of the error class the publish raised."""
    try:
        upload_snapshot(snap, bucket=bucket, identity=identity, s3=store, workers=1, part_size=PART)
    except SnapshotError as exc:
        return type(exc).__name__
    return "ok"


@pytest.mark.fault_row("resume-race")
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_resumed_upload_never_stores_bytes_its_record_does_not_name(
    point: str, tmp_path: Path, s3_bucket: tuple[Any, str], proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3, bucket = s3_bucket
    monkeypatch.setattr(objects, "MIN_PART_SIZE", PART)
    snap_a, snap_b = _snapshots(tmp_path)
    identity = f"resume-{point}"
    _kill_publisher_at(proxy, snap_a, bucket, identity, point)
    assert f"{identity}/{INDEX_NAME}" not in [
        o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"{identity}/").get("Contents", [])
    ]

    store = s3_client()  # straight to the store: no proxy
    rival = _publish(snap_b, bucket, identity, store)
    resumed = _publish(snap_a, bucket, identity, store)

    stored: dict[str, bytes] = {}
    for item in s3.list_objects_v2(Bucket=bucket, Prefix=f"{identity}/").get("Contents", []):
        obj = s3.get_object(Bucket=bucket, Key=item["Key"])
        data = obj["Body"].read()
        stored[item["Key"].rsplit("/", 1)[1]] = data
        assert hashlib.sha256(data).hexdigest() == obj["Metadata"]["cwtrain-sha256"], (point, item["Key"])
    outcomes = {"rival": rival, "resumed": resumed}
    assert list(outcomes.values()).count("ok") == 1, (point, outcomes)
    winner = snap_b if rival == "ok" else snap_a
    assert stored == {p.name: p.read_bytes() for p in winner.iterdir()}, (point, outcomes)
    loser = "resumed" if rival == "ok" else "rival"
    assert outcomes[loser] == "SnapshotConflictError", (point, outcomes)
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == [], point


def _store_multipart(s3: Any, bucket: str, key: str, data: bytes, sha256: str, part: int) -> None:
    """An object completed from ``part``-byte parts whose cwtrain-sha256 is ``sha256`` (as an old writer left it)."""
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata={"cwtrain-sha256": sha256})["UploadId"]
    parts = []
    for number, offset in enumerate(range(0, len(data), part), start=1):
        etag = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=data[offset : offset + part]
        )
        parts.append({"PartNumber": number, "ETag": etag["ETag"]})
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})


@pytest.mark.fault_row("resume-race")
def test_an_object_whose_bytes_are_not_its_record_is_never_taken_as_stored(
    tmp_path: Path, s3_bucket: tuple[Any, str], s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a resume before this fix could leave: B's bytes under A's cwtrain-sha256. A's publish refuses it."""
    s3, bucket = s3_bucket
    monkeypatch.setattr(objects, "MIN_PART_SIZE", PART)
    snap_a, snap_b = _snapshots(tmp_path)
    local = (snap_a / BIG).read_bytes()
    _store_multipart(
        s3, bucket, f"poisoned/{BIG}", (snap_b / BIG).read_bytes(), hashlib.sha256(local).hexdigest(), PART
    )
    with pytest.raises(SnapshotError, match=f"poisoned/{BIG}: the stored object records cwtrain-sha256 of the local"):
        upload_snapshot(snap_a, bucket=bucket, identity="poisoned", s3=s3_client(), workers=1, part_size=PART)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="poisoned/").get("Contents", [])]
    assert f"poisoned/{INDEX_NAME}" not in keys


@pytest.mark.fault_row("resume-race")
def test_an_object_stored_in_other_parts_is_read_back_before_it_counts_as_stored(
    tmp_path: Path, s3_bucket: tuple[Any, str], proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its ETag cannot be checked under this writer's part plan: the bytes are read back and hashed."""
    s3, bucket = s3_bucket
    monkeypatch.setattr(objects, "MIN_PART_SIZE", PART)
    snap_a, _ = _snapshots(tmp_path)
    local = (snap_a / BIG).read_bytes()
    _store_multipart(s3, bucket, f"sixes/{BIG}", local, hashlib.sha256(local).hexdigest(), 6 * MIB)
    upload_snapshot(snap_a, bucket=bucket, identity="sixes", s3=s3_client(proxy.endpoint_url), part_size=PART)
    assert [r.key for r in proxy.seen if r.operation == "GetObject"] == [f"sixes/{BIG}"]
    assert "UploadPart" not in proxy.operations()
