"""Reading completions responses: the three token-id shapes, agreement, log-probs, routes."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from rollout_fake import FakeEndpoint

from cwtrain.integrations.rollout import RolloutError, decode_routed_experts
from cwtrain.integrations.rollout.responses import ID_FIELDS, read_completions

PROMPT = [5, 6, 7]


def _read(payload: dict, n: int, **kw) -> list:
    args = dict(
        n=n,
        sent_prompt_ids=PROMPT,
        known_prompt_ids=PROMPT,
        identity="id",
        latency=0.1,
        want_logprobs=True,
        want_routes=False,
    )
    args.update(kw)
    return read_completions(payload, **args)


def _body(n: int = 3, **extra: object) -> dict:
    return {"model": "m", "prompt": PROMPT, "n": n, "logprobs": 1, **extra}


@pytest.mark.parametrize("shape", ["token_ids", "tokens", "nvext_choice", "nvext_engine"])
def test_each_shape_gives_the_exact_ids_in_index_order(shape: str) -> None:
    fake = FakeEndpoint(shape=shape)
    out = _read(fake.answer(_body()), 3)
    assert [c.index for c in out] == [0, 1, 2]
    for i, c in enumerate(out):
        assert list(c.response_ids) == fake.completion(PROMPT, i, 0)
        assert c.prompt_ids == tuple(PROMPT)
        assert c.logprobs == pytest.approx([-0.01 * (j + 1) for j in range(5)])
        assert c.tokens == PROMPT + fake.completion(PROMPT, i, 0)
    expected = {"token_ids": "token_ids", "tokens": "logprobs.tokens"}.get(shape, "nvext")
    assert {c.token_source for c in out} == {expected}


def test_top_level_nvext_counts_only_for_n_equal_1() -> None:
    fake = FakeEndpoint(shape="nvext_top")
    (one,) = _read(fake.answer(_body(n=1)), 1)
    assert list(one.response_ids) == fake.completion(PROMPT, 0, 0)
    payload = fake.answer(_body(n=1))
    payload["choices"].append(dict(payload["choices"][0], index=1))
    with pytest.raises(RolloutError, match="no exact token ids"):
        _read(payload, 2)


def test_no_ids_names_every_field_and_the_fix() -> None:
    payload = FakeEndpoint(shape="none").answer(_body())
    with pytest.raises(RolloutError) as info:
        _read(payload, 3)
    text = str(info.value)
    for name in ID_FIELDS:
        assert name in text
    assert "CWTRAIN_ROLLOUT_TOKEN_IDS" in text and "return_token_ids" in text


def test_two_sources_must_agree() -> None:
    payload = FakeEndpoint(shape="token_ids").answer(_body(n=1))
    choice = payload["choices"][0]
    choice["logprobs"]["tokens"] = [f"token_id:{t}" for t in choice["token_ids"]]
    assert _read(payload, 1)[0].token_source == "token_ids"  # agreeing: fine
    choice["logprobs"]["tokens"][-1] = "token_id:99999"
    with pytest.raises(RolloutError, match="disagree"):
        _read(payload, 1)


def test_partial_token_strings_are_not_a_source() -> None:
    payload = FakeEndpoint(shape="tokens").answer(_body(n=1))
    payload["choices"][0]["logprobs"]["tokens"][0] = "hello"
    with pytest.raises(RolloutError, match="no exact token ids"):
        _read(payload, 1)


def test_returned_prompt_ids_must_equal_the_sent_prompt() -> None:
    payload = FakeEndpoint(shape="token_ids").answer(_body(n=1))
    payload["choices"][0]["prompt_token_ids"] = [1, *PROMPT]
    with pytest.raises(RolloutError, match="differs from the token-id prompt"):
        _read(payload, 1)


def test_text_prompt_takes_the_returned_prompt_ids() -> None:
    payload = FakeEndpoint(shape="token_ids").answer(_body(n=1))
    payload["choices"][0]["prompt_token_ids"] = [9, 9]
    (c,) = _read(payload, 1, sent_prompt_ids=None)
    assert c.prompt_ids == (9, 9)
    del payload["choices"][0]["prompt_token_ids"]
    (c,) = _read(payload, 1, sent_prompt_ids=None)
    assert c.prompt_ids == tuple(PROMPT)  # the trainer's ids when none come back


def test_choice_count_must_equal_n() -> None:
    payload = FakeEndpoint().answer(_body(n=2))
    with pytest.raises(RolloutError, match="2 choices for n=3"):
        _read(payload, 3)


@pytest.mark.parametrize("bad", ["null", "short", "inf", "string"])
def test_unusable_logprobs_mean_none_for_that_choice(bad: str) -> None:
    payload = FakeEndpoint().answer(_body(n=2))
    values = payload["choices"][0]["logprobs"]["token_logprobs"]
    if bad == "null":
        values[1] = None
    elif bad == "short":
        values.pop()
    elif bad == "inf":
        values[0] = float("-inf")
    else:
        values[0] = "x"
    out = _read(payload, 2)
    by_index = {c.index: c for c in out}
    assert by_index[1].logprobs is None  # choices[0] of the payload is index 1 (reversed)
    assert by_index[0].logprobs is not None


def test_finish_reason_and_identity_and_cached_tokens() -> None:
    fake = FakeEndpoint(finish_reason="length")
    (c,) = _read(fake.answer(_body(n=1)), 1, identity="run-v000009")
    assert c.truncated and c.finish_reason == "length"
    assert c.identity == "run-v000009" and c.cached_tokens == 2


@pytest.mark.parametrize("dtype", ["uint8", "uint16"])
def test_routed_experts_decode_to_int32(dtype: str) -> None:
    rows, layers, top_k = 7, 3, 2
    high = 65536 if dtype == "uint16" else 256
    values = (np.arange(rows * layers * top_k, dtype=np.int64) * 1237) % high
    raw = values.astype("<u2" if dtype == "uint16" else "u1").tobytes()
    spec = {"data": base64.b64encode(raw).decode(), "shape": [rows, layers, top_k], "start": 0, "dtype": dtype}
    out = decode_routed_experts(spec, rows)
    assert out.dtype == np.int32 and out.shape == (rows, layers, top_k)
    assert out.reshape(-1).tolist() == values.tolist()
    assert int(values.max()) > 255 or dtype == "uint8"
    with pytest.raises(RolloutError, match=r"expected prompt \+ completion length - 1 = 8"):
        decode_routed_experts(spec, rows + 1)
    with pytest.raises(RolloutError, match="dtype"):
        decode_routed_experts(dict(spec, dtype="int64"), rows)
    with pytest.raises(RolloutError, match="holds"):
        decode_routed_experts(dict(spec, shape=[rows, layers, top_k + 1]), rows)


def test_routes_are_read_per_choice() -> None:
    fake = FakeEndpoint(routes=(2, 4))
    (c,) = _read(fake.answer(_body(n=1)), 1, want_routes=True)
    assert c.routed_experts is not None
    assert c.routed_experts.shape == (len(PROMPT) + 5 - 1, 2, 4)
    with pytest.raises(RolloutError, match=r"no nvext.routed_experts"):
        _read(FakeEndpoint().answer(_body(n=1)), 1, want_routes=True)


class CharTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(ch) - ord("a") for ch in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def test_retokenize_is_used_only_when_given() -> None:
    fake = FakeEndpoint(shape="none")
    payload = fake.answer(_body(n=1))
    tok = CharTokenizer()
    (c,) = _read(payload, 1, retokenize=lambda text: tok.encode(text))
    assert c.token_source == "retokenized"
    assert list(c.response_ids) == [i % 26 for i in fake.completion(PROMPT, 0, 0)]
    assert c.logprobs is not None and len(c.logprobs) == 5  # counts match: kept
    payload["choices"][0]["text"] += "z"  # one more token than log-probs
    (c,) = _read(payload, 1, retokenize=lambda text: tok.encode(text))
    assert c.logprobs is None


def test_returned_prompt_sources_must_agree_for_text_prompts() -> None:
    payload = FakeEndpoint(shape="token_ids").answer(_body(n=1))
    choice = payload["choices"][0]
    choice["nvext"] = {"engine_data": {"prompt_token_ids": [9, 9]}}
    with pytest.raises(RolloutError, match="prompt ids from"):
        _read(payload, 1, sent_prompt_ids=None)
