"""The official ``openai`` client against the local stack's gateway: completions and chat, streamed and not.

Every answer's token ids and log-probs are checked against the tiny model scoring the same
sequence (:func:`cwtrain.local.engine.model.token_logprobs`), so the streams and the plain answers
carry exactly what the engine sampled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cwtrain.local import LocalStack
from cwtrain.local.engine.model import Tokenizer, init_weights, token_logprobs

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.e2e
TOK = Tokenizer()
WEIGHTS = init_weights(seed=0)  # LocalStack.deploy's base checkpoint
CHAT = [{"role": "system", "content": "answer briefly"}, {"role": "user", "content": "what is two plus two?"}]
IDS = {"return_token_ids": True, "return_tokens_as_token_ids": True}


@pytest.fixture(scope="module")
def local() -> Iterator[tuple[LocalStack, Any]]:
    with LocalStack(replicas=1) as stack:
        yield stack, stack.deploy(name="openai", timeout=120)


@pytest.fixture
def client(local: tuple[LocalStack, Any]) -> Iterator[Any]:
    stack, target = local
    with openai.OpenAI(base_url=target.base_url, api_key=stack.token, max_retries=0) as client:
        yield client


def _as_ids(tokens: list[str]) -> list[int]:
    assert all(t.startswith("token_id:") for t in tokens)
    return [int(t.removeprefix("token_id:")) for t in tokens]


def _check(prompt: list[int], ids: list[int], logprobs: list[float]) -> None:
    assert ids and len(logprobs) == len(ids)
    assert logprobs == pytest.approx(token_logprobs(WEIGHTS, prompt, ids), abs=2e-4)


def _chat_prompt() -> list[int]:
    return TOK.encode(TOK.apply_chat_template(CHAT, add_generation_prompt=True))


def test_completions(client: Any) -> None:
    raw = client.completions.with_raw_response.create(
        model="cwtrain-tiny", prompt="two plus two is", n=2, max_tokens=10, logprobs=2, seed=3, extra_body=IDS
    )
    assert raw.headers["x-cwtrain-snapshot-identity"] == "initial"
    out = raw.parse()
    assert out.system_fingerprint == "initial" and len(out.choices) == 2
    for choice in out.choices:
        extra = choice.model_extra
        prompt, ids = extra["prompt_token_ids"], extra["token_ids"]
        assert prompt == TOK.encode("two plus two is", add_special_tokens=True)
        assert _as_ids(choice.logprobs.tokens) == ids
        _check(prompt, ids, choice.logprobs.token_logprobs)
        assert all(len(top) in (2, 3) for top in choice.logprobs.top_logprobs)
    assert out.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in out.choices)


def test_completions_stream(client: Any) -> None:
    prompt = TOK.encode("count: ")
    stream = client.completions.create(
        model="cwtrain-tiny",
        prompt=prompt,
        n=2,
        max_tokens=12,
        logprobs=0,
        seed=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=IDS,
    )
    ids: dict[int, list[int]] = {0: [], 1: []}
    logprobs: dict[int, list[float]] = {0: [], 1: []}
    texts = {0: "", 1: ""}
    usage = None
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        for choice in chunk.choices:
            ids[choice.index] += choice.model_extra["token_ids"]
            assert _as_ids(choice.logprobs.tokens) == choice.model_extra["token_ids"]
            logprobs[choice.index] += choice.logprobs.token_logprobs
            texts[choice.index] += choice.text
    for index in (0, 1):
        _check(prompt, ids[index], logprobs[index])
        assert TOK.decode(ids[index]) == texts[index] or ids[index][-1] == TOK.eos_token_id
    assert usage is not None and usage.completion_tokens == len(ids[0]) + len(ids[1])


def test_chat_completions(client: Any) -> None:
    out = client.chat.completions.create(
        model="cwtrain-tiny", messages=CHAT, max_tokens=10, logprobs=True, top_logprobs=2, seed=5, extra_body=IDS
    )
    choice = out.choices[0]
    prompt = out.model_extra["prompt_token_ids"]
    assert prompt == _chat_prompt()
    ids = choice.model_extra["token_ids"]
    assert _as_ids([t.token for t in choice.logprobs.content]) == ids
    _check(prompt, ids, [t.logprob for t in choice.logprobs.content])
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in choice.logprobs.content)
    assert choice.message.role == "assistant" and out.system_fingerprint == "initial"
    assert choice.message.content == TOK.decode(ids if choice.finish_reason == "length" else ids[:-1])


def test_chat_completions_stream(client: Any) -> None:
    stream = client.chat.completions.create(
        model="cwtrain-tiny",
        messages=CHAT,
        max_tokens=12,
        logprobs=True,
        seed=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=IDS,
    )
    chunks = list(stream)
    prompt = chunks[0].model_extra["prompt_token_ids"]
    assert prompt == _chat_prompt() and chunks[0].choices[0].delta.role == "assistant"
    body = [c for c in chunks[1:] if c.choices]
    ids = [t for c in body for t in c.choices[0].model_extra["token_ids"]]
    content = [t for c in body for t in c.choices[0].logprobs.content]
    assert _as_ids([t.token for t in content]) == ids
    _check(prompt, ids, [t.logprob for t in content])
    assert body[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage.completion_tokens == len(ids) and chunks[-1].system_fingerprint == "initial"


def test_async_client_streams_and_tokenize_agrees(local: tuple[LocalStack, Any]) -> None:
    stack, target = local

    async def run() -> tuple[list[int], list[float]]:
        async with openai.AsyncOpenAI(base_url=target.base_url, api_key=stack.token, max_retries=0) as client:
            stream = await client.chat.completions.create(
                model="cwtrain-tiny", messages=CHAT, max_tokens=8, logprobs=True, seed=7, stream=True, extra_body=IDS
            )
            ids: list[int] = []
            logprobs: list[float] = []
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].logprobs:
                    ids += chunk.choices[0].model_extra["token_ids"]
                    logprobs += [t.logprob for t in chunk.choices[0].logprobs.content]
            return ids, logprobs

    ids, logprobs = asyncio.run(run())
    origin = target.base_url.removesuffix("/v1")
    auth = {"Authorization": f"Bearer {stack.token}"}
    tokens = httpx.post(origin + "/tokenize", json={"model": target.model, "messages": CHAT}, headers=auth).json()
    assert tokens["tokens"] == _chat_prompt() and tokens["max_model_len"] == 256
    _check(tokens["tokens"], ids, logprobs)
    text = httpx.post(origin + "/detokenize", json={"model": target.model, "tokens": ids}, headers=auth).json()
    assert text["prompt"] == TOK.decode(ids, skip_special_tokens=False)


def test_prompt_logprobs_through_the_gateway(client: Any, local: tuple[LocalStack, Any]) -> None:
    """``echo`` + ``logprobs`` + ``max_tokens: 0`` and ``prompt_logprobs``, as a canary asks: the official client and raw HTTP."""
    prompt = TOK.encode("the quick brown fox", add_special_tokens=True)
    expected = token_logprobs(WEIGHTS, prompt[:1], prompt[1:])
    raw = client.completions.with_raw_response.create(
        model="cwtrain-tiny", prompt=prompt, echo=True, logprobs=1, max_tokens=0,
        extra_body={"prompt_logprobs": 1, "return_tokens_as_token_ids": True},
    )  # fmt: skip
    assert raw.headers["x-cwtrain-snapshot-identity"] == "initial"
    (choice,) = raw.parse().choices
    assert _as_ids(choice.logprobs.tokens) == prompt
    assert choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(expected, abs=2e-4)
    plp = choice.model_extra["prompt_logprobs"]
    assert plp[0] is None
    assert [entry[str(t)]["logprob"] for entry, t in zip(plp[1:], prompt[1:])] == pytest.approx(expected, abs=2e-4)

    stack, target = local
    response = httpx.post(
        target.base_url + "/completions",
        json={"model": target.model, "prompt": prompt, "echo": True, "logprobs": 0, "max_tokens": 1},
        headers={"Authorization": f"Bearer {stack.token}"},
        timeout=60,
    )
    assert response.status_code == 200 and response.headers["x-cwtrain-snapshot-identity"] == "initial"
    block = response.json()["choices"][0]["logprobs"]
    assert len(block["token_logprobs"]) == len(prompt) + 1  # the prompt, then the one token generated
    assert block["token_logprobs"][1 : len(prompt)] == pytest.approx(expected, abs=2e-4)


def test_vllm_routes_outside_v1_answer_without_a_key(local: tuple[LocalStack, Any]) -> None:
    """Issue 27: vLLM's /health, /ping, /version and /metrics answer, and only /v1 needs the key (vLLM's --api-key)."""
    stack, target = local
    origin = target.base_url.removesuffix("/v1")
    health = httpx.get(origin + "/health")
    assert health.status_code == 200 and health.content == b""
    assert httpx.get(origin + "/ping").status_code == 200 and httpx.post(origin + "/ping").status_code == 200
    assert httpx.get(origin + "/version").json() == {"version": "0.31.0"}
    metrics = httpx.get(origin + "/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert f'cwtrain_local_served_identity{{model_name="{target.model}",identity="initial"}} 1' in metrics.text
    assert f'vllm:num_requests_running{{model_name="{target.model}"}} ' in metrics.text
    tokens = httpx.post(origin + "/tokenize", json={"model": target.model, "prompt": "two"})
    assert tokens.status_code == 200 and tokens.json()["tokens"] == TOK.encode("two", add_special_tokens=True)
    assert httpx.post(origin + "/detokenize", json={"model": target.model, "tokens": [5]}).status_code == 200
    # /v1 still needs the key; the 401 carries its code as a number, as every other error does
    refused = httpx.get(origin + "/v1/models")
    assert refused.status_code == 401
    assert refused.json()["error"] == {
        "message": "missing bearer token (Authorization: Bearer <key>)",
        "type": "authentication_error",
        "code": 401,
    }
    wrong = httpx.post(origin + "/v1/completions", json={"model": target.model}, headers={"Authorization": "Bearer x"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == 401
    missing = httpx.post(
        origin + "/v1/nothing", json={"model": target.model}, headers={"Authorization": f"Bearer {stack.token}"}
    )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404
