"""Fixtures of the cwtrain-gym tests: a stand-in ``gym`` CLI on PATH and a stub OpenAI endpoint."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from gym_support import FAKE_GYM, FakeGym, StubEndpoint


@pytest.fixture
def fake_gym(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGym:
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "gym"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_GYM}" "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    gym = FakeGym(bin_dir, tmp_path / "fake-gym-state.json", tmp_path / "fake-gym-calls.jsonl")
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_GYM_STATE", str(gym.state_path))
    monkeypatch.setenv("FAKE_GYM_LOG", str(gym.log_path))
    for name in ("FAKE_GYM_SERVE_FAIL", "FAKE_GYM_EVAL_FAIL", "FAKE_GYM_NEVER_READY"):
        monkeypatch.delenv(name, raising=False)
    return gym


@pytest.fixture
def openai_stub() -> Iterator[StubEndpoint]:
    stub = StubEndpoint(base_url="", api_key="stub-key-123", model="stub-model")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            ok = self.path == "/v1/completions" and self.headers.get("Authorization") == f"Bearer {stub.api_key}"
            stub.requests.append({"path": self.path, "body": body, "authorized": ok})
            payload: dict[str, Any]
            if not ok or body.get("model") != stub.model:
                payload, status = {"error": "unauthorized or unknown model"}, 401
            else:
                payload, status = (
                    {"model": stub.model, "choices": [{"index": 0, "text": " 42", "finish_reason": "length"}]},
                    200,
                )
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stub.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
