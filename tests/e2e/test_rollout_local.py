"""The rollout sampler against cwtrain-local: exact ids, the model's own log-probs, served identities."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cwtrain.infra import InferenceClient
from cwtrain.integrations.rollout import CompletionSampler, RolloutConfig, SamplingParams
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import Tokenizer, load_checkpoint, token_logprobs, write_base_checkpoint

pytestmark = pytest.mark.e2e
TOK = Tokenizer()
PROMPTS = ["hello there", "abc 123", "the cat sat"]
GROUP = 4


@pytest.fixture(scope="module")
def local(shared_stack: Any) -> Iterator[tuple[LocalStack, Any]]:
    # one replica process: importing torch dominates the start
    with shared_stack.view("e2e-rollout", replicas=1) as stack:
        yield stack, stack.deploy(name="rollout", timeout=120)


def _weights(directory: Path, seed: int) -> tuple[Any, dict[str, Any]]:
    write_base_checkpoint(directory, seed=seed)
    config, weights = load_checkpoint(directory)
    return config, {name: tensor.float() for name, tensor in weights.items()}


def _check_against_model(batch: Any, prompts: list[list[int]], model: tuple[Any, dict[str, Any]]) -> None:
    config, weights = model
    assert len(batch) == len(prompts)
    for prompt, group in zip(prompts, batch, strict=True):
        assert len(group) == GROUP
        for completion in group:
            assert completion.prompt_ids == tuple(prompt)
            assert completion.token_source == "token_ids"
            assert 1 <= len(completion.response_ids) <= 12
            assert completion.finish_reason in ("stop", "length")
            expected = token_logprobs(weights, prompt, completion.response_ids, config)
            assert completion.logprobs == pytest.approx(expected, abs=2e-4)
            assert completion.latency > 0


def test_groups_carry_exact_ids_and_the_models_logprobs_then_the_new_identity(
    local: tuple[LocalStack, Any], tmp_path: Path
) -> None:
    stack, target = local
    prompts = [TOK.encode(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=12)
    config = RolloutConfig(target.base_url, target.model, api_key=stack.token, concurrency=2)
    with CompletionSampler(config, tokenizer=TOK, group_size=GROUP) as sampler:
        before = sampler.sample_groups_sync(prompts, GROUP, params, cache_salt="initial")
        _check_against_model(before, prompts, _weights(tmp_path / "v0", seed=0))
        assert before.identities == ("initial",)
        assert before.metrics["coreweave/requests"] == len(prompts)  # one request per group
        assert before.metrics["coreweave/samples"] == len(prompts) * GROUP
        assert before.metrics["coreweave/logprobs_kept"] == 1.0
        assert not sampler.text_prompts

        from cwtrain.hotload import HotLoader

        new = tmp_path / "v1"
        model_v1 = _weights(new, seed=1)
        with InferenceClient(stack.token, base_url=stack.api_url) as client:
            HotLoader(client, target.deployment_id, s3=stack.s3_client(), timeout=120, poll_interval=0.2).publish(
                new, identity="rollout-v000001"
            )
        after = sampler.sample_groups_sync(prompts, GROUP, params, cache_salt="rollout-v000001")
        assert after.identities == ("rollout-v000001",)
        assert all(c.identity == "rollout-v000001" for g in after for c in g)
        _check_against_model(after, prompts, model_v1)


def test_routed_experts_split_groups_against_the_engine(local: tuple[LocalStack, Any]) -> None:
    stack, target = local
    prompt = TOK.encode("route me")
    config = RolloutConfig(target.base_url, target.model, api_key=stack.token, routed_experts=True)
    with CompletionSampler(config) as sampler:
        batch = sampler.sample_groups_sync([prompt], 3, SamplingParams(max_tokens=6))
    assert batch.metrics["coreweave/requests"] == 3  # n = 1 each
    for completion in batch[0]:
        routes = completion.routed_experts
        assert routes is not None and routes.dtype.name == "int32"
        assert routes.shape[0] == len(completion.tokens) - 1
