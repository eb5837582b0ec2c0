"""Fleet truth, round two (issue 31): what the defaults prove, a checked way back, one record, one budget.

A 2-replica deployment of the local stack; each run publishes through ``PublishSession`` (as
every integration does) with the integrations' default settings unless a test says otherwise:

* ``defaults-converge``: a replica that reports the hot-load done but keeps the old identity,
  with ``verify`` off (the default): the version fails and the fleet is brought back;
* ``way-back-checked``: a shard of a delta inside the served chain corrupted, then a failed
  hot-load: the re-activation passes over every identity whose chain holds it, back to the
  intact FULL; with that FULL corrupted too, one error names what cannot be replayed;
* ``canary-record``: the canary's endpoint stops answering after a hot-load completed on every
  replica: with ``stop`` the session, the next plan and the served-identity file name the
  identity the fleet serves; with ``reactivate`` the fleet is brought back;
* ``publish-budget``: the same silent endpoint, and the canary's own timeout of 600 s per
  request with 6 attempts: the publish ends within its timeout plus one poll;
* ``sample-canary``: a replica serving corrupted, then previous, weights under the new identity
  is seen from the sampled tokens' log-probs (the served ones and the trainer's, as a framework
  computes them for its loss), and the late refusal brings the fleet back (the gaps print with
  ``-s``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from _faults_trainer import Trainer
from _silent import Silent

from cwtrain.errors import CWTrainError
from cwtrain.hotload import HotLoader, HotLoadSettings, PublishOutcome, PublishSession, follow
from cwtrain.hotload.format.identity import snapshot_prefix
from cwtrain.hotload.lifecycle.served import read_served_identity
from cwtrain.infra import InferenceClient
from cwtrain.integrations.rollout import Canary, CanaryProbe, RolloutConfig
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import ModelConfig, Tokenizer, token_logprobs

pytestmark = [pytest.mark.faults, pytest.mark.e2e]

TIMEOUT = 30.0
POLL = 0.05
TOK = Tokenizer()
CONFIG = {"config.json": json.dumps(ModelConfig().to_json()).encode()}


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[LocalStack]:
    with shared_stack.view("fleet-truth", replicas=2) as local, pytest.MonkeyPatch.context() as patch:
        for key, value in local.env().items():
            patch.setenv(key, value)
        patch.setattr(follow, "CATCH_UP_SECONDS", 1.0)  # a replica left behind never catches up here
        yield local


@pytest.fixture(scope="module")
def target(stack: LocalStack) -> Any:
    return stack.deploy(name="fleet-truth")


class _Run:
    """A trainer and its session on the deployment (``settings`` over the integrations' defaults)."""

    def __init__(self, stack: LocalStack, target: Any, run: str, tmp_path: Path, **settings: Any) -> None:
        client = InferenceClient(stack.token, base_url=stack.api_url)
        loader = HotLoader(client, target.deployment_id, timeout=TIMEOUT, poll_interval=POLL)
        self.trainer = Trainer(loader, run=run)
        self.state_dir = tmp_path / "state"
        config = HotLoadSettings(
            target.deployment_id, run, state_dir=str(self.state_dir), **{"timeout": TIMEOUT, **settings}
        )
        self.outcomes: list[PublishOutcome] = []
        self.session = PublishSession(config, target=loader.target.polling(POLL), sink=self.outcomes.append)
        self.served: dict[str, torch.Tensor] | None = None

    def publish(self) -> PublishOutcome:
        """Step (after the first version) and publish the next version: a delta on what is served, or FULL."""
        plan = self.session.begin()
        if plan.version:
            self.trainer.version = plan.version
            self.trainer.step()
        outcome = self.session.publish_tensors(
            plan, dict(self.trainer.weights), base=None if plan.full else self.served, extra_files=CONFIG
        )
        if not outcome.failed:
            self.served = {name: tensor.clone() for name, tensor in self.trainer.weights.items()}
        return outcome

    def canary(self, url: str, **config: Any) -> Canary:
        rollout = RolloutConfig(base_url=url, model="m", **config)
        prompts = [TOK.encode(text) for text in ("the quick brown fox", "hello there")]

        def score(batch: list[list[int]]) -> list[list[float]]:
            return [list(token_logprobs(self.trainer.weights, p[:1], p[1:])) for p in batch]

        return Canary(rollout, CanaryProbe.from_prompts(prompts, count=2), score)


def _replica_identities(stack: LocalStack, target: Any) -> set[str]:
    """What the replicas serve, read from each through the gateway (round-robin)."""
    seen = set()
    with httpx.Client(headers={"Authorization": f"Bearer {stack.token}"}, timeout=60) as http:
        for _ in range(6):
            body = {"model": target.model, "prompt": TOK.encode("hi"), "max_tokens": 1}
            response = http.post(target.base_url + "/completions", json=body)
            assert response.status_code == 200, response.text
            seen.add(response.headers["x-cwtrain-snapshot-identity"])
    return seen


# ------------------------------------------------------------------ the defaults prove convergence


@pytest.mark.fault_row("defaults-converge")
def test_a_replica_left_behind_fails_the_version_with_the_default_settings(
    stack: LocalStack, target: Any, tmp_path: Path
) -> None:
    run = _Run(stack, target, "truth-behind", tmp_path)
    assert not run.session.settings.verify  # the integrations' default
    assert run.publish().completed
    stack.faults.replicas.stay_behind(0, identity="truth-behind-v000001")
    outcome = run.publish()
    assert outcome.failed and outcome.reactivated
    assert outcome.converged == 0 and run.outcomes[0].converged == 1
    assert "the fleet is split" in str(outcome.error)
    assert outcome.served_version == 0 and outcome.metrics()["hotload/converged"] == 0.0
    assert _replica_identities(stack, target) == {"truth-behind-v000000"}
    after = run.publish()  # the next version: FULL, served by every replica
    assert after.chain_cut and after.converged == 1 and not after.failed
    assert _replica_identities(stack, target) == {"truth-behind-v000002"}


# ------------------------------------------------------------------ a way back that is checked


@pytest.mark.fault_row("way-back-checked")
def test_the_way_back_passes_over_chains_that_cannot_be_replayed(stack: LocalStack, tmp_path: Path) -> None:
    target = stack.deploy(name="fleet-truth-chain")  # its own: no other run's identity to go back to
    run = _Run(stack, target, "truth-chain", tmp_path, full_every=0)
    for _ in range(3):  # v0 FULL, v1 and v2 deltas
        assert run.publish().completed
    s3 = stack.s3_client()

    def corrupt(identity: str) -> None:
        prefix = snapshot_prefix(target.path_prefix, identity) + "/"
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=target.bucket, Prefix=prefix)["Contents"]]
        stack.faults.flip_byte(target.bucket, next(k for k in keys if k.endswith(".safetensors")), offset=-1)

    corrupt("truth-chain-v000001")  # inside the chain of v2, the identity served
    stack.faults.replicas.fail_load(0, identity="truth-chain-v000003")
    outcome = run.publish()
    assert outcome.failed and outcome.reactivated
    assert outcome.served_version == 0  # v2 and v1 cannot be replayed: back to the intact FULL
    assert _replica_identities(stack, target) == {"truth-chain-v000000"}
    assert run.publish().completed  # v4, FULL

    corrupt("truth-chain-v000004")
    corrupt("truth-chain-v000000")
    stack.faults.replicas.fail_load(0, identity="truth-chain-v000005")
    with pytest.raises(CWTrainError) as stopped:
        run.publish()
    message = str(stopped.value)
    assert "no completed identity" in message
    for identity in ("truth-chain-v000004", "truth-chain-v000002", "truth-chain-v000000"):
        assert f"{identity} (cannot be replayed" in message, message  # each candidate, with what is wrong


