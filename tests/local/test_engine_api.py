"""A replica's engine endpoint in-process, against vLLM 0.31's shapes: chat, streams, tokenizer routes, errors."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cwtrain.local.engine.model import ModelConfig, Tokenizer, init_weights, to_tensor_data, token_logprobs
from cwtrain.local.engine.replica import Replica, ReplicaServer
from cwtrain.local.engine.snapshots import ServedWeights

MODEL = "tiny-engine"
SEED = 3
TOK = Tokenizer()
WEIGHTS = init_weights(seed=SEED)
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
TOKEN = "engine-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def engine() -> Iterator[httpx.Client]:
    replica = Replica("solo", MODEL, None, model_root="s3://models/tiny")
    replica.set_served(ServedWeights.build("initial", ModelConfig(), to_tensor_data(WEIGHTS)))
    server = ReplicaServer(replica, token=TOKEN).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60, headers=AUTH) as client:
            yield client
    finally:
        server.stop()


def _post(engine: httpx.Client, path: str, **body: Any) -> Any:
    response = engine.post(path, json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    return response.json()


def _events(response: httpx.Response) -> list[Any]:
    """The JSON of every ``data:`` event, checking vLLM's framing (and the final ``[DONE]``)."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert response.headers["transfer-encoding"] == "chunked" and "content-length" not in response.headers
    raw = response.text
    assert raw.endswith("data: [DONE]\n\n")
    blocks = raw.split("\n\n")[:-2]
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks)
    return [json.loads(b[len("data: ") :]) for b in blocks]


def _chat_prompt(messages: list[dict[str, Any]]) -> list[int]:
    return TOK.encode(TOK.apply_chat_template(messages, add_generation_prompt=True))


def test_chat_completion_has_vllm_fields_token_ids_and_the_models_logprobs(engine: httpx.Client) -> None:
    doc = _post(
        engine,
        "/v1/chat/completions",
        messages=CHAT,
        max_tokens=10,
        seed=5,
        n=2,
        logprobs=True,
        top_logprobs=3,
        return_token_ids=True,
        return_tokens_as_token_ids=True,
        metadata={"unknown": "fields are ignored"},
    )
    prompt = _chat_prompt(CHAT)
    assert list(doc) == [
        "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint", "usage",
        "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params", "ec_transfer_params", "metrics",
    ]  # fmt: skip
    assert doc["id"].startswith("chatcmpl-") and doc["object"] == "chat.completion" and doc["model"] == MODEL
    assert doc["system_fingerprint"] == "initial" and doc["prompt_token_ids"] == prompt
    total = 0
    for index, choice in enumerate(doc["choices"]):
        ids = choice["token_ids"]
        total += len(ids)
        assert choice["index"] == index and choice["routed_experts"] is None
        assert choice["message"] == {
            "role": "assistant",
            "content": TOK.decode(ids if choice["finish_reason"] == "length" else ids[:-1]),
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        content = choice["logprobs"]["content"]
        assert [c["token"] for c in content] == [f"token_id:{t}" for t in ids]
        assert [c["bytes"] for c in content] == [list(TOK.token_text(t).encode()) for t in ids]
        assert [c["logprob"] for c in content] == pytest.approx(token_logprobs(WEIGHTS, prompt, ids), abs=1e-4)
        for entry in content:  # the sampled token first, then the most likely others
            top = entry["top_logprobs"]
            assert len(top) == 3 and top[0] == {k: entry[k] for k in ("token", "logprob")} | {
                "bytes": list(entry["token"].encode())
            }
            assert [t["logprob"] for t in top[1:]] == sorted((t["logprob"] for t in top[1:]), reverse=True)
    assert doc["usage"] == {
        "prompt_tokens": len(prompt),
        "total_tokens": len(prompt) + total,
        "completion_tokens": total,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": None,
    }


def test_chat_rendering_matches_tokenize_and_its_options(engine: httpx.Client) -> None:
    parts = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]  # fmt: skip
    joined = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"}]
    for messages in (CHAT, parts):
        expected = _chat_prompt(joined if messages is parts else CHAT)
        tokenized = _post(engine, "/tokenize", messages=messages)
        assert tokenized == {"count": len(expected), "max_model_len": 256, "tokens": expected, "token_strs": None}
        chat = _post(engine, "/v1/chat/completions", messages=messages, max_tokens=1, return_token_ids=True)
        assert chat["prompt_token_ids"] == expected
    prefill = [*CHAT, {"role": "assistant", "content": "ok so"}]
    continued = _post(engine, "/tokenize", messages=prefill, add_generation_prompt=False, continue_final_message=True)
    assert TOK.decode(continued["tokens"]).endswith("<assistant>ok so")
    reply = _post(
        engine, "/v1/chat/completions", messages=prefill, add_generation_prompt=False,
        continue_final_message=True, max_tokens=2, echo=True,
    )  # fmt: skip
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["choices"][0]["message"]["content"].startswith("ok so")
    double = _post(engine, "/tokenize", messages=CHAT, add_special_tokens=True, return_token_strs=True)
    assert double["tokens"][:2] == [TOK.bos_token_id, TOK.bos_token_id]
    assert double["token_strs"] == TOK.convert_ids_to_tokens(double["tokens"])
    text = _post(engine, "/tokenize", prompt="abc")
    assert text["tokens"] == [TOK.bos_token_id, *TOK.encode("abc")]
    assert _post(engine, "/tokenize", prompt="abc", add_special_tokens=False)["tokens"] == TOK.encode("abc")
    assert _post(engine, "/detokenize", tokens=text["tokens"]) == {"prompt": "<bos>abc"}


