"""A trainer restarted with the same run id continues its chain (issue 31): no version again, no rollback.

On the local stack (a 2-replica deployment, verify and the canary on): a run publishes its
baseline and versions 1-3 through the publish session, as every integration does. Then the
trainer's process is gone and a new one starts with the same run id and a new API client, as
slime's resume path does: the baseline again (the same checkpoint), then its own count from 1.
The fleet is not rolled back to the baseline, the restart's first version is the next one
(4), FULL, and every replica serves the trainer's weights; a delta follows on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _faults_trainer import Trainer

from cwtrain.hotload import HotLoader, HotLoadSettings, PublishOutcome, PublishSession
from cwtrain.infra import InferenceClient
from cwtrain.integrations.rollout import Canary, CanaryProbe, RolloutConfig
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import ModelConfig, Tokenizer, token_logprobs, write_base_checkpoint

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.slow]

RUN = "restart"
TIMEOUT = 60.0
CONFIG = {"config.json": json.dumps(ModelConfig().to_json()).encode()}
TOK = Tokenizer()


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[LocalStack]:
    with shared_stack.view("trainer-restart", replicas=2) as local, pytest.MonkeyPatch.context() as patch:
        for key, value in local.env().items():
            patch.setenv(key, value)
        yield local


@pytest.fixture(scope="module")
def target(stack: LocalStack) -> Any:
    return stack.deploy(name="trainer-restart")


def _process(stack: LocalStack, target: Any, trainer: Trainer | None = None) -> tuple[PublishSession, HotLoader]:
    """One trainer process's publisher: its own API client and session (the canary when ``trainer`` is given)."""
    client = InferenceClient(stack.token, base_url=stack.api_url)
    loader = HotLoader(client, target.deployment_id, timeout=TIMEOUT, poll_interval=0.05)
    canary = None
    if trainer is not None:
        rollout = RolloutConfig(base_url=target.base_url, model=target.model, api_key=stack.token)
        prompts = [TOK.encode(text) for text in ("the quick brown fox", "hello there", "one two three four")]

        def score(batch: list[list[int]]) -> list[list[float]]:
            return [list(token_logprobs(trainer.weights, prompt[:1], prompt[1:])) for prompt in batch]

        canary = Canary(rollout, CanaryProbe.from_prompts(prompts, count=3), score, rounds=2)
    settings = HotLoadSettings(target.deployment_id, RUN, timeout=TIMEOUT, full_every=0, verify=True)
    return PublishSession(settings, target=loader.target, canary=canary), loader


def _copy(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in weights.items()}


@pytest.mark.fault_row("trainer-restart")
def test_a_restarted_trainer_continues_the_chain_without_rolling_the_fleet_back(
    stack: LocalStack, target: Any, tmp_path: Path
) -> None:
    base = tmp_path / "base"
    write_base_checkpoint(base, seed=0)  # the weights the trainer starts from (init_weights(seed=0))
    first, loader = _process(stack, target)
    trainer = Trainer(loader, run=RUN)
    assert first.publish_baseline(base).chain_cut  # v0, FULL, from the base checkpoint
    served = _copy(trainer.weights)
    for version in (1, 2, 3):
        trainer.version = version
        trainer.step()
        first.publish_tensors(first.begin(), dict(trainer.weights), base=served, extra_files=CONFIG)
        served = _copy(trainer.weights)
    first.close()

    # a new process, the same run id: the baseline call again, then its own count from 1
    restarted, loader = _process(stack, target, trainer)
    before = {h.id for h in loader.target.hot_loads()}
    kept = restarted.publish_baseline(base)
    assert kept.baseline_skipped and not kept.published and kept.served_version == 3
    assert {h.id for h in loader.target.hot_loads()} == before  # nothing hot-loaded: the fleet keeps v3
    trainer.version = 4
    trainer.step()  # the weights it resumed with are not v3's
    outcomes: list[PublishOutcome] = []
    plan = restarted.begin(1)
    assert (plan.version, plan.full) == (4, True)
    outcomes.append(restarted.publish_tensors(plan, dict(trainer.weights), extra_files=CONFIG))
    served = _copy(trainer.weights)
    trainer.version = 5
    trainer.step()
    outcomes.append(restarted.publish_tensors(restarted.begin(2), dict(trainer.weights), base=served))
    assert [(o.identity, o.kind) for o in outcomes] == [(f"{RUN}-v000004", "FULL"), (f"{RUN}-v000005", "INCREMENTAL")]
    for outcome in outcomes:  # every replica on it, serving the trainer's weights
        assert outcome.completed and not outcome.failed and outcome.replicas_verified == 2
        assert outcome.canary_checked and outcome.canary_gap < 0.05
    assert restarted.served_identity == f"{RUN}-v000005"
    restarted.close()
