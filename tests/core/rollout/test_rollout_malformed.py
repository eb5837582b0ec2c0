"""``malformed-answer``: whatever a completions endpoint answers, the sampler raises only ``RolloutError``.

A table of shapes that once escaped as another exception or passed as valid (a choice ``index``
that is a string or an object, routes whose bytes do not fill their dtype, token ids out of
range, a document nested past the interpreter's limit; a log-prob too large for a float is no
log-prob), then hypothesis:
one value anywhere in a valid answer replaced by a value of another kind, read directly
(``read_completions``) and through the sampler over its transport.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rollout_fake import FakeEndpoint

from cwtrain.integrations.rollout import CompletionSampler, RolloutConfig, RolloutError, SamplingParams
from cwtrain.integrations.rollout.responses import read_completions

pytestmark = [pytest.mark.faults, pytest.mark.fault_row("malformed-answer")]

PROMPT = [5, 6, 7]
PARAMS = SamplingParams(max_tokens=5)
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _answer(n: int = 3, *, routes: bool = False, shape: str = "token_ids") -> dict[str, Any]:
    fake = FakeEndpoint(shape=shape, routes=(2, 2) if routes else (0, 0))
    return copy.deepcopy(fake.answer({"model": "m", "prompt": list(PROMPT), "n": n, "logprobs": 1}))


def _read(payload: Any, n: int = 3, *, routes: bool = False) -> list[Any]:
    return read_completions(
        payload,
        n=n,
        sent_prompt_ids=PROMPT,
        known_prompt_ids=PROMPT,
        identity="id",
        latency=0.1,
        want_logprobs=True,
        want_routes=routes,
    )


def _routes(data: bytes, shape: list[Any], dtype: str = "uint16") -> dict[str, Any]:
    return {"data": base64.b64encode(data).decode(), "shape": shape, "start": 0, "dtype": dtype}


def _set(path: tuple[Any, ...], value: Any, *, n: int = 3, routes: bool = False) -> dict[str, Any]:
    payload = _answer(n, routes=routes)
    target: Any = payload
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return payload


#: name -> (payload, n, want routes): each must be a RolloutError, never another exception.
MALFORMED: dict[str, tuple[dict[str, Any], int, bool]] = {
    "index a string": (_set(("choices", 0, "index"), "1"), 3, False),
    "index an object": (_set(("choices", 1, "index"), {"a": 1}), 3, False),
    "index a list": (_set(("choices", 2, "index"), [0]), 3, False),
    "index a float": (_set(("choices", 0, "index"), 1.5), 3, False),
    "index a boolean": (_set(("choices", 0, "index"), True), 3, False),
    "index out of range": (_set(("choices", 0, "index"), 7), 3, False),
    "index negative": (_set(("choices", 0, "index"), -1), 3, False),
    "index repeated": (_set(("choices", 0, "index"), 1), 3, False),
    "index missing on one choice": (_set(("choices", 0, "index"), None), 3, False),
    "token id negative": (_set(("choices", 0, "token_ids", 0), -3), 3, False),
    "token id past int32": (_set(("choices", 0, "token_ids", 0), 2**40), 3, False),
    "prompt id past int32": (_set(("choices", 0, "prompt_token_ids", 0), 2**70), 3, False),
    "routes bytes that do not fill uint16": (
        _set(("choices", 0, "nvext", "routed_experts"), _routes(b"\x01\x02\x03", [1, 1, 1]), n=1, routes=True),
        1,
        True,
    ),
    "routes shape with a huge value": (
        _set(("choices", 0, "nvext", "routed_experts"), _routes(b"\x00" * 4, [2**70, 1, 1]), n=1, routes=True),
        1,
        True,
    ),
    "routes start an object": (
        _set(("choices", 0, "nvext", "routed_experts", "start"), {"a": 1}, n=1, routes=True),
        1,
        True,
    ),
    "routes data an object": (
        _set(("choices", 0, "nvext", "routed_experts", "data"), {"a": 1}, n=1, routes=True),
        1,
        True,
    ),
    "choices an object": ({"choices": {"0": {}}}, 1, False),
    "a choice a list": ({"choices": [[1, 2]]}, 1, False),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_each_malformed_shape_is_a_rollout_error(name: str) -> None:
    payload, n, routes = MALFORMED[name]
    with pytest.raises(RolloutError):
        _read(copy.deepcopy(payload), n, routes=routes)


def test_valid_answers_still_read_and_choices_come_in_index_order() -> None:
    out = _read(_answer(3))
    assert [c.index for c in out] == [0, 1, 2]
    fake = FakeEndpoint()
    assert [list(c.response_ids) for c in out] == [fake.completion(PROMPT, i, 0) for i in range(3)]
    unindexed = _answer(3)
    for choice in unindexed["choices"]:
        del choice["index"]
    assert len(_read(unindexed)) == 3  # no index at all: the order as sent
    (one,) = _read(_set(("choices", 0, "index"), "zero", n=1), 1)  # n = 1: the index is not read
    assert one.index == 0
    huge = _read(_set(("choices", 0, "logprobs", "token_logprobs", 0), 10**400))  # was an OverflowError
    assert huge[2].logprobs is None and huge[0].logprobs is not None  # choices[0] is index 2: no log-probs
    routed = _read(_answer(1, routes=True), 1, routes=True)
    assert routed[0].routed_experts is not None and routed[0].routed_experts.dtype == np.int32


def _sampler(answer: Callable[[httpx.Request], httpx.Response], **fields: Any) -> CompletionSampler:
    async def no_sleep(seconds: float) -> None:
        return None

    config = RolloutConfig("http://fake.test/v1/", "tiny", max_attempts=2, **fields)
    return CompletionSampler(config, transport=httpx.MockTransport(answer), sleep=no_sleep, seed=1)


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_each_malformed_shape_through_the_sampler_is_a_rollout_error(name: str) -> None:
    payload, n, routes = MALFORMED[name]
    content = json.dumps(payload).encode()
    with (
        _sampler(lambda request: httpx.Response(200, content=content), routed_experts=routes) as sampler,
        pytest.raises(RolloutError),
    ):
        sampler.sample_groups_sync([PROMPT], n, PARAMS)


def test_a_deeply_nested_answer_is_retried_then_a_rollout_error() -> None:
    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(200, content=b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")

    with _sampler(answer) as sampler, pytest.raises(RolloutError, match=r"not a JSON object \(it nests"):
        sampler.sample_groups_sync([PROMPT], 3, PARAMS)
    assert len(calls) == 2  # retried like any 200 that is not a JSON object


# ------------------------------------------------------------------ hypothesis


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``value`` (the root excluded)."""
    found: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found.append((*path, key))
        found += _paths(item, (*path, key))
    return found


