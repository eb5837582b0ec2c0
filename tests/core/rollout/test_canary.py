"""The canary against scripted endpoints (``httpx.MockTransport``): what it sends, reads and decides.

The end-to-end cases (the local stack's replicas serving right and wrong weights) are in
``tests/faults/test_canary_faults.py``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest

from cwtrain.errors import RolloutError, UsageError
from cwtrain.integrations.rollout import Canary, CanaryProbe, RolloutConfig

CONFIG = RolloutConfig("http://engine.test/v1", "tiny", api_key="k", max_attempts=3)
PROMPTS = ((1, 5, 6, 7), (1, 9, 9))
TRUTH = {1: -1.0, 5: -2.0, 6: -3.0, 7: -4.0, 9: -0.5}  # what the "trainer" gives each token


def trainer(prompts: Sequence[Sequence[int]]) -> list[list[float]]:
    return [[TRUTH[t] for t in p[1:]] for p in prompts]


def _answer(prompt: list[int], shift: float, *, plp: bool, identity: str = "run-v000001") -> httpx.Response:
    scores = [None] + [TRUTH[t] + shift for t in prompt[1:]]
    choice: dict[str, Any] = {
        "index": 0,
        "text": "",
        "logprobs": {
            "tokens": [f"token_id:{t}" for t in [*prompt, 0]],
            "token_logprobs": [*scores, -1.0],
            "top_logprobs": [None] + [{} for _ in prompt],
            "text_offset": list(range(len(prompt) + 1)),
        },
        "finish_reason": "length",
    }
    if plp:
        choice["prompt_logprobs"] = [None] + [
            {str(t): {"logprob": s, "rank": 1, "decoded_token": "x"}} for t, s in zip(prompt[1:], scores[1:])
        ]
    return httpx.Response(200, json={"choices": [choice], "system_fingerprint": identity})


def _canary(handler: Callable[[httpx.Request], httpx.Response], **kwargs: Any) -> Canary:
    sleeps: list[float] = []
    return Canary(
        CONFIG, CanaryProbe(PROMPTS), trainer, transport=httpx.MockTransport(handler), sleep=sleeps.append, **kwargs
    )


def test_the_request_asks_for_prompt_logprobs_both_ways_and_the_gap_is_the_worst_answer() -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        assert request.url == "http://engine.test/v1/completions" and request.headers["authorization"] == "Bearer k"
        # the second replica (every other request) is off by 0.2 nats on every token
        return _answer(body["prompt"], 0.2 if len(sent) % 2 == 0 else 0.0, plp=True)

    result = _canary(handler, rounds=3, bound=0.1).check(identity="run-v000001")
    assert sent[0] == {
        "model": "tiny", "prompt": [1, 5, 6, 7], "max_tokens": 1, "temperature": 0.0, "echo": True, "logprobs": 0,
        "stream": False, "prompt_logprobs": 0, "return_tokens_as_token_ids": True,
    }  # fmt: skip
    assert len(sent) == 6 and [s["prompt"] for s in sent] == [list(p) for p in PROMPTS] * 3
    assert not result.passed and result.gap == pytest.approx(0.2) and result.max_token_gap == pytest.approx(0.2)
    assert result.tokens == 3 * (3 + 2) and result.mean_gap == pytest.approx(0.2 * 6 / 15)  # 6 of 15 tokens off
    assert [a.gap for a in result.answers] == pytest.approx([0, 0.2, 0, 0.2, 0, 0.2])
    assert {a.source for a in result.answers} == {"prompt_logprobs"}
    assert result.identities == ("run-v000001",) and result.by_identity["run-v000001"].answers == 6
    assert "FAILED" in result.summary() and "0.2" in result.summary()
    assert result.metrics()["hotload/canary_passed"] == 0.0
    assert _canary(handler, rounds=1, bound=0.25).check().passed


def test_echo_is_read_when_prompt_logprobs_is_missing_and_refused_fields_are_dropped() -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        if "prompt_logprobs" in body:  # an OpenAI-compatible server without vLLM's extension
            return httpx.Response(400, json={"error": {"message": "Unrecognized request argument: prompt_logprobs"}})
        return _answer(body["prompt"], 0.0, plp=False)

    canary = _canary(handler)
    result = canary.check(identity="run-v000001")
    assert result.passed and result.gap == 0.0 and {a.source for a in result.answers} == {"echo"}
    assert canary.dropped_fields == {"prompt_logprobs"}
    assert sum("prompt_logprobs" in b for b in sent) == 1  # refused once, then never sent again


def test_answers_from_another_identity_fail_it_and_are_grouped_apart() -> None:
    calls = iter(range(100))

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        identity = "run-v000001" if next(calls) % 2 == 0 else "run-v000000"
        return _answer(body["prompt"], 0.0, plp=True, identity=identity)

    result = _canary(handler).check(identity="run-v000001")
    assert not result.passed and result.gap == 0.0  # the weights agree, the identity does not
    assert result.identities == ("run-v000001", "run-v000000")
    assert [a.identity for a in result.unexpected] == ["run-v000000"] * 2
    assert "not from 'run-v000001'" in result.summary()


def test_a_non_finite_served_logprob_is_an_infinite_gap() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        response = _answer(body["prompt"], 0.0, plp=False)
        payload = response.json()
        payload["choices"][0]["logprobs"]["token_logprobs"][1] = "NaN"
        return httpx.Response(200, json=payload)

    result = _canary(handler).check()
    assert not result.passed and math.isinf(result.gap)


def test_transient_failures_are_retried_and_a_dead_endpoint_is_a_rollout_error() -> None:
    statuses = iter([503, 502])

    def flaky(request: httpx.Request) -> httpx.Response:
        status = next(statuses, 200)
        if status != 200:
            return httpx.Response(status, text="busy")
        return _answer(json.loads(request.content)["prompt"], 0.0, plp=True)

    assert _canary(flaky).check().passed
    with pytest.raises(RolloutError, match="after 3 attempts: HTTP 503"):
        _canary(lambda request: httpx.Response(503, text="down")).check()
    with pytest.raises(RolloutError, match="HTTP 404"):
        _canary(lambda request: httpx.Response(404, text="no such model")).check()


def test_an_endpoint_without_prompt_logprobs_or_echoing_other_tokens_is_refused() -> None:
    def no_echo(request: httpx.Request) -> httpx.Response:
        choice = {"index": 0, "text": "x", "logprobs": {"token_logprobs": [-1.0], "tokens": ["x"]}}
        return httpx.Response(200, json={"choices": [choice]})

    with pytest.raises(RolloutError, match="no prompt log-probs"):
        _canary(no_echo).check()

    def other_tokens(request: httpx.Request) -> httpx.Response:
        prompt = json.loads(request.content)["prompt"]
        return _answer([prompt[0], *[9] * (len(prompt) - 1)], 0.0, plp=False)

    with pytest.raises(RolloutError, match="echoed other tokens"):
        _canary(other_tokens).check()


def test_bad_arguments_are_refused_before_anything_is_sent() -> None:
    with pytest.raises(UsageError, match="has 1 token"):
        CanaryProbe(((1,),))
    with pytest.raises(UsageError, match="at least one prompt"):
        CanaryProbe(())
    assert CanaryProbe.from_prompts([[1], [1, 2, 3, 4, 5], [4, 5]], count=2, max_tokens=3).prompts == (
        (1, 2, 3),
        (4, 5),
    )
    with pytest.raises(UsageError, match="max_tokens"):
        Canary(CONFIG, CanaryProbe(PROMPTS), trainer, max_tokens=2)
    with pytest.raises(UsageError, match="bound"):
        Canary(CONFIG, CanaryProbe(PROMPTS), trainer, bound=math.nan)

    def never(request: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing is sent")

    short = Canary(
        CONFIG, CanaryProbe(PROMPTS), lambda prompts: [[0.0]] * len(prompts), transport=httpx.MockTransport(never)
    )
    with pytest.raises(UsageError, match="one log-prob for every token but the first"):
        short.check()


# ------------------------------------------------------------------ the sample canary


def test_the_sample_canary_judges_the_published_identitys_samples_by_their_worst_gap() -> None:
    from cwtrain.integrations.rollout.canary import judge_samples

    good = ("run-v000002", [-1.0, -2.0, -0.5], [-1.0, -2.01, -0.5])
    bad = ("run-v000002", [-1.0, -2.0], [-1.5, -2.5])  # one replica serving other weights: 0.5 nats
    older = ("run-v000001", [-9.0], [-1.0])  # served one step before: not judged
    passed = judge_samples([good, older], identity="run-v000002")
    assert passed is not None and passed.passed and len(passed.answers) == 1
    assert math.isclose(passed.gap, 0.01 / 3)
    failed = judge_samples([good, bad, older], identity="run-v000002", bound=0.05)
    assert failed is not None and not failed.passed and math.isclose(failed.gap, 0.5)
    assert failed.metrics()["hotload/canary_gap"] == failed.gap and failed.answers[1].source == "samples"
    assert judge_samples([older, ("run-v000002", [], [])], identity="run-v000002") is None  # nothing to judge
    with pytest.raises(UsageError, match="sample 0"):
        judge_samples([("run-v000002", [-1.0], [])], identity="run-v000002")
    with pytest.raises(UsageError, match="bound"):
        judge_samples([good], identity="run-v000002", bound=math.nan)


class _Session:
    """What SampleCanary reads of a PublishSession, and its refusals."""

    def __init__(self, served: str | None, last_attempted: int) -> None:
        self.served_identity, self.run_id, self.last_attempted = served, "run", last_attempted
        self.refused: list[tuple[str, float | None]] = []

    def refuse(self, identity: str, problem: str, *, gap: float | None = None) -> Any:
        self.refused.append((identity, gap))
        self.served_identity = "run-v000001"
        return "outcome"


class _Ranks:
    """Rank ``rank`` of a world whose other ranks contributed ``others`` and whose rank 0 broadcasts ``answer``."""

    def __init__(self, rank: int, others: list[Any], answer: Any = None) -> None:
        self.rank, self.world_size, self.others, self.answer = rank, 1 + len(others), others, answer

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj, *self.others]

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return obj if self.rank == 0 else self.answer


def test_the_sample_canary_refuses_the_served_version_only_when_the_trainer_holds_it() -> None:
    from cwtrain.integrations.rollout import SampleCanary

    samples = [("run-v000002", [-1.0, -2.0], [-1.5, -2.5]), ("run-v000002", [-1.0], [-1.0]), (None, [-9.0], [0.0])]
    behind = _Session("run-v000002", last_attempted=3)  # version 3 failed: the trainer holds weights never served
    assert SampleCanary(behind).check(samples).skipped and not behind.refused
    session = _Session("run-v000002", last_attempted=2)
    verdict = SampleCanary(session).check(samples)
    assert session.refused == [("run-v000002", 0.5)] and verdict.refused == "outcome"
    assert not verdict.keep("run-v000002") and verdict.keep("run-v000001") and verdict.keep(None)
    assert verdict.metrics()["hotload/canary_refused"] == 1.0 and verdict.metrics()["hotload/canary_gap"] == 0.5
    fine = _Session("run-v000002", last_attempted=2)
    assert SampleCanary(fine).check(samples[1:]).keep("run-v000002") and not fine.refused


def test_one_verdict_over_ranks_counts_a_tensor_parallel_copy_once_and_tells_every_rank() -> None:
    from cwtrain.errors import CWTrainError
    from cwtrain.integrations.rollout import SampleCanary, SampleGap, judge_on_every_rank, sample_gap

    mine = [sample_gap(1, "run-v000002", [-1.0, -1.0], [-1.0, -1.02])]
    gap = mine[0]
    assert gap is not None
    copy = [(gap.key, gap.identity, gap.total, gap.largest, gap.tokens)]  # a tensor-parallel peer: the same numbers
    wrong = [(7, "run-v000002", 1.2, 0.9, 3)]  # another data-parallel rank's sample: 0.4 nats
    session = _Session("run-v000002", last_attempted=2)
    refused, verdict = judge_on_every_rank(_Ranks(0, [copy, wrong]), [gap], SampleCanary(session))
    assert refused == "run-v000002" and verdict is not None and verdict.result is not None
    assert len(verdict.result.answers) == 2 and math.isclose(verdict.result.gap, 0.4)  # the copy counted once
    assert judge_on_every_rank(_Ranks(1, [[]], ("refused", "run-v000002")), [], None) == ("run-v000002", None)
    with pytest.raises(CWTrainError, match="rank 0: HotLoadVerificationError: stop"):
        judge_on_every_rank(_Ranks(1, [[]], ("error", "HotLoadVerificationError: stop")), [], None)
    assert SampleGap(1, None, 0.3, 0.2, 3).gap == pytest.approx(0.1)


def test_the_ledger_names_who_served_tokens_forgets_the_oldest_and_travels_as_a_file(tmp_path: Any) -> None:
    from cwtrain.integrations.rollout import Completion, ServedLedger

    def completion(ids: tuple[int, ...], identity: str | None) -> Completion:
        return Completion((1,), ids, "", None, "stop", identity, 0.0)

    ledger = ServedLedger(capacity=3)
    ledger.record([completion((5, 6), "run-v000001"), completion((7,), None), completion((8,), "run-v000001")])
    assert ledger.identity_of([1, 5, 6]) == "run-v000001" and ledger.identity_of([1, 7]) is None  # named none
    assert ledger.identity_of([5, 6]) is None  # keyed by the prompt, then the completion
    ledger.record([completion((8,), "run-v000002")])  # served again, a batch later: the newer identity
    assert ledger.identity_of((1, 8)) == "run-v000002"
    ledger.record([completion((9,), "run-v000002"), completion((9,), "run-v000003")])  # two in one batch
    assert ledger.identity_of((1, 9)) is None  # ambiguous: never judged
    ledger.note((1, 10), "run-v000002")
    assert ledger.identity_of((1, 5, 6)) is None and len(ledger) == 3  # the oldest forgotten
    ledger.save(tmp_path / "state" / "served_ledger.json")
    again = ServedLedger.load(tmp_path / "state" / "served_ledger.json")
    assert again.identity_of((1, 10)) == "run-v000002" and again.capacity == 3
    assert len(ServedLedger.load(tmp_path / "absent.json")) == 0
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match="not a served-samples ledger"):
        ServedLedger.load(tmp_path / "bad.json")
