"""Helpers for the replica tests: upload a base checkpoint, start and stop replica processes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from cwtrain.hotload.store.object_writer import SHA256_METADATA
from cwtrain.local.engine.model import write_base_checkpoint
from cwtrain.local.engine.processes import TOKEN_VARIABLE
from cwtrain.local.harness.objectstore import free_port

MODEL = "tiny-test"
#: The replica token these tests start replicas with (every request carries it).
TOKEN = "test-replica-token"


def upload_base(s3: Any, bucket: str, path: str, *, seed: int = 0) -> None:
    """Write the tiny base checkpoint and upload its files under ``s3://bucket/path/``."""
    with tempfile.TemporaryDirectory() as tmp:
        write_base_checkpoint(tmp, seed=seed)
        for file in sorted(Path(tmp).iterdir()):
            s3.put_object(Bucket=bucket, Key=f"{path}/{file.name}", Body=file.read_bytes())


class ReplicaProcess:
    """``python -m cwtrain.local.engine.replica`` as a child process on a free loopback port."""

    def __init__(
        self,
        server: Any,
        bucket: str,
        *,
        name: str = "r0",
        prefix: str = "hotload",
        model_bucket: str | None = None,
        model_path: str = "base",
        peer: str | None = None,
        apply_delay: float = 0.0,
    ) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable, "-m", "cwtrain.local.engine.replica", "--name", name, "--port", str(self.port),
            "--s3-endpoint", server.endpoint_url, "--bucket", bucket, "--path-prefix", prefix,
            "--model-name", MODEL, "--model-bucket", model_bucket or bucket, "--model-path", model_path,
            "--apply-delay", str(apply_delay),
        ]  # fmt: skip
        if peer:
            cmd += ["--peer", peer]
        env = dict(os.environ) | server.credentials | {TOKEN_VARIABLE: TOKEN}
        self.token = TOKEN
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        self.client = httpx.Client(base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"})

    def wait_ready(self, timeout: float = 180.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica exited: {self.output()[-2000:]}")
            try:
                resp = self.client.get("/health")
                if resp.status_code == 200:
                    return dict(resp.json())
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"replica {self.name} not ready after {timeout}s")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def health(self) -> dict[str, Any]:
        return dict(self.client.get("/health").json())

    def hot_load(self, identity: str, chain: list[tuple[str, str]], hot_load_id: str = "hl") -> httpx.Response:
        body = {
            "hot_load_id": hot_load_id,
            "identity": identity,
            "chain": [{"identity": i, "type": t} for i, t in chain],
        }
        return self.client.post("/admin/hotload", json=body)

    def wait_settled(self, hot_load_id: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doc = self.health()
            if doc["hot_load_id"] == hot_load_id and doc["state"] in ("READY", "ERROR"):
                return doc
            time.sleep(0.05)
        raise TimeoutError(f"hot-load {hot_load_id} did not settle on {self.name}")

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def put_object(s3: Any, bucket: str, key: str, data: bytes) -> None:
    """Store ``data`` with its SHA-256 in ``cwtrain-sha256``, as cwtrain's uploader does."""
    s3.put_object(Bucket=bucket, Key=key, Body=data, Metadata={SHA256_METADATA: hashlib.sha256(data).hexdigest()})


def put_snapshot(s3: Any, bucket: str, prefix: str, identity: str, snapshot: Any) -> None:
    """Upload an ``EncodedSnapshot`` (shards first, index last) under ``prefix/identity/``, each with its SHA-256."""
    for file in snapshot.all_files:
        put_object(s3, bucket, f"{prefix}/{identity}/{file.name}", file.tobytes())
