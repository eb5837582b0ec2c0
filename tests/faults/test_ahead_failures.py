"""One step ahead when the fleet misbehaves (issue 32): a failed version while the trainer trains on.

A run of ``VERSIONS`` versions publishes through :class:`cwtrain.hotload.PublishAhead` (each
version hot-loads while the next step samples and trains) to a 2-replica deployment of the
local stack, with ``on_failure=reactivate``, ``verify`` and the canary on, and a sampler fenced
at one version (``max_staleness=1``, told of every version handed over, served and burned).
At a version drawn at random (printed), one replica fails to load it, or serves corrupt
weights under its identity (only the canary sees that). The failed version is answered as in
synchronous mode, and no batch the trainer trains on holds a sample of it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from cwtrain.hotload import HotLoadSettings, PublishAhead, PublishOutcome, PublishSession, Target, identity_version
from cwtrain.infra import InferenceClient
from cwtrain.integrations.rollout import Canary, CanaryProbe, CompletionSampler, RolloutConfig, SamplingParams
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import ModelConfig, Tokenizer, init_weights, token_logprobs

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.slow]

VERSIONS = 8
TIMEOUT = 60.0
TOK = Tokenizer()
CONFIG = {"config.json": json.dumps(ModelConfig().to_json()).encode()}


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[LocalStack]:
    with shared_stack.view("ahead-failures", replicas=2) as local:
        yield local


@pytest.fixture(scope="module")
def target(stack: LocalStack) -> Any:
    return stack.deploy(name="ahead-failures")


def _step(weights: dict[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]:
    """An optimizer step: half of the tensors move a little (a new dict; the old one is not touched)."""
    gen = torch.Generator().manual_seed(2000 + version)
    return {
        name: (t.float() + 0.02 * torch.randn(t.shape, generator=gen)).to(t.dtype) if (i + version) % 2 else t
        for i, (name, t) in enumerate(sorted(weights.items()))
    }


@pytest.mark.fault_row("ahead-failure")
@pytest.mark.parametrize("fault", ["fail_load", "serve_corrupt"])
def test_a_failed_version_ahead_is_answered_as_in_sync_mode_and_never_trained_on(
    stack: LocalStack, target: Any, fault: str
) -> None:
    run = f"ahead-{fault.replace('_', '-')}"
    replicas = stack.faults.replicas
    replicas.clear()
    faulty = random.Random(run).randrange(2, VERSIONS - 2)
    print(f"{run}: the fault fires at version {faulty}")
    identity = f"{run}-v{faulty:06d}"
    if fault == "fail_load":
        replicas.fail_load(0, identity=identity)
    else:
        replicas.serve_wrong_weights(0, weights="corrupt", identity=identity)

    rollout = RolloutConfig(
        base_url=target.base_url, model=target.model, api_key=stack.token, max_staleness=1, max_attempts=12
    )
    sampler = CompletionSampler(rollout, group_size=4, run_id=run)
    settings = HotLoadSettings(
        target.deployment_id, run, timeout=TIMEOUT, full_every=0, verify=True, on_failure="reactivate"
    )
    outcomes: list[PublishOutcome] = []
    session = PublishSession(
        settings,
        target=Target(InferenceClient(stack.token, base_url=stack.api_url), target.deployment_id, s3=stack.s3_client()),
        sink=outcomes.append,
        followers=[lambda r, v: sampler.note_published(v, run_id=r)],
        on_burned=[lambda r, v: sampler.note_burned(v, run_id=r)],
    )
    trained_on: list[tuple[int, set[int | None]]] = []  # (the trainer's version, the versions of the batch)
    weights = init_weights(seed=0)
    ahead = PublishAhead(session, on_publishing=[lambda r, v: sampler.note_publishing(v, run_id=r)])

    def published_weights(prompts: list[list[int]]) -> list[list[float]]:  # the version hot-loaded, not the trainer's
        assert ahead.tensors_in_flight is not None
        return [list(token_logprobs(ahead.tensors_in_flight, p[:1], p[1:])) for p in prompts]

    probe = CanaryProbe.from_prompts([TOK.encode(t) for t in ("the quick brown fox", "hello there")], count=2)
    session.canary = Canary(rollout, probe, published_weights, rounds=2)
    with sampler, ahead:
        ahead.publish_tensors(weights, version=0, extra_files=CONFIG)
        ahead.collect()  # the baseline is served before any rollout
        for version in range(1, VERSIONS):
            batch = sampler.sample_groups_sync([TOK.encode("hello")] * 4, 4, SamplingParams(max_tokens=4))
            trained_on.append((version - 1, {identity_version(c.identity, run) for g in batch for c in g}))
            weights = _step(weights, version)
            ahead.publish_tensors(weights, version=version, extra_files=CONFIG)
    assert [o.version for o in outcomes] == list(range(VERSIONS))
    failed = [o.version for o in outcomes if o.failed]
    assert failed == [faulty], [(o.version, o.failed, o.reactivated) for o in outcomes]
    assert outcomes[faulty].reactivated and outcomes[faulty].served_version == faulty - 1
    assert outcomes[faulty + 1].chain_cut and all(o.completed for o in outcomes[faulty + 1 :])
    assert outcomes[-1].served_version == VERSIONS - 1  # the run reached its last version
    for trainer_version, versions in trained_on:
        assert faulty not in versions, (trainer_version, versions)  # never a sample of the failed identity
        assert None not in versions and all(trainer_version - v <= 1 for v in versions if v is not None)