# ------------------------------------------------------------------ one record, one budget


@pytest.mark.fault_row("canary-record")
def test_a_canary_that_cannot_check_leaves_the_record_on_what_the_fleet_serves(
    stack: LocalStack, target: Any, tmp_path: Path, silent: Silent
) -> None:
    run = _Run(stack, target, "truth-record", tmp_path, on_failure="stop", timeout=8.0)
    run.publish()
    run.session.canary = run.canary(silent.url, timeout=1.0, max_attempts=1)
    with pytest.raises(CWTrainError, match="canary"):
        run.publish()
    failed = run.outcomes[-1]
    assert failed.failed and failed.completed
    # The hot-load completed on every replica: the record names it, not the version before.
    assert _replica_identities(stack, target) == {"truth-record-v000001"}
    assert run.session.served_identity == "truth-record-v000001" and failed.served_version == 1
    assert failed.converged == 1
    assert read_served_identity(run.state_dir) == "truth-record-v000001"
    plan = run.session.begin()
    assert plan.version == 2 and plan.full  # never a delta on what the fleet no longer serves


@pytest.mark.fault_row("publish-budget")
def test_a_silent_canary_is_answered_inside_the_publish_budget(
    stack: LocalStack, target: Any, tmp_path: Path, silent: Silent
) -> None:
    budget = 6.0
    run = _Run(stack, target, "truth-budget", tmp_path, timeout=budget)
    run.publish()
    run.session.canary = run.canary(silent.url)  # 600 s per request, 6 attempts: hours unbounded
    started = time.monotonic()
    outcome = run.publish()
    elapsed = time.monotonic() - started
    print(f"\na silent canary, a {budget:g} s budget: the publish ended after {elapsed:.2f} s, re-activated")
    assert outcome.failed and outcome.reactivated and outcome.served_version == 0
    assert "canary: could not check" in str(outcome.error)
    assert elapsed <= budget + POLL + 0.5, elapsed  # the timeout plus one poll (and the process's own time)
    assert _replica_identities(stack, target) == {"truth-budget-v000000"}


