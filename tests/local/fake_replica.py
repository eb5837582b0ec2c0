"""A stdlib-only engine replica speaking the replica protocol, for fast control-plane tests.

Same options as ``python -m cwtrain.local.engine.replica``. Instead of a model it serves a
"checksum snapshot": a snapshot's index is JSON with ``metadata.payload_adler32``, the
Adler-32 of the object ``payload.bin`` beside it, verified on every hot-load (a flipped
byte fails it). Completions answer ``n`` choices naming the served identity and the
replica. ``/health`` also lists, under ``loaded``, every identity read from the store
since start, so tests can see a chain replayed. ``FAKE_REPLICA_LOAD_SECONDS`` (default
0.05) is the time each chain link takes to load.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import urllib.error
import urllib.request
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

INDEX = "model.safetensors.index.json"


class Replica:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lock = threading.Lock()
        self.identity: str | None = None
        self.state = "PENDING_UPDATE"
        self.error_reason: str | None = None
        self.hot_load_id: str | None = None
        self.loaded: list[str] = []
        self.loader: threading.Thread | None = None
        self.s3: Any = None
        self.delay = float(os.environ.get("FAKE_REPLICA_LOAD_SECONDS", "0.05"))

    def get(self, bucket: str, key: str) -> bytes:
        if self.s3 is None:
            import boto3
            from botocore.config import Config

            config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
            self.s3 = boto3.client("s3", endpoint_url=self.args.s3_endpoint, config=config)
        try:
            return bytes(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        except Exception as exc:
            raise OSError(f"s3://{bucket}/{key}: {exc}") from None

    def start(self) -> None:
        try:
            self._start()
        except Exception as exc:  # like the real replica: a replica that cannot load exits
            print(f"fake replica: cannot start: {exc}", flush=True)
            os._exit(1)

    def _start(self) -> None:
        if self.args.peer:
            with urllib.request.urlopen(self.args.peer + "/admin/weights", timeout=10) as response:
                self.identity = json.loads(response.read())["identity"]
        else:
            self.get(self.args.model_bucket, f"{self.args.model_path}/config.json")
            self.identity = "initial"
        self.state = "READY"

    def key(self, identity: str, name: str) -> str:
        prefix = self.args.path_prefix.strip("/")
        return f"{prefix}/{identity}/{name}" if prefix else f"{identity}/{name}"

    def load(self, hot_load_id: str, chain: list[dict[str, str]]) -> None:
        with self.lock:
            self.state = "UPDATING"
        names = [link["identity"] for link in chain]
        todo = names[names.index(self.identity) + 1 :] if self.identity in names else names
        try:
            for identity in todo:
                time.sleep(self.delay)
                index = json.loads(self.get(self.args.bucket, self.key(identity, INDEX)))
                expected = index["metadata"]["payload_adler32"]
                payload = self.get(self.args.bucket, self.key(identity, "payload.bin"))
                actual = f"{zlib.adler32(payload):08x}"
                if actual != expected:
                    raise ValueError(f"{identity}/payload.bin: Adler-32 {actual} != {expected}")
                self.loaded.append(identity)
        except (ValueError, KeyError, OSError, urllib.error.URLError) as exc:
            with self.lock:
                self.state, self.error_reason = "ERROR", f"{type(exc).__name__}: {exc}"
            return
        with self.lock:
            self.identity, self.state, self.error_reason = names[-1], "READY", None

    def hot_load(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if self.loader is not None and self.loader.is_alive():
                if body["hot_load_id"] == self.hot_load_id:
                    return 202, {}
                return 409, {"error": "busy"}
            self.hot_load_id = body["hot_load_id"]
            self.state = "PENDING_UPDATE"
            self.loader = threading.Thread(target=self.load, args=(body["hot_load_id"], body["chain"]), daemon=True)
            self.loader.start()
        return 202, {}

    def health(self) -> dict[str, Any]:
        with self.lock:
            return {
                "name": self.args.name,
                "state": self.state,
                "identity": self.identity,
                "error_reason": self.error_reason,
                "hot_load_id": self.hot_load_id,
                "loaded": list(self.loaded),
                "peer": self.args.peer,
            }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    replica: Replica

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        replica = self.replica
        if self.path == "/health":
            self.send(200 if replica.identity else 503, replica.health())
        elif self.path == "/admin/weights":
            self.send(200, {"identity": replica.identity})
        elif self.path == "/v1/models":
            self.send(200, {"object": "list", "data": [{"id": replica.args.model_name, "object": "model"}]})
        else:
            self.send(404, {"error": "no route"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        replica = self.replica
        if self.path == "/admin/hotload":
            self.send(*replica.hot_load(body))
        elif self.path == "/v1/completions":
            identity = replica.identity or ""
            n = int(body.get("n", 1))
            choices = [
                {"index": i, "text": f"{replica.args.name}:{identity}", "finish_reason": "length", "logprobs": None}
                for i in range(n)
            ]
            doc = {
                "id": "cmpl-fake",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "system_fingerprint": identity,
                "choices": choices,
                "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
            }
            self.send(200, doc, {"x-cwtrain-snapshot-identity": identity, "x-replica": replica.args.name})
        else:
            self.send(404, {"error": "no route"})


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--name", "--s3-endpoint", "--bucket", "--model-name", "--model-bucket", "--model-path"):
        parser.add_argument(name, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path-prefix", default="")
    parser.add_argument("--peer", default=None)
    args = parser.parse_args()
    replica = Replica(args)
    Handler.replica = replica
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    threading.Thread(target=replica.start, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