NASTY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([10**400, -(10**400), 2**31, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["token_id:-1", "token_id:x", "token_id:" + "9" * 30, "", "stop", "length", "uint16"]),
    st.lists(st.one_of(st.integers(-3, 300), st.text(max_size=3), st.none()), max_size=4),
    st.dictionaries(st.sampled_from(["a", "index", "data", "0"]), st.integers() | st.text(max_size=3), max_size=2),
)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[dict[str, Any], int, bool]:
    n = draw(st.sampled_from([1, 3]))
    routes = n == 1 and draw(st.booleans())
    shape = draw(st.sampled_from(["token_ids", "tokens", "nvext_choice", "nvext_engine"]))
    payload = _answer(n, routes=routes, shape=shape)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(payload)
        path = draw(st.sampled_from(paths))
        target: Any = payload
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = draw(NASTY)
    return payload, n, routes


@FUZZ
@given(case=mutated())
def test_any_mutated_answer_reads_or_is_a_rollout_error(case: tuple[dict[str, Any], int, bool]) -> None:
    payload, n, routes = case
    try:
        out = _read(payload, n, routes=routes)
    except RolloutError:
        return
    assert len(out) == n
    for completion in out:
        assert all(type(i) is int and 0 <= i < 2**31 for i in completion.response_ids)
        assert all(type(i) is int and 0 <= i < 2**31 for i in completion.prompt_ids)
        assert completion.logprobs is None or len(completion.logprobs) == len(completion.response_ids)
        assert isinstance(completion.finish_reason, str)


@settings(FUZZ, max_examples=60)
@given(case=mutated())
def test_any_mutated_answer_through_the_sampler_is_a_batch_or_a_rollout_error(
    case: tuple[dict[str, Any], int, bool],
) -> None:
    payload, n, routes = case
    content = json.dumps(payload).encode()  # NaN and Infinity as Python's json writes them
    with _sampler(lambda request: httpx.Response(200, content=content), routed_experts=routes) as sampler:
        try:
            batch = sampler.sample_groups_sync([PROMPT], n, PARAMS)
        except RolloutError:
            return
    assert len(batch.groups[0]) == n