# ------------------------------------------------------------------ the sample canary, a late verdict


@pytest.mark.fault_row("sample-canary")
def test_the_sample_canary_sees_wrong_weights_and_its_late_refusal_brings_the_fleet_back(
    stack: LocalStack, target: Any, tmp_path: Path
) -> None:
    from cwtrain.integrations.rollout import CompletionSampler, SamplingParams
    from cwtrain.integrations.rollout.canary import judge_samples

    run = _Run(stack, target, "truth-samples", tmp_path)
    config = RolloutConfig(base_url=target.base_url, model=target.model, api_key=stack.token)
    prompts = [TOK.encode(text) for text in ("the quick brown fox", "hello there", "one two three", "so it goes")]

    def judged(identity: str) -> Any:
        """Sample a batch as a trainer would, and judge it from the log-probs the trainer computes for its loss."""
        with CompletionSampler(config, run_id="truth-samples") as sampler:
            batch = sampler.sample_groups_sync(prompts, 2, SamplingParams(max_tokens=8, temperature=1.0))
        samples = [
            (c.identity, c.logprobs or (), token_logprobs(run.trainer.weights, c.prompt_ids, c.response_ids))
            for group in batch.groups
            for c in group
        ]
        verdict = judge_samples(samples, identity=identity)
        assert verdict is not None
        return verdict

    run.publish()
    run.publish()
    right = judged("truth-samples-v000001")
    stack.faults.replicas.serve_wrong_weights(0, weights="corrupt", identity="truth-samples-v000002")
    assert run.publish().completed  # no probe canary: the version completes, every replica reports it
    corrupt = judged("truth-samples-v000002")
    refused = run.session.refuse("truth-samples-v000002", corrupt.summary(), gap=corrupt.gap)
    assert refused.failed and refused.reactivated and refused.served_version == 1
    assert refused.metrics()["hotload/canary_gap"] == corrupt.gap
    assert _replica_identities(stack, target) == {"truth-samples-v000001"}
    stack.faults.replicas.serve_wrong_weights(0, weights="previous", identity="truth-samples-v000003")
    after = run.publish()
    assert after.chain_cut and after.completed  # FULL after the refusal
    previous = judged("truth-samples-v000003")
    print(
        f"\nsample canary gaps (bound {right.bound:g}): correct {right.gap:.4f}, corrupted {corrupt.gap:.4f}, "
        f"previous weights {previous.gap:.4f}"
    )
    assert right.passed and not corrupt.passed and not previous.passed