def test_completions_non_stream_fields(engine: httpx.Client) -> None:
    doc = _post(engine, "/v1/completions", prompt="abc", max_tokens=3, logprobs=2, seed=1)
    assert list(doc) == [
        "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint", "usage",
        "kv_transfer_params", "ec_transfer_params", "metrics",
    ]  # fmt: skip
    choice = doc["choices"][0]
    assert list(choice) == [
        "index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_logprobs",
        "prompt_token_ids", "routed_experts",
    ]  # fmt: skip
    lp = choice["logprobs"]  # offsets add up the returned token strings, as vLLM's do
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    for token, chosen, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert next(iter(top.items())) == (token, chosen)  # the sampled token first, as vLLM's engine ranks it
        assert len(top) in (2, 3)


def _stream_body(**extra: Any) -> dict[str, Any]:
    return {"max_tokens": 12, "seed": 7, "n": 2, "return_token_ids": True, "ignore_eos": True} | extra


def test_completions_stream_chunks_add_up_to_the_non_stream_answer(engine: httpx.Client) -> None:
    body = _stream_body(prompt=TOK.encode("count: "), logprobs=1, return_tokens_as_token_ids=True)
    whole = _post(engine, "/v1/completions", **body)
    response = engine.post(
        "/v1/completions", json={"model": MODEL, **body, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert response.headers["x-cwtrain-snapshot-identity"] == "initial"
    events = _events(response)
    usage = events.pop()
    assert usage["choices"] == [] and usage["system_fingerprint"] == "initial"
    assert usage["usage"] == {k: v for k, v in whole["usage"].items() if v is not None} and "metrics" not in usage
    assert all(e["id"] == usage["id"] and e["object"] == "text_completion" and "usage" not in e for e in events)
    for choice in whole["choices"]:
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == choice["index"]]
        assert len(mine) == len(choice["token_ids"])  # one chunk per token
        assert "".join(c["text"] for c in mine) == choice["text"]
        assert [t for c in mine for t in c["token_ids"]] == choice["token_ids"]
        assert [c["prompt_token_ids"] for c in mine] == [choice["prompt_token_ids"]] + [None] * (len(mine) - 1)
        assert [c["finish_reason"] for c in mine] == [None] * (len(mine) - 1) + [choice["finish_reason"]]
        streamed = [c["logprobs"] for c in mine]
        assert [t for s in streamed for t in s["tokens"]] == choice["logprobs"]["tokens"]
        assert [t for s in streamed for t in s["token_logprobs"]] == choice["logprobs"]["token_logprobs"]
        assert [s["text_offset"][0] for s in streamed] == [
            len("".join(c["text"] for c in mine[:i])) for i in range(len(mine))
        ]
    assert not any("system_fingerprint" in e for e in events)  # it rides on the usage chunk


def test_chat_stream_is_read_chunk_by_chunk_as_vllm_sends_it(engine: httpx.Client) -> None:
    body = _stream_body(
        messages=CHAT,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    whole = _post(
        engine, "/v1/chat/completions", **{k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    )
    events = _events(engine.post("/v1/chat/completions", json={"model": MODEL, **body}))
    prompt = _chat_prompt(CHAT)
    firsts = events[:2]
    for j, first in enumerate(firsts):
        assert first["choices"] == [
            {"index": j, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ]
        assert first["prompt_token_ids"] == prompt and first["prompt_text"] is None
        assert first["usage"] == {"prompt_tokens": len(prompt), "total_tokens": len(prompt), "completion_tokens": 0}
    usage = events[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
    for choice in whole["choices"]:
        mine = [e for e in events[2:-1] if e["choices"][0]["index"] == choice["index"]]
        assert "".join(e["choices"][0]["delta"]["content"] for e in mine) == choice["message"]["content"]
        assert [t for e in mine for t in e["choices"][0]["token_ids"]] == choice["token_ids"]
        assert [e["usage"]["completion_tokens"] for e in mine] == list(range(1, len(mine) + 1))
        contents = [c for e in mine for c in e["choices"][0]["logprobs"]["content"]]
        assert contents == choice["logprobs"]["content"]
        last = mine[-1]["choices"][0]
        assert (last["finish_reason"], last["stop_reason"]) == (choice["finish_reason"], choice["stop_reason"])
        assert all("stop_reason" not in e["choices"][0] for e in mine[:-1])


def test_stream_holds_back_a_possible_stop_string_until_the_end(engine: httpx.Client) -> None:
    body = {"prompt": "stop here: ", "max_tokens": 30, "seed": 2, "ignore_eos": True}
    free = _post(engine, "/v1/completions", **body)["choices"][0]["text"]
    stop = free[5:8]  # three characters the sample does produce
    whole = _post(engine, "/v1/completions", **body, stop=[stop])["choices"][0]
    assert whole["finish_reason"] == "stop" and whole["stop_reason"] == stop
    events = _events(engine.post("/v1/completions", json={"model": MODEL, **body, "stop": [stop], "stream": True}))
    texts = [e["choices"][0]["text"] for e in events]
    assert "".join(texts) == whole["text"] == free[: free.index(stop)]
    # two characters are held back while the text could be the start of the stop string
    assert texts[:2] == ["", ""] and texts[2] == free[0]


def test_stop_token_text_is_kept_only_with_include_stop_str_in_output(engine: httpx.Client) -> None:
    base = {"prompt": "hi", "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    greedy = _post(engine, "/v1/completions", **base)["choices"][0]
    stop_id = next(t for t in greedy["token_ids"][1:] if t not in TOK.special_ids)
    at = greedy["token_ids"].index(stop_id)
    for keep in (False, True):
        choice = _post(engine, "/v1/completions", **base, stop_token_ids=[stop_id], include_stop_str_in_output=keep)
        choice = choice["choices"][0]
        assert choice["token_ids"] == greedy["token_ids"][: at + 1] and choice["stop_reason"] == stop_id
        assert choice["text"] == TOK.decode(greedy["token_ids"][: at + 1 if keep else at])
        stream = {"stream": True, "stop_token_ids": [stop_id], "include_stop_str_in_output": keep}
        events = _events(engine.post("/v1/completions", json={"model": MODEL, **base, **stream}))
        assert "".join(e["choices"][0]["text"] for e in events) == choice["text"]


@pytest.mark.parametrize(
    ("path", "body", "message", "param"),
    [
        (
            "/v1/completions", {"prompt": [5] * 250, "max_tokens": 10},
            "This model's maximum context length is 256 tokens. However, you requested 10 output tokens and your "
            "prompt contains 250 input tokens, for a total of 260 tokens. Please reduce the length of the input "
            "prompt or the number of requested output tokens. (parameter=input_tokens, value=250)",
            "input_tokens",
        ),
        (
            "/v1/completions", {"prompt": "x" * 250, "max_tokens": 10},
            "This model's maximum context length is 256 tokens. However, you requested 10 output tokens and your "
            "prompt contains at least 247 input tokens, for a total of at least 257 tokens. Please reduce the length "
            "of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=247)",
            "input_tokens",
        ),
        (
            "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 260}]},
            "This model's maximum context length is 256 tokens. However, you requested 0 output tokens and your "
            "prompt contains at least 257 input tokens, for a total of at least 257 tokens. Please reduce the length "
            "of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=257)",
            "input_tokens",
        ),
        (
            "/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 300},
            "max_completion_tokens=300 cannot be greater than max_model_len=256. Please request fewer output "
            "tokens. (parameter=max_completion_tokens, value=300)",
            "max_completion_tokens",
        ),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens"),
        (
            "/v1/completions", {"prompt": "xy", "prompt_logprobs": "2"},
            "`prompt_logprobs` must be an integer. (parameter=prompt_logprobs, value=2)", "prompt_logprobs",
        ),
        (
            "/v1/completions", {"prompt": "xy", "prompt_logprobs": -2},
            "`prompt_logprobs` must be a positive value or -1. (parameter=prompt_logprobs, value=-2)",
            "prompt_logprobs",
        ),
        (
            "/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2},
            "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)", "top_logprobs",
        ),
        (
            "/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}},
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)", "stream_options",
        ),
        (
            "/v1/chat/completions", {"messages": CHAT, "add_generation_prompt": True, "continue_final_message": True},
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", None,
        ),
    ],
)  # fmt: skip
def test_errors_use_vllm_wording(
    engine: httpx.Client, path: str, body: dict[str, Any], message: str, param: Any
) -> None:
    for stream in (False, "stream_options" not in body):  # refused before a stream starts: a plain JSON error
        sent = body | ({"stream": True} if stream else {})
        response = engine.post(path, json={"model": MODEL, **sent})
        assert response.status_code == 400 and response.headers["content-type"] == "application/json"
        assert response.json() == {
            "error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}
        }
        # NeMo Gym takes a 400 mentioning "context length" or "max_tokens" as an overflow
        if param in ("input_tokens", "max_tokens"):
            assert "context length" in response.text or "max_tokens" in response.text


def test_models_card_unknown_model_and_chunked_bodies(engine: httpx.Client) -> None:
    card = engine.get("/v1/models").json()["data"][0]
    assert {k: card[k] for k in ("id", "object", "owned_by", "root", "parent", "max_model_len")} == {
        "id": MODEL, "object": "model", "owned_by": "vllm", "root": "s3://models/tiny", "parent": None, "max_model_len": 256,
    }  # fmt: skip
    assert card["permission"][0]["object"] == "model_permission"
    for path in ("/v1/chat/completions", "/tokenize", "/detokenize"):
        missing = engine.post(path, json={"model": "other", "messages": CHAT, "tokens": [1]})
        assert missing.status_code == 404
        assert missing.json()["error"] == {
            "message": "The model `other` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    body = json.dumps({"model": MODEL, "messages": CHAT, "max_tokens": 2}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", httpx.URL(str(engine.base_url)).port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=iter([body[:10], body[10:]]),
            headers={"Content-Type": "application/json", **AUTH},
            encode_chunked=True,
        )
        response = conn.getresponse()
        assert response.status == 200, response.read()
        assert json.loads(response.read())["object"] == "chat.completion"
    finally:
        conn.close()


def test_openai_client_reads_both_endpoints_streamed_and_not(engine: httpx.Client) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=str(engine.base_url).rstrip("/") + "/v1", api_key=TOKEN, max_retries=0)
    try:
        chunks = list(
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, stream=True, logprobs=True, seed=1)
        )
        whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, logprobs=True, seed=1)
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
        )
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=MODEL, prompt=[5] * 250, max_tokens=10, stream=True)
        assert refused.value.param == "input_tokens" and "maximum context length is 256" in refused.value.message
    finally:
        client.close()


