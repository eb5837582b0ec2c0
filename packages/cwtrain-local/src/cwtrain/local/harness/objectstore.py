"""Object storage on loopback: moto's S3 server in a child process.

``MotoS3Server`` starts moto's server (through :mod:`cwtrain.local.harness.moto_s3`, which
makes it answer ``NoSuchUpload`` and list part ETags as S3 does, and checks SigV4 signatures
with the server's keys, :attr:`MotoS3Server.credentials`) on ``127.0.0.1`` (a free
port unless one is given), waits until it answers, and stops it (and only it) on exit, also
on an exception; the kernel ends it when its parent dies (:mod:`cwtrain.local.children`).
Tests and :class:`cwtrain.local.LocalStack` use it::

    with MotoS3Server() as store:
        s3 = store.client()
        s3.create_bucket(Bucket="weights")
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import Any

from cwtrain.local.children import start_child
from cwtrain.local.harness.moto_s3 import ACCESS_KEY_VARIABLE, SECRET_KEY_VARIABLE

__all__ = ["DEFAULT_REGION", "MotoS3Server", "free_port"]

#: The region the local stack uses; CoreWeave regions are availability zones.
DEFAULT_REGION = "US-EAST-04A"
_ACCESS_KEY = "cwtrain-local-access"  # not the bucket name: errors mask the key in every form
_SECRET_KEY = "cwtrain-local-secret"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MotoS3Server:
    """moto's S3 server as a child process on loopback.

    Args:
        port: the port (a free one when ``None``).
        access_key: the one access key id the server accepts.
        secret_key: its secret key.
        startup_timeout: seconds to wait for the server to answer.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        access_key: str = _ACCESS_KEY,
        secret_key: str = _SECRET_KEY,
        startup_timeout: float = 60.0,
    ) -> None:
        self.port = port or free_port()
        self.access_key = access_key
        self.secret_key = secret_key
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def credentials(self) -> dict[str, str]:
        """The one key pair the server accepts (it refuses any other signature), as environment variables."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": DEFAULT_REGION,
            "CW_S3_ENDPOINT": self.endpoint_url,
        }

    def start(self) -> MotoS3Server:
        """Start the server and wait until it answers HTTP."""
        if self._proc is not None:
            return self
        env = dict(os.environ)
        env.setdefault("MOTO_ALLOW_NONEXISTENT_REGION", "true")
        env[ACCESS_KEY_VARIABLE], env[SECRET_KEY_VARIABLE] = self.access_key, self.secret_key
        self._proc = start_child(
            [sys.executable, "-m", "cwtrain.local.harness.moto_s3", "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise RuntimeError(f"moto S3 server exited at start (code {code}); is moto[server] installed?")
            try:
                with urllib.request.urlopen(self.endpoint_url + "/moto-api/", timeout=2):
                    return self
            except urllib.error.HTTPError:
                return self  # it answers
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto S3 server did not answer on {self.endpoint_url}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server process (its whole process group)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)

    def reset(self) -> None:
        """Drop every bucket and object (moto's reset endpoint)."""
        request = urllib.request.Request(self.endpoint_url + "/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def client(self, **kwargs: Any) -> Any:
        """A boto3 S3 client for this server (path-style addressing, static keys)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=DEFAULT_REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                retries={"max_attempts": 3, "mode": "standard"},
            ),
            **kwargs,
        )

    def __enter__(self) -> MotoS3Server:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
