"""A fake OpenAI ``/v1/completions`` endpoint for the rollout sampler tests (httpx.MockTransport).

The fake "model" is deterministic: completion token ``j`` of choice ``i`` is
``(sum(prompt) + 7 * i + 3 * j + seed) % 97 + 3``, its log-prob ``-0.01 * (j + 1)``; the text is
one letter per token. ``shape`` picks where the exact ids go (interface.md §4.3).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

SHAPES = ("token_ids", "tokens", "nvext_choice", "nvext_engine", "nvext_top", "none")


def letters(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i % 26) for i in ids)


@dataclass
class FakeEndpoint:
    """Answers completions requests; records every request body."""

    shape: str = "token_ids"
    identity: str | None = "run-v000003"
    header_identity: str | None = None
    length: int = 5
    finish_reason: str = "stop"
    logprobs_null: bool = False
    routes: tuple[int, int] = (0, 0)  # (layers, top_k); 0 = no routes
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def completion(self, prompt: list[int], index: int, seed: int) -> list[int]:
        base = sum(prompt) + 7 * index + seed
        return [(base + 3 * j) % 97 + 3 for j in range(self.length)]

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["prompt"]
        prompt_ids = prompt if isinstance(prompt, list) else [ord(ch) for ch in prompt]
        n = body["n"]
        seed = body.get("seed", 0) % 1000
        choices = []
        top: dict[str, Any] = {}
        for i in reversed(range(n)):  # out of order on purpose: the sampler sorts by index
            ids = self.completion(prompt_ids, i, seed)
            choice: dict[str, Any] = {"index": i, "text": letters(ids), "finish_reason": self.finish_reason}
            logprobs: dict[str, Any] = {
                "token_logprobs": [None if self.logprobs_null else -0.01 * (j + 1) for j in range(len(ids))]
            }
            if self.shape == "token_ids":
                choice["token_ids"] = ids
                choice["prompt_token_ids"] = prompt_ids
            elif self.shape == "tokens":
                logprobs["tokens"] = [f"token_id:{t}" for t in ids]
            elif self.shape == "nvext_choice":
                choice["nvext"] = {"completion_token_ids": ids}
            elif self.shape == "nvext_engine":
                choice["nvext"] = {"engine_data": {"completion_token_ids": ids, "prompt_token_ids": prompt_ids}}
            elif self.shape == "nvext_top":
                top = {"completion_token_ids": ids}
            if body.get("logprobs"):
                choice["logprobs"] = logprobs
            if self.routes[0]:
                rows = len(prompt_ids) + len(ids) - 1
                layers, top_k = self.routes
                data = (np.arange(rows * layers * top_k) % 251).astype(np.uint8)
                routes = {
                    "data": base64.b64encode(data.tobytes()).decode(),
                    "shape": [rows, layers, top_k],
                    "start": 0,
                    "dtype": "uint8",
                }
                choice.setdefault("nvext", {})["routed_experts"] = routes
            choices.append(choice)
        payload: dict[str, Any] = {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": body["model"],
            "choices": choices,
            "usage": {"prompt_tokens": len(prompt_ids), "prompt_tokens_details": {"cached_tokens": 2}},
        }
        if self.identity is not None:
            payload["system_fingerprint"] = self.identity
        if top:
            payload["nvext"] = top
        return payload

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        headers = {"x-cwtrain-snapshot-identity": self.header_identity} if self.header_identity else {}
        return httpx.Response(200, json=self.answer(body), headers=headers)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)
