"""SIGTERM stops a command exactly as Ctrl-C does: same clean-up, exit 143 (SIGINT: 130).

Real signals to a real ``cwtrain`` process. During ``hotload publish``'s upload (a part held
by the loopback proxy, so the signal lands while the multipart upload is open): no index, no
unfinished multipart upload, a line saying what stays stored. While it waits for the
hot-load: the hot-load is named as still running. During ``snapshot diff``: no hidden
``.DIR.*.partial`` directory is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _s3_proxy import Request, S3Proxy
from safetensors.numpy import save_file

from cwtrain.hotload.format.index import INDEX_NAME

pytestmark = [pytest.mark.faults]

CWTRAIN = str(Path(sys.executable).parent / "cwtrain")
SIGNALS = [pytest.param(signal.SIGTERM, 143, "error: terminated (SIGTERM)", id="SIGTERM"),
           pytest.param(signal.SIGINT, 130, "error: interrupted", id="SIGINT")]  # fmt: skip


def _checkpoint(root: Path, *, seed: int, nbytes: int) -> Path:
    """A FULL checkpoint: one shard of ``nbytes`` of random float32 tensors, its index and config.json."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    tensors = {f"layer.{i}.weight": rng.standard_normal(nbytes // 16).astype(np.float32) for i in range(4)}
    save_file(tensors, str(root / "model-00001-of-00001.safetensors"), metadata={"format": "pt"})
    index = {
        "metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
        "weight_map": dict.fromkeys(tensors, "model-00001-of-00001.safetensors"),
    }
    (root / INDEX_NAME).write_text(json.dumps(index))
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return root


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[Any]:
    with shared_stack.view("faults-signals", replicas=1) as local:
        yield local


@pytest.fixture(scope="module")
def deployed(stack: Any) -> Any:
    return stack.deploy(name="signals", replicas=1)


def _publish(deployed: Any, checkpoint: Path) -> list[str]:
    return [CWTRAIN, "hotload", "publish", "--deployment", deployed.deployment_id, "--checkpoint", str(checkpoint)]


def _ended(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.e2e
@pytest.mark.fault_row("sigterm")
@pytest.mark.parametrize(("signum", "code", "line"), SIGNALS)
def test_a_signal_during_the_upload_aborts_it_and_says_so(
    signum: int, code: int, line: str, tmp_path: Path, stack: Any, deployed: Any
) -> None:
    ckpt = _checkpoint(tmp_path / "ckpt", seed=1, nbytes=64 << 20)  # two parts of 50 MB
    held, release = threading.Event(), threading.Event()

    def hold_the_first_data_part(request: Request) -> None:
        if "partNumber=10000" not in request.path and not held.is_set():
            held.set()
            release.wait(30)

    with S3Proxy(stack.s3_endpoint) as proxy:
        proxy.on("UploadPart", hold_the_first_data_part)
        env = {**os.environ, **stack.env(), "CW_S3_ENDPOINT": proxy.endpoint_url}
        env["CWTRAIN_HOTLOAD_PART_SIZE"] = str(50_000_000)
        identity = f"signal-{signum}-v000001"
        proc = subprocess.Popen(
            [*_publish(deployed, ckpt), "--identity", identity, "--workers", "1"],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        try:
            assert held.wait(60), "the upload never sent a part"
            proc.send_signal(signum)
            time.sleep(0.3)
            release.set()
            returncode, err = _ended(proc)
        finally:
            release.set()
            if proc.poll() is None:
                proc.kill()
    assert returncode == code, err[-3000:]
    assert err.rstrip().splitlines()[-1] == line, err[-3000:]
    assert "no index was written and its unfinished multipart uploads were aborted" in err
    s3 = stack.s3_client()
    keys = [
        o["Key"] for o in s3.list_objects_v2(Bucket=stack.bucket, Prefix=f"hotload/{identity}/").get("Contents", [])
    ]
    assert f"hotload/{identity}/{INDEX_NAME}" not in keys
    assert s3.list_multipart_uploads(Bucket=stack.bucket, Prefix=f"hotload/{identity}/").get("Uploads", []) == []


@pytest.mark.e2e
@pytest.mark.fault_row("sigterm")
def test_sigterm_while_waiting_for_the_hot_load_names_it(tmp_path: Path, stack: Any, deployed: Any) -> None:
    from cwtrain.local.engine.model import write_base_checkpoint

    write_base_checkpoint(tmp_path / "full", seed=4)
    stack.faults.api.delay_next(20, seconds=1.0, method="GET", path=r"^/hotLoads/[^/:]+$")
    proc = subprocess.Popen(
        [*_publish(deployed, tmp_path / "full"), "--identity", "waited-v000001", "--poll-interval", "0.2"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **stack.env()},
    )
    assert proc.stderr is not None
    seen = []
    for text in proc.stderr:  # until the hot-load is created
        seen.append(text)
        if "creating FULL hot-load" in text:
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    returncode, err = _ended(proc)
    stack.faults.api.clear()
    err = "".join(seen) + err
    assert returncode == 143, err[-3000:]
    assert "it keeps running and may still go live (follow it with `cwtrain hotload wait" in err, err[-3000:]


@pytest.mark.fault_row("sigterm")
@pytest.mark.parametrize(("signum", "code", "line"), SIGNALS)
def test_a_signal_during_snapshot_diff_leaves_no_partial_directory(
    signum: int, code: int, line: str, tmp_path: Path
) -> None:
    base = _checkpoint(tmp_path / "base", seed=2, nbytes=160 << 20)
    new = _checkpoint(tmp_path / "new", seed=3, nbytes=160 << 20)
    out = tmp_path / "out" / "delta"
    out.parent.mkdir()
    proc = subprocess.Popen(
        [
            CWTRAIN,
            "snapshot",
            "diff",
            str(base),
            str(new),
            "--out",
            str(out),
            "--version",
            "1",
            "--base-version",
            "0",
            "--workers",
            "1",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not any(p.name.endswith(".partial") for p in out.parent.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "the diff never staged its output"
        time.sleep(0.001)
    proc.send_signal(signum)
    returncode, err = _ended(proc)
    assert returncode == code, err[-3000:]
    assert err.rstrip().splitlines()[-1] == line
    assert list(out.parent.iterdir()) == []
