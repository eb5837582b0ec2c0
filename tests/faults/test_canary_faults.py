"""The canary on the local stack: it passes on the trainer's weights and fails on a replica serving others.

A trainer (``_faults_trainer.Trainer``) publishes the tiny model to a 2-replica deployment; the
canary scores a fixed probe through the gateway (``echo`` + ``prompt_logprobs``) and compares it
with the trainer's own log-probs (:func:`cwtrain.local.engine.model.token_logprobs` of the
weights it published). One replica is then made to serve a corrupted FULL, or its previous
weights, under the new identity (``stack.faults.replicas.serve_wrong_weights``): the identity
every answer names is right, only the canary sees the weights are not.

The gap figures of each case are printed (``pytest -s``) and quoted in docs/reliability.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from _faults_trainer import Trainer

from cwtrain.hotload.loader import HotLoader
from cwtrain.infra import InferenceClient
from cwtrain.infra.enums import HotLoadState
from cwtrain.integrations.rollout import DEFAULT_CANARY_BOUND, Canary, CanaryProbe, CanaryResult, RolloutConfig
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import Tokenizer, token_logprobs

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.slow]

TOK = Tokenizer()
RUNS = itertools.count()
DATA = ["the cat sat on the mat", "what is 12 + 30?", "hello there, friend", "a b c d e f g", "zero"]


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[LocalStack]:
    with shared_stack.view("faults-canary", replicas=2) as local, pytest.MonkeyPatch.context() as patch:
        for key, value in local.env().items():
            patch.setenv(key, value)
        yield local


@pytest.fixture(scope="module")
def target(stack: LocalStack) -> Any:
    return stack.deploy(name="faults-canary")


@pytest.fixture
def trainer(stack: LocalStack, target: Any) -> Trainer:
    stack.faults.replicas.clear()
    client = InferenceClient(stack.token, base_url=stack.api_url)
    loader = HotLoader(client, deployment_id=target.deployment_id, timeout=180, poll_interval=0.1)
    trainer = Trainer(loader, run=f"canary{next(RUNS)}")
    trainer.publish(full=True)
    return trainer


def _canary(stack: LocalStack, target: Any, trainer: Trainer) -> Canary:
    def trainer_logprobs(prompts: Sequence[Sequence[int]]) -> list[list[float]]:
        return [token_logprobs(trainer.weights, p[:1], p[1:]) for p in prompts]

    probe = CanaryProbe.from_prompts([TOK.encode(text, add_special_tokens=True) for text in DATA], count=4)
    config = RolloutConfig(target.base_url, target.model, api_key=stack.token)
    return Canary(config, probe, trainer_logprobs, rounds=2)


def _report(case: str, result: CanaryResult) -> None:
    print(f"\n{case}: {result.summary()}")


@pytest.mark.fault_row("wrong-weights")
def test_canary_passes_on_the_trainers_weights(stack: LocalStack, target: Any, trainer: Trainer) -> None:
    canary = _canary(stack, target, trainer)
    result = canary.check(identity=trainer.served_identity)
    _report("correct weights (FULL)", result)
    assert result.passed, result.summary()
    assert result.gap < 1e-3 and result.identities == (trainer.served_identity,)
    assert len(result.answers) == 8 and {a.source for a in result.answers} == {"prompt_logprobs"}
    trainer.step()
    assert trainer.publish().state is HotLoadState.COMPLETED  # a delta: still the trainer's exact bytes
    after = canary.check(identity=trainer.served_identity)
    _report("correct weights (delta)", after)
    assert after.passed and after.gap < 1e-3


@pytest.mark.fault_row("wrong-weights")
@pytest.mark.parametrize("weights", ["corrupt", "previous"])
def test_canary_fails_on_a_replica_serving_other_weights_under_the_new_identity(
    stack: LocalStack, target: Any, trainer: Trainer, weights: str
) -> None:
    canary = _canary(stack, target, trainer)
    stack.faults.replicas.serve_wrong_weights(index=1, weights=weights, deployment_id=target.deployment_id)
    trainer.step()
    hot_load = trainer.publish(full=True)  # the new FULL: one replica serves something else under its name
    assert hot_load.state is HotLoadState.COMPLETED
    assert [kind for kind, _, _ in stack.faults.replicas.fired] == [f"serve-{weights}"]
    trainer.loader.verify_served(hot_load.id, trainer.served_identity or "")  # the identities all look right
    result = canary.check(identity=trainer.served_identity)
    _report(f"one replica serving the {weights} weights", result)
    assert not result.passed and result.gap > DEFAULT_CANARY_BOUND
    assert result.identities == (trainer.served_identity,) and not result.unexpected
    # the healthy replica's answers are exact; the faulty one's are off: the gap is the worst answer
    gaps = sorted(a.gap for a in result.answers)
    assert gaps[0] < 1e-3 and gaps[-1] > DEFAULT_CANARY_BOUND
    assert result.metrics()["hotload/canary_passed"] == 0.0
    assert result.metrics()["hotload/canary_gap"] == result.gap


@pytest.mark.fault_row("wrong-weights")
def test_canary_may_not_see_a_small_one_version_lag(stack: LocalStack, target: Any, trainer: Trainer) -> None:
    """What the canary cannot see: one small step behind is within the bound (the served identity covers a lag)."""
    canary = _canary(stack, target, trainer)
    stack.faults.replicas.serve_wrong_weights(index=1, weights="previous", deployment_id=target.deployment_id)
    trainer.step(scale=0.002)  # a tenth of the other tests' step
    assert trainer.publish(full=True).state is HotLoadState.COMPLETED
    result = canary.check(identity=trainer.served_identity)
    _report("one replica one small step behind", result)
    assert result.passed and 0 < result.gap < DEFAULT_CANARY_BOUND  # off, but not by more than numerics may be
