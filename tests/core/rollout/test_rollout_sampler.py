"""CompletionSampler against httpx.MockTransport stand-ins: requests, retries, fallbacks, concurrency."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from rollout_fake import FakeEndpoint

from cwtrain.integrations.rollout import (
    CompletionSampler,
    RolloutConfig,
    RolloutError,
    SamplingParams,
    sample_groups,
    sample_prompt,
)

PARAMS = SamplingParams(max_tokens=5)


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def make(handler: Callable[[httpx.Request], Any], sleeps: Sleeps | None = None, **fields: Any) -> CompletionSampler:
    config = RolloutConfig("http://fake.test/v1/", "tiny", **fields)
    return CompletionSampler(config, transport=httpx.MockTransport(handler), sleep=sleeps or Sleeps(), seed=1)


def test_one_request_per_group_with_the_documented_body() -> None:
    fake = FakeEndpoint()
    with make(fake, api_key="sk-secret") as sampler:
        batch = sampler.sample_groups_sync([[1, 2, 3], [4, 5]], 4, PARAMS, cache_salt="run/v1")
    assert len(fake.bodies) == 2 and len(batch) == 2
    body = fake.bodies[0]
    salt = hashlib.sha256(b"run/v1").hexdigest()
    assert body == {
        "model": "tiny",
        "prompt": body["prompt"],
        "n": 4,
        "max_tokens": 5,
        "temperature": 1.0,
        "top_p": 1.0,
        "stream": False,
        "logprobs": 1,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "nvext": {"cache_salt": salt},
    }
    assert sorted(b["prompt"] for b in fake.bodies) == [[1, 2, 3], [4, 5]]
    for prompt, group in zip([[1, 2, 3], [4, 5]], batch, strict=True):
        assert [list(c.response_ids) for c in group] == [fake.completion(prompt, i, 0) for i in range(4)]
        assert all(c.prompt_ids == tuple(prompt) and c.identity == "run-v000003" for c in group)
    assert batch.metrics["coreweave/samples"] == 8
    assert batch.metrics["coreweave/requests"] == 2
    assert batch.metrics["coreweave/mean_response_length"] == 5
    assert batch.metrics["coreweave/logprobs_kept"] == 1.0
    assert batch.identities == ("run-v000003",)


def test_optional_fields_stops_top_k_and_no_seed_on_unsplit_n1() -> None:
    fake = FakeEndpoint()
    params = SamplingParams(
        max_tokens=3, temperature=0.7, top_k=5, stop=("\n",), stop_token_ids=(2,), include_stop_str_in_output=True
    )
    with make(fake, logprobs=False, token_ids=True) as sampler:
        sampler.sample_groups_sync([[1]], 1, params)
    (body,) = fake.bodies
    assert body["top_k"] == 5 and body["stop"] == ["\n"] and body["stop_token_ids"] == [2]
    assert body["include_stop_str_in_output"] is True and "seed" not in body and "logprobs" not in body
    assert "nvext" not in body


def test_more_than_four_stops_is_refused_before_sending() -> None:
    with pytest.raises(RolloutError, match="at most 4"):
        SamplingParams(max_tokens=1, stop=("a", "b", "c", "d", "e"))
    with pytest.raises(RolloutError, match="at most 4"):
        SamplingParams(max_tokens=1, stop_token_ids=(1, 2, 3, 4, 5))


def test_header_identity_wins_over_system_fingerprint() -> None:
    fake = FakeEndpoint(identity="from-body", header_identity="run-v000011")
    with make(fake) as sampler:
        (c,) = sampler.sample_groups_sync([[1]], 1, PARAMS)[0]
    assert c.identity == "run-v000011"
    fake = FakeEndpoint(identity="from-body")
    with make(fake) as sampler:
        (c,) = sampler.sample_groups_sync([[1]], 1, PARAMS)[0]
    assert c.identity == "from-body"


def test_malformed_json_is_retried() -> None:
    fake = FakeEndpoint()
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) < 3:
            return httpx.Response(200, content=b'{"choices": [', headers={"content-type": "application/json"})
        return fake(request)

    sleeps = Sleeps()
    with make(handler, sleeps) as sampler:
        batch = sampler.sample_groups_sync([[1, 2]], 2, PARAMS)
    assert len(calls) == 3 and len(sleeps.calls) == 2
    assert batch.metrics["coreweave/retries"] == 2
    assert [list(c.response_ids) for c in batch[0]] == [fake.completion([1, 2], i, 0) for i in range(2)]


def test_malformed_json_every_time_fails_after_max_attempts() -> None:
    with (
        make(lambda r: httpx.Response(200, text="<html>oops"), max_attempts=3) as sampler,
        pytest.raises(RolloutError, match="failed after 3 attempts: HTTP 200 with a body that is not a JSON"),
    ):
        sampler.sample_groups_sync([[1]], 1, PARAMS)


def test_429_retry_after_is_honoured_and_capped() -> None:
    fake = FakeEndpoint()
    answers = iter(["7", "120"])

    def handler(request: httpx.Request) -> httpx.Response:
        value = next(answers, None)
        if value is not None:
            return httpx.Response(429, text="slow down", headers={"Retry-After": value})
        return fake(request)

    sleeps = Sleeps()
    with make(handler, sleeps) as sampler:
        sampler.sample_groups_sync([[1]], 1, PARAMS)
    assert sleeps.calls[0] == pytest.approx(7.0)  # larger than the 0.5-1.5 s backoff of try 1
    assert sleeps.calls[1] == 30.0  # capped


def test_a_stream_of_503s_uses_every_attempt_with_jittered_backoff() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(503, text="engine warming up " + "x" * 500)

    sleeps = Sleeps()
    with make(handler, sleeps) as sampler, pytest.raises(RolloutError) as info:
        sampler.sample_groups_sync([[1]], 1, PARAMS)
    assert len(calls) == 6 and len(sleeps.calls) == 5
    for k, slept in enumerate(sleeps.calls, start=1):
        base = min(30, 2 ** (k - 1))
        assert 0.5 * base <= slept < 1.5 * base
    message = str(info.value)
    assert message.startswith("completions request failed after 6 attempts: HTTP 503: engine warming up")
    assert len(message) < 300


def test_other_statuses_fail_at_once() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(404, text="model tiny not found")

    with (
        make(handler) as sampler,
        pytest.raises(RolloutError, match=r"^completions request failed: HTTP 404: model tiny not found$"),
    ):
        sampler.sample_groups_sync([[1]], 1, PARAMS)
    assert len(calls) == 1


def test_transport_errors_and_the_deadline_are_retried() -> None:
    fake = FakeEndpoint()
    calls = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            raise httpx.ConnectError("connection refused", request=request)
        if len(calls) == 2:
            await asyncio.sleep(5)  # past the 0.2 s deadline
        return fake(request)

    with make(handler, timeout=0.2) as sampler:
        batch = sampler.sample_groups_sync([[1]], 1, PARAMS)
    assert len(calls) == 3 and batch.metrics["coreweave/retries"] == 2

    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return fake(request)

    with (
        make(hang, timeout=0.1, max_attempts=2) as sampler,
        pytest.raises(RolloutError, match=r"after 2 attempts: no answer within 0.1s"),
    ):
        sampler.sample_groups_sync([[1]], 1, PARAMS)


def test_token_id_prompt_refused_falls_back_to_text_once(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeEndpoint(shape="tokens")  # returns no prompt ids

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if isinstance(body["prompt"], list):
            fake.bodies.append(body)
            return httpx.Response(422, text="prompt must be a string")
        return fake(request)

    caplog.set_level(logging.WARNING, "cwtrain.integrations.rollout")
    with make(handler) as sampler:
        sampler.tokenizer = None
        batch = sampler.sample_groups_sync([_prompt((1, 2), "hi")], 2, PARAMS)
        assert sampler.text_prompts
        sampler.sample_groups_sync([_prompt((3,), "yo"), _prompt((4,), "ok")], 2, PARAMS)
    prompts = [b["prompt"] for b in fake.bodies]
    assert prompts[:2] == [[1, 2], "hi"]  # one probe with ids, then text
    assert sorted(prompts[2:]) == ["ok", "yo"]  # no more id probes
    assert all(b["add_special_tokens"] is False for b in fake.bodies[1:])
    assert batch[0][0].prompt_ids == (1, 2)  # the trainer's ids when none come back for text
    assert sum("token-id prompt" in r.getMessage() for r in caplog.records) == 1


def _prompt(ids: tuple[int, ...], text: str) -> Any:
    from cwtrain.integrations.rollout import Prompt

    return Prompt(ids=ids, text=text)


def test_token_id_prompt_refused_and_text_refused_raises_the_original() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if isinstance(body["prompt"], list):
            return httpx.Response(400, text="bad prompt ids")
        return httpx.Response(400, text="bad text too")

    with (
        make(handler) as sampler,
        pytest.raises(RolloutError, match="HTTP 400: bad prompt ids"),
    ):
        sampler.sample_groups_sync([_prompt((1,), "a")], 1, PARAMS)
        assert not sampler.text_prompts


def test_token_id_prompt_fallback_decodes_with_the_tokenizer() -> None:
    fake = FakeEndpoint()

    class Tok:
        def decode(self, ids: list[int]) -> str:
            return "".join(chr(ord("a") + i) for i in ids)

    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(json.loads(request.content)["prompt"], list):
            return httpx.Response(400, text="token ids not supported")
        return fake(request)

    config = RolloutConfig("http://fake.test/v1", "tiny")
    with CompletionSampler(config, tokenizer=Tok(), transport=httpx.MockTransport(handler)) as sampler:
        sampler.sample_groups_sync([[0, 1, 2]], 1, PARAMS)
    assert fake.bodies[-1]["prompt"] == "abc"


def test_optional_token_id_field_refused_is_dropped_for_the_run() -> None:
    fake = FakeEndpoint(shape="tokens")

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if "return_token_ids" in body:
            fake.bodies.append(body)
            return httpx.Response(400, text='{"error": "unknown field: return_token_ids"}')
        return fake(request)

    with make(handler) as sampler:
        batch = sampler.sample_groups_sync([[1], [2]], 2, PARAMS)
        sampler.sample_groups_sync([[3]], 2, PARAMS)
        assert sampler.dropped_fields == {"return_token_ids"}
    refused = [b for b in fake.bodies if "return_token_ids" in b]
    assert 1 <= len(refused) <= 2  # both first requests may race; never again after
    assert all(b["return_tokens_as_token_ids"] is True for b in fake.bodies)
    assert batch[1][1].token_source == "logprobs.tokens"


def test_routed_experts_split_groups_into_seeded_n1_requests() -> None:
    fake = FakeEndpoint(routes=(2, 3))
    with make(fake, routed_experts=True) as sampler:
        batch = sampler.sample_groups_sync([[1, 2, 3]], 4, PARAMS)
    assert len(fake.bodies) == 4
    assert all(b["n"] == 1 and b["nvext"]["extra_fields"] == ["routed_experts"] for b in fake.bodies)
    seeds = [b["seed"] for b in fake.bodies]
    assert len(set(seeds)) == 4 and all(0 <= s < 2**62 for s in seeds)
    group = batch[0]
    assert [c.index for c in group] == [0, 1, 2, 3]
    for c in group:
        assert c.routed_experts is not None and c.routed_experts.shape == (3 + 5 - 1, 2, 3)
    assert {tuple(c.response_ids) for c in group} == {tuple(fake.completion([1, 2, 3], 0, s % 1000)) for s in seeds}


def test_split_without_seeds_sends_none() -> None:
    fake = FakeEndpoint()
    with make(fake, seeds=False) as sampler:
        sampler.sample_groups_sync([[1]], 3, PARAMS, split=True)
    assert len(fake.bodies) == 3 and all("seed" not in b for b in fake.bodies)


def _counting(fake: FakeEndpoint) -> tuple[Callable[[httpx.Request], Any], dict[str, int]]:
    state = {"now": 0, "peak": 0}
    lock = threading.Lock()

    async def handler(request: httpx.Request) -> httpx.Response:
        n = json.loads(request.content)["n"]
        with lock:
            state["now"] += n
            state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.02)
        with lock:
            state["now"] -= n
        return fake(request)

    return handler, state


def test_concurrency_is_counted_in_sequences() -> None:
    handler, state = _counting(FakeEndpoint())
    with make(handler, concurrency=2) as sampler:
        batch = sampler.sample_groups_sync([[i] for i in range(8)], 4, PARAMS)
        assert sampler.peak_sequences == 8
    assert len(batch) == 8 and state["peak"] == 8  # two groups of 4

    handler, state = _counting(FakeEndpoint())
    with make(handler, concurrency=2) as sampler:
        sampler.sample_groups_sync([[i] for i in range(4)], 4, PARAMS, split=True)
    assert state["peak"] == 8  # split groups: 8 requests of n = 1, still two groups' worth


def test_require_logprobs_resamples_then_fails() -> None:
    good, bad = FakeEndpoint(), FakeEndpoint(logprobs_null=True)
    calls = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return (bad if len(calls) == 1 else good)(request)

    with make(flaky, require_logprobs=True) as sampler:
        batch = sampler.sample_groups_sync([[1]], 2, PARAMS)
    assert batch.metrics["coreweave/resampled_groups"] == 1 and batch[0][0].logprobs is not None

    bad = FakeEndpoint(logprobs_null=True)
    with (
        make(bad, require_logprobs=True) as sampler,
        pytest.raises(RolloutError, match="without usable log-probs 3 times"),
    ):
        sampler.sample_groups_sync([[1]], 2, PARAMS)
    assert len(bad.bodies) == 3


def test_logprobs_are_kept_for_all_samples_or_none() -> None:
    good, bad = FakeEndpoint(), FakeEndpoint(logprobs_null=True)

    def handler(request: httpx.Request) -> httpx.Response:
        return (bad if json.loads(request.content)["prompt"] == [2] else good)(request)

    with make(handler) as sampler:
        batch = sampler.sample_groups_sync([[1], [2]], 2, PARAMS)
    assert all(c.logprobs is None for g in batch for c in g)
    assert batch.metrics["coreweave/logprobs_aligned_fraction"] == 0.5
    assert batch.metrics["coreweave/logprobs_kept"] == 0.0


def test_missing_ids_raise_with_the_fix() -> None:
    with (
        make(FakeEndpoint(shape="none")) as sampler,
        pytest.raises(RolloutError, match="enable token ids on the endpoint"),
    ):
        sampler.sample_groups_sync([[1]], 2, PARAMS)


def test_retokenize_opt_in_checks_the_round_trip(caplog: pytest.LogCaptureFixture) -> None:
    class Tok:
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            assert add_special_tokens is False
            return [ord(ch) - ord("a") for ch in text]

        def decode(self, ids: list[int]) -> str:
            return "".join(chr(ord("a") + i) for i in ids)

    fake = FakeEndpoint(shape="none")
    config = RolloutConfig("http://fake.test/v1", "tiny", token_ids=False)
    caplog.set_level(logging.WARNING, "cwtrain.integrations.rollout")
    with CompletionSampler(config, tokenizer=Tok(), transport=fake.transport()) as sampler:
        batch = sampler.sample_groups_sync([[1], [2]], 2, PARAMS)
    assert "return_token_ids" not in fake.bodies[0]
    assert all(c.token_source == "retokenized" for g in batch for c in g)
    assert batch[0][1].response_ids == tuple(i % 26 for i in fake.completion([1], 1, 0))
    assert sum("re-tokenizing" in r.getMessage() for r in caplog.records) == 1

    class Lossy(Tok):
        def decode(self, ids: list[int]) -> str:
            return super().decode(ids).upper()

    with (
        CompletionSampler(config, tokenizer=Lossy(), transport=fake.transport()) as sampler,
        pytest.raises(RolloutError, match="does not decode back"),
    ):
        sampler.sample_groups_sync([[1]], 1, PARAMS)


def test_sync_wrapper_works_inside_a_running_loop_and_async_reuses_the_pool() -> None:
    fake = FakeEndpoint()
    sampler = make(fake)
    try:

        async def inside() -> Any:
            asyncio.get_running_loop()  # we are in a loop: a plain asyncio.run would fail here
            return sample_groups([[1]], 2, PARAMS, sampler=sampler)

        batch = asyncio.run(inside())
        assert len(batch[0]) == 2
        client = sampler._client

        async def native() -> Any:
            return await sampler.sample_groups([[2], [3]], 2, PARAMS)

        for _ in range(2):  # two event loops, one connection pool
            assert len(asyncio.run(native())) == 2
            assert sampler._client is client
        assert len(sample_prompt([4], 3, PARAMS, sampler=sampler)) == 3
    finally:
        sampler.close()


def test_errors_name_no_secret_and_repr_hides_the_key() -> None:
    config = RolloutConfig("http://fake.test/v1", "tiny", api_key="sk-very-secret")
    assert "sk-very-secret" not in repr(config)
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(401, text="bad key")

    with (
        CompletionSampler(config, transport=httpx.MockTransport(handler)) as sampler,
        pytest.raises(RolloutError) as info,
    ):
        sampler.sample_groups_sync([[1]], 1, PARAMS)
    assert seen == ["Bearer sk-very-secret"] and "sk-very-secret" not in str(info.value)


def test_refusals_pickle_with_their_fields() -> None:
    import pickle

    refuse = make(lambda r: httpx.Response(403, text="forbidden"), max_attempts=1)
    with refuse as sampler, pytest.raises(RolloutError) as info:
        sampler.sample_groups_sync([[1]], 1, PARAMS)
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is type(info.value) and str(copy) == str(info.value)
    assert isinstance(copy, RolloutError) and copy.__dict__ == info.value.__dict__


def test_many_groups_refused_at_once_settle_on_text_once(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeEndpoint(shape="tokens")
    probes = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        await asyncio.sleep(0.005)
        if isinstance(body["prompt"], list):
            probes.append(1)
            return httpx.Response(400, text="prompt token ids are not accepted")
        return fake(request)

    caplog.set_level(logging.WARNING, "cwtrain.integrations.rollout")
    prompts = [_prompt((i,), f"p{i}") for i in range(12)]
    with make(handler, concurrency=4) as sampler:
        batch = sampler.sample_groups_sync(prompts, 2, PARAMS)
        later = sampler.sample_groups_sync(prompts[:3], 2, PARAMS)
    assert len(batch) == 12 and len(later) == 3
    assert 1 <= len(probes) <= 4  # only the first wave in flight probes with ids
    assert sum("token-id prompt" in r.getMessage() for r in caplog.records) == 1


def test_retry_after_http_date() -> None:
    import email.utils
    import time

    from cwtrain.integrations.rollout.sampler import _retry_after

    assert _retry_after("3") == 3.0
    assert _retry_after("soon") is None and _retry_after(None) is None
    when = email.utils.formatdate(time.time() + 20, usegmt=True)
    assert 15 < (_retry_after(when) or 0) <= 20


def test_async_sample_group() -> None:
    fake = FakeEndpoint()
    with make(fake) as sampler:
        group = asyncio.run(sampler.sample_group("hi", 3, PARAMS))
    assert [c.index for c in group] == [0, 1, 2]
    assert fake.bodies[0]["prompt"] == "hi" and fake.bodies[0]["add_special_tokens"] is False
    assert group[0].prompt_ids == (ord("h"), ord("i"))  # from the returned prompt_token_ids


@pytest.mark.faults
@pytest.mark.fault_row("broken-stream")
@pytest.mark.parametrize("reason", [None, "missing", "abort", "error", 7])
def test_a_choice_that_did_not_finish_is_retried_never_returned_as_finished(reason: Any) -> None:
    """A completion cut short upstream (no finish_reason, or the engine's abort/error) is not a sample."""
    good = FakeEndpoint()
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        answer = good.answer(json.loads(request.content))
        if len(calls) == 1:
            choice = answer["choices"][1]
            if reason == "missing":
                del choice["finish_reason"]
            else:
                choice["finish_reason"] = reason
        return httpx.Response(200, json=answer)

    sleeps = Sleeps()
    with make(handler, sleeps) as sampler:
        batch = sampler.sample_groups_sync([[1, 2, 3]], 3, PARAMS)
    assert len(calls) == 2 and len(sleeps.calls) == 1  # retried as a transient failure
    assert [c.finish_reason for c in batch.groups[0]] == ["stop"] * 3

    def never_finishes(request: httpx.Request) -> httpx.Response:
        answer = good.answer(json.loads(request.content))
        answer["choices"][0]["finish_reason"] = None
        return httpx.Response(200, json=answer)

    with make(never_finishes, max_attempts=3) as sampler, pytest.raises(RolloutError, match="finish_reason") as info:
        sampler.sample_groups_sync([[1, 2, 3]], 3, PARAMS)
    assert "after 3 attempts" in str(info.value)