def _raw(engine: httpx.Client, request: bytes) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", httpx.URL(str(engine.base_url)).port or 80), timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
        return b"".join(chunks)


def test_http10_streams_unframed_and_bad_chunk_framing_is_a_400(engine: httpx.Client) -> None:
    body = json.dumps({"model": MODEL, "prompt": "a", "max_tokens": 2, "stream": True}).encode()
    head = (
        f"POST /v1/completions HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    answer = _raw(engine, head.encode() + body)
    headers, _, events = answer.partition(b"\r\n\r\n")
    assert (
        b"Transfer-Encoding" not in headers and events.startswith(b"data: {") and events.endswith(b"data: [DONE]\n\n")
    )
    bad = (
        f"POST /tokenize HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n"
        "Connection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
    ).encode()
    refused = _raw(engine, bad)
    assert refused.startswith(b"HTTP/1.1 400 ") and b"malformed chunk size line" in refused


# ------------------------------------------------------------ prompt log-probs (echo, prompt_logprobs)


def _prompt_scores(prompt: list[int]) -> list[float]:
    """What the model gives each prompt token after the ones before it (the first has none)."""
    return token_logprobs(WEIGHTS, prompt[:1], prompt[1:])


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_returns_the_prompts_logprobs_first_as_vllm_does(engine: httpx.Client, max_tokens: int) -> None:
    prompt = TOK.encode("the cat sat", add_special_tokens=True)
    doc = _post(
        engine, "/v1/completions", prompt=prompt, echo=True, logprobs=2, max_tokens=max_tokens, temperature=0,
        return_tokens_as_token_ids=True,
    )  # fmt: skip
    (choice,) = doc["choices"]
    block = choice["logprobs"]
    expected = _prompt_scores(prompt)
    assert block["tokens"][: len(prompt)] == [f"token_id:{t}" for t in prompt]
    assert block["token_logprobs"][0] is None and block["top_logprobs"][0] is None  # the first token has none
    assert block["token_logprobs"][1 : len(prompt)] == pytest.approx(expected, abs=1e-4)
    for i, token in enumerate(prompt[1:], start=1):
        top = block["top_logprobs"][i]
        names = list(top)
        assert names[0] == f"token_id:{token}" and top[names[0]] == block["token_logprobs"][i]
        assert len(top) in (2, 3)  # the prompt token, then the 2 most likely (once when it is one of them)
        assert list(top.values())[-2:] == sorted(list(top.values())[-2:], reverse=True)
    # prompt_logprobs rides along, keyed by token id, the first entry null
    plp = choice["prompt_logprobs"]
    assert len(plp) == len(prompt) and plp[0] is None
    for i, token in enumerate(prompt[1:], start=1):
        entry = plp[i][str(token)]
        assert entry["logprob"] == pytest.approx(expected[i - 1], abs=1e-4)
        assert entry["decoded_token"] == TOK.token_text(token) and entry["rank"] >= 1
        ranks = [v["rank"] for k, v in plp[i].items() if k != str(token)]
        assert ranks == list(range(1, len(ranks) + 1)) and len(plp[i]) >= 2
    # the text echoes the prompt (its ids decoded, <bos> included); usage counts the sampled token
    assert choice["text"].startswith(TOK.decode(prompt, skip_special_tokens=False))
    assert doc["usage"]["prompt_tokens"] == len(prompt) and doc["usage"]["completion_tokens"] == 1
    if max_tokens == 0:  # vLLM samples one token it does not return
        assert len(block["tokens"]) == len(prompt) and choice["text"] == TOK.decode(prompt, skip_special_tokens=False)
        assert choice["finish_reason"] in ("length", "stop")
    else:
        assert len(block["tokens"]) == len(prompt) + 1
        generated = int(block["tokens"][-1].removeprefix("token_id:"))
        assert block["token_logprobs"][-1:] == pytest.approx(token_logprobs(WEIGHTS, prompt, [generated]), abs=1e-4)
    offsets = block["text_offset"]
    assert offsets[0] == 0 and all(b - a == len(t) for a, b, t in zip(offsets, offsets[1:], block["tokens"]))


def test_prompt_logprobs_alone_scores_the_prompt_beside_a_normal_completion(engine: httpx.Client) -> None:
    prompt = TOK.encode("hello world")
    doc = _post(engine, "/v1/completions", prompt=prompt, prompt_logprobs=0, max_tokens=3, n=2, seed=1)
    expected = _prompt_scores(prompt)
    for choice in doc["choices"]:
        assert choice["logprobs"] is None and not choice["text"].startswith("hello")  # no echo
        plp = choice["prompt_logprobs"]
        assert plp[0] is None and [len(p) for p in plp[1:]] == [1] * (len(prompt) - 1)  # k = 0: the token only
        assert [p[str(t)]["logprob"] for p, t in zip(plp[1:], prompt[1:])] == pytest.approx(expected, abs=1e-4)
    everything = _post(engine, "/v1/completions", prompt=prompt, prompt_logprobs=-1, max_tokens=1)
    assert all(len(p) == 64 for p in everything["choices"][0]["prompt_logprobs"][1:])  # the whole vocabulary
    text = _post(engine, "/v1/completions", prompt="hello", echo=True, max_tokens=0)
    assert text["choices"][0]["text"] == "hello" and text["choices"][0]["logprobs"] is None  # echo without logprobs
    assert text["choices"][0]["prompt_logprobs"] is None


def test_echo_streams_the_prompt_on_each_choices_first_chunk(engine: httpx.Client) -> None:
    prompt = TOK.encode("abc")
    body = {"model": MODEL, "prompt": prompt, "echo": True, "logprobs": 0, "max_tokens": 4, "seed": 2, "n": 2}
    plain = _post(engine, "/v1/completions", **{k: v for k, v in body.items() if k != "model"})
    events = _events(engine.post("/v1/completions", json=body | {"stream": True}))
    for index in range(2):
        chunks = [e["choices"][0] for e in events if e["choices"] and e["choices"][0]["index"] == index]
        assert chunks[0]["text"].startswith("abc") and chunks[0]["logprobs"]["token_logprobs"][0] is None
        assert all(not c["text"].startswith("abc") for c in chunks[1:])
        whole = plain["choices"][index]
        assert "".join(c["text"] for c in chunks) == whole["text"]
        streamed = [lp for c in chunks for lp in c["logprobs"]["token_logprobs"]]
        assert streamed == whole["logprobs"]["token_logprobs"]
    refused = engine.post("/v1/completions", json=body | {"stream": True, "prompt_logprobs": 1})
    assert refused.status_code == 400 and refused.json()["error"]["message"] == (
        "`prompt_logprobs` are not available when `stream=True`. (parameter=prompt_logprobs)"
    )
