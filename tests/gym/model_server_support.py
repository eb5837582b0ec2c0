"""Helpers of the model_server tests: a chat tokenizer over the tiny model's ids, a recording endpoint."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

EOS_CHAR = "|"


class TurnTokenizer:
    """A chat tokenizer over the tiny model's character ids: ``<role>:<content>|`` per message.

    ``|`` is the EOS token (id 0, the tiny model's ``<eos>``); the generation prompt is ``a:``.
    With ``drop_thinking`` the template drops ``<think>...</think>`` from assistant
    turns, as templates that re-render history differently do.
    """

    def __init__(self, *, drop_thinking: bool = False) -> None:
        from cwtrain.local.engine.model import Tokenizer

        self.inner = Tokenizer()
        self.drop_thinking = drop_thinking
        self.rendered: list[str] = []

    @property
    def eos_token_id(self) -> int:
        return 0

    @property
    def pad_token_id(self) -> int | None:
        return None

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, Any]],
        *,
        tools: Any = None,
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        **kwargs: Any,
    ) -> str:
        assert tokenize is False
        parts = []
        if tools:
            parts.append(f"t:{','.join(t['function']['name'] for t in tools)}{EOS_CHAR}")
        for message in conversation:
            content = message.get("content") or ""
            assert isinstance(content, str), "the renderer hands templates text content"
            assert "prompt_token_ids" not in message, "token fields must not reach the template"
            if self.drop_thinking and message["role"] == "assistant" and "</think>" in content:
                content = content.split("</think>", 1)[1]
            parts.append(f"{message['role'][0]}:{content}{EOS_CHAR}")
        if kwargs.get("prefix"):
            parts.insert(0, str(kwargs["prefix"]))
        text = "".join(parts) + ("a:" if add_generation_prompt else "")
        self.rendered.append(text)
        return text

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for ch in text:
            ids.extend([self.eos_token_id] if ch == EOS_CHAR else self.inner.encode(ch))
        return ids

    def decode(self, ids: Sequence[int], **kwargs: Any) -> str:
        return "".join(EOS_CHAR if i == self.eos_token_id else self.inner.decode([i]) for i in ids)


class RecordingEndpoint:
    """A deployment's ``/v1/completions`` as an ``httpx.MockTransport``: records each body.

    Every completion is ``reply`` ids (default ``[20, 21, 0]``: two characters and EOS), log-prob
    -0.25 each, served by ``identity``. ``status``/``error`` make it refuse instead.
    """

    def __init__(self, identity: str = "run-v000004", reply: Sequence[int] = (20, 21, 0)) -> None:
        self.identity = identity
        self.reply = list(reply)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[httpx.Headers] = []
        self.status = 200
        self.error = ""

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content)
            self.requests.append(body)
            self.headers.append(request.headers)
            if self.status != 200:
                return httpx.Response(self.status, text=self.error)
            ids = self.reply[: body["max_tokens"]]
            choice = {
                "index": 0,
                "text": "".join(chr(ord("a") + i % 26) for i in ids),
                "finish_reason": "stop" if ids and ids[-1] == 0 else "length",
                "token_ids": ids,
                "prompt_token_ids": body["prompt"],
                "logprobs": {"token_logprobs": [-0.25] * len(ids)},
            }
            return httpx.Response(
                200, json={"choices": [choice], "usage": {}}, headers={"x-cwtrain-snapshot-identity": self.identity}
            )

        return httpx.MockTransport(handler)
