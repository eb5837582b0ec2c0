"""A fake OpenAI ``/v1/completions`` server on 127.0.0.1 for the rollout contract tests.

Deterministic: completion token ``j`` of choice ``i`` is ``(sum(prompt) + 5 * i + j) % 50 + 2``,
its log-prob ``-0.1 * (j + 1)``; text is one letter per token; choice ``i`` of a group stops
(``"stop"``) when ``i`` is even, else runs to ``max_tokens`` (``"length"``). Text prompts are
tokenised one id per character. Each answer carries ``x-cwtrain-snapshot-identity``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeCompletions:
    """Context manager: ``with FakeCompletions(identity="run-v000004") as fake: fake.base_url``."""

    def __init__(self, identity: str | None = "run-v000004", length: int = 4) -> None:
        self.identity = identity
        self.length = length
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = 0
        self.peak = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake._lock:
                    fake.bodies.append(body)
                    fake.in_flight += 1
                    fake.peak = max(fake.peak, fake.in_flight)
                try:
                    payload = json.dumps(fake.answer(body)).encode()
                finally:
                    with fake._lock:
                        fake.in_flight -= 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                if fake.identity:
                    self.send_header("x-cwtrain-snapshot-identity", fake.identity)
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["prompt"]
        ids = list(prompt) if isinstance(prompt, list) else [ord(c) % 50 + 2 for c in prompt]
        choices = []
        for i in range(int(body.get("n", 1))):
            stop = i % 2 == 0
            count = min(self.length - 1 if stop else self.length, int(body["max_tokens"]))
            tokens = [(sum(ids) + 5 * i + j) % 50 + 2 for j in range(count)]
            choices.append(
                {
                    "index": i,
                    "text": "".join(chr(ord("a") + t % 26) for t in tokens),
                    "token_ids": tokens,
                    "prompt_token_ids": ids,
                    "finish_reason": "stop" if stop else "length",
                    "logprobs": {"token_logprobs": [-0.1 * (j + 1) for j in range(count)]},
                }
            )
        return {"id": "cmpl-1", "object": "text_completion", "model": body["model"], "choices": choices}

    def __enter__(self) -> FakeCompletions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
